//! Admission of a pod to this node, as upstream's kubelet admit handlers: under node pressure
//! (the eviction manager's admit handler) a BestEffort pod is refused while memory is short and
//! every pod while disk or PIDs are, critical pods excepted; then (predicate admission) the
//! volumes must be of supported types, one more pod must fit under maxPods, and the pod's
//! requests must fit in what the pods admitted before leave of the node's allocatable.

use k8s_openapi::api::core::v1::Pod;

use crate::pod::model;
use crate::pod::volume;

/// What the node offers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Room {
    pub max_pods: usize,
    pub allocatable_cpu_milli: i64,
    pub allocatable_memory: i64,
}

/// The node's pressure conditions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct NodePressure {
    pub memory: bool,
    pub disk: bool,
    pub pid: bool,
}

/// Why a pod is refused: upstream's reason (the pod status' `reason`) and message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    pub reason: String,
    pub message: String,
}

fn reject(reason: &str, message: String) -> Rejection {
    Rejection { reason: reason.into(), message }
}

/// Whether `pod` may run next to `admitted` (the pods admitted before it that have not
/// finished).
pub fn admit(pod: &Pod, admitted: &[&Pod], room: &Room, pressure: NodePressure) -> Result<(), Rejection> {
    if !crate::eviction::plan::is_critical(pod) {
        let mut conditions = Vec::new();
        if pressure.memory && model::qos_class(pod) == model::QosClass::BestEffort {
            conditions.push("MemoryPressure");
        }
        if pressure.disk {
            conditions.push("DiskPressure");
        }
        if pressure.pid {
            conditions.push("PIDPressure");
        }
        if !conditions.is_empty() {
            return Err(reject("Evicted", format!("The node had condition: [{}]. ", conditions.join(" "))));
        }
    }
    if let Err(e) = volume::validate(pod) {
        return Err(reject("UnsupportedVolume", e.to_string()));
    }
    if admitted.len() + 1 > room.max_pods {
        return Err(reject(
            "OutOfpods",
            format!(
                "Node didn't have enough resource: pods, requested: 1, used: {}, capacity: {}",
                admitted.len(),
                room.max_pods
            ),
        ));
    }
    let (used_cpu, used_mem) = admitted.iter().fold((0i64, 0i64), |(c, m), p| {
        let (pc, pm) = pod_requests(p);
        (c.saturating_add(pc), m.saturating_add(pm))
    });
    let (cpu, mem) = pod_requests(pod);
    if cpu > 0 && used_cpu.saturating_add(cpu) > room.allocatable_cpu_milli {
        return Err(reject(
            "OutOfcpu",
            format!(
                "Node didn't have enough resource: cpu, requested: {cpu}, used: {used_cpu}, capacity: {}",
                room.allocatable_cpu_milli
            ),
        ));
    }
    if mem > 0 && used_mem.saturating_add(mem) > room.allocatable_memory {
        return Err(reject(
            "OutOfmemory",
            format!(
                "Node didn't have enough resource: memory, requested: {mem}, used: {used_mem}, capacity: {}",
                room.allocatable_memory
            ),
        ));
    }
    Ok(())
}

fn clamp(v: i128) -> i64 {
    i64::try_from(v).unwrap_or(if v < 0 { i64::MIN } else { i64::MAX })
}

/// The pod's effective requests (cpu milli, memory bytes rounded up) as the scheduler counts
/// them: [`k8s_semantics::pod_requests`] (upstream's PodRequests: app containers and sidecars
/// together, at least each init container with the sidecars before it, plus the overhead).
pub fn pod_requests(pod: &Pod) -> (i64, i64) {
    let r = k8s_semantics::pod_requests(pod);
    (clamp(r.cpu.0), clamp(r.memory.value()))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(spec: serde_json::Value) -> Pod {
        serde_json::from_value(json!({"metadata": {"name": "p"}, "spec": spec})).unwrap()
    }

    fn with_requests(cpu: &str, memory: &str) -> Pod {
        pod(json!({"containers": [{"name": "c", "resources": {"requests": {"cpu": cpu, "memory": memory}}}]}))
    }

    const ROOM: Room = Room { max_pods: 3, allocatable_cpu_milli: 2000, allocatable_memory: 1 << 30 };
    const CALM: NodePressure = NodePressure { memory: false, disk: false, pid: false };

    #[test]
    fn node_pressure_refuses_besteffort_under_memory_and_everything_under_disk() {
        let best = pod(json!({"containers": [{"name": "c"}]}));
        let burst = with_requests("100m", "10Mi");
        let critical = pod(json!({"priority": 2_000_000_000, "containers": [{"name": "c"}]}));
        let mem = NodePressure { memory: true, ..CALM };
        assert_eq!(admit(&best, &[], &ROOM, mem), Err(reject("Evicted", "The node had condition: [MemoryPressure]. ".into())));
        assert_eq!(admit(&burst, &[], &ROOM, mem), Ok(()));
        let disk = NodePressure { memory: true, disk: true, pid: false };
        assert_eq!(
            admit(&best, &[], &ROOM, disk),
            Err(reject("Evicted", "The node had condition: [MemoryPressure DiskPressure]. ".into()))
        );
        assert_eq!(admit(&burst, &[], &ROOM, disk).unwrap_err().message, "The node had condition: [DiskPressure]. ");
        assert_eq!(admit(&critical, &[], &ROOM, disk), Ok(()));
    }

    #[test]
    fn requests_take_the_larger_of_apps_and_init() {
        let p = pod(json!({
            "initContainers":[{"name":"i","resources":{"requests":{"cpu":"2","memory":"1Gi"}}}],
            "containers":[{"name":"a","resources":{"requests":{"cpu":"500m","memory":"2Gi"}}},
                          {"name":"b","resources":{"limits":{"cpu":"1"}}}]}));
        assert_eq!(pod_requests(&p), (2000, 2 * 1024 * 1024 * 1024));
    }

    #[test]
    fn requests_count_sidecars_next_to_the_app_containers_and_later_init_containers() {
        let p = pod(json!({
            "initContainers":[
                {"name":"i1","resources":{"requests":{"cpu":"1","memory":"100"}}},
                {"name":"s","restartPolicy":"Always","resources":{"requests":{"cpu":"300m","memory":"50"}}},
                {"name":"i2","resources":{"requests":{"cpu":"900m","memory":"10"}}}],
            "containers":[{"name":"a","resources":{"requests":{"cpu":"500m","memory":"20"}}}]}));
        // cpu: max(500 + 300, 1000, 300 + 900) = 1200; memory: max(20 + 50, 100, 50 + 10) = 100.
        assert_eq!(pod_requests(&p), (1200, 100));
    }

    #[test]
    fn requests_include_the_overhead_as_the_scheduler_counts_it() {
        let p = pod(json!({
            "overhead": {"cpu": "250m", "memory": "120Mi"},
            "containers":[{"name":"a","resources":{"requests":{"cpu":"500m","memory":"1Mi"}}}]}));
        assert_eq!(pod_requests(&p), (750, 121 * 1024 * 1024));
        // Memory rounds up to a whole byte (upstream's Value), cpu to a whole millicore.
        let p = pod(json!({"containers":[{"name":"a","resources":{"requests":{"cpu":"0.0001","memory":"1.5"}}}]}));
        assert_eq!(pod_requests(&p), (1, 2));
    }

    #[test]
    fn fits_until_a_resource_runs_out() {
        let a = with_requests("1500m", "100Mi");
        let b = with_requests("500m", "100Mi");
        assert_eq!(admit(&a, &[], &ROOM, CALM), Ok(()));
        assert_eq!(admit(&b, &[&a], &ROOM, CALM), Ok(()), "exactly full fits");
        let c = with_requests("1m", "1Mi");
        assert_eq!(
            admit(&c, &[&a, &b], &ROOM, CALM),
            Err(reject("OutOfcpu", "Node didn't have enough resource: cpu, requested: 1, used: 2000, capacity: 2000".into()))
        );
        let big = with_requests("0", "2Gi");
        assert_eq!(admit(&big, &[], &ROOM, CALM).unwrap_err().reason, "OutOfmemory");
        // A pod without requests fits anywhere there is room for one more pod.
        let none = pod(json!({"containers": [{"name": "c"}]}));
        assert_eq!(admit(&none, &[&a, &b], &ROOM, CALM), Ok(()));
        assert_eq!(
            admit(&none, &[&a, &b, &none], &ROOM, CALM),
            Err(reject("OutOfpods", "Node didn't have enough resource: pods, requested: 1, used: 3, capacity: 3".into()))
        );
    }

    #[test]
    fn unsupported_volumes_are_refused() {
        let p = pod(json!({"containers": [{"name": "c"}], "volumes": [{"name": "x", "emptyDir": {"medium": "HugePages"}}]}));
        let r = admit(&p, &[], &ROOM, CALM).unwrap_err();
        assert_eq!(r.reason, "UnsupportedVolume");
        assert!(r.message.contains("HugePages"), "{}", r.message);
    }
}
