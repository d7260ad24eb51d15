//! Admission of a pod to this node, as upstream's kubelet admit handlers (predicate admission):
//! the volumes must be of supported types, one more pod must fit under maxPods, and the pod's
//! requests must fit in what the pods admitted before leave of the node's allocatable.

use k8s_openapi::api::core::v1::{Container, Pod};

use crate::pod::model;
use crate::pod::volume;

/// What the node offers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Room {
    pub max_pods: usize,
    pub allocatable_cpu_milli: i64,
    pub allocatable_memory: i64,
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
pub fn admit(pod: &Pod, admitted: &[&Pod], room: &Room) -> Result<(), Rejection> {
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

/// A quantity times `scale`, rounded up exactly as upstream's ScaledValue (the scheduler's
/// arithmetic: admission and scheduling agree).
fn millis_of(q: Option<&k8s_openapi::apimachinery::pkg::api::resource::Quantity>, scale: i128) -> i64 {
    q.and_then(|q| k8s_semantics::quantity::scaled(&q.0, scale))
        .map(|v| i64::try_from(v).unwrap_or(if v < 0 { i64::MIN } else { i64::MAX }))
        .unwrap_or(0)
}

/// The pod's effective requests (cpu milli, memory bytes), as upstream's PodRequests with
/// sidecars: the larger of the app containers plus every sidecar (they run together), and of
/// each init container plus the sidecars declared before it (already running when it runs).
pub fn pod_requests(pod: &Pod) -> (i64, i64) {
    let Some(spec) = pod.spec.as_ref() else {
        return (0, 0);
    };
    let req = |c: &Container| {
        let one = |name: &str, scale: i128| {
            millis_of(
                c.resources.as_ref().and_then(|r| {
                    r.requests
                        .as_ref()
                        .and_then(|m| m.get(name))
                        .or_else(|| r.limits.as_ref().and_then(|m| m.get(name)))
                }),
                scale,
            )
        };
        (one("cpu", 1000), one("memory", 1))
    };
    let app = spec.containers.iter().map(req).fold((0, 0), |(c, m), (x, y)| (c + x, m + y));
    let mut sidecars = (0, 0);
    let mut init = (0, 0);
    for c in spec.init_containers.iter().flatten() {
        let (x, y) = req(c);
        let during = (sidecars.0 + x, sidecars.1 + y);
        if model::is_sidecar(c) {
            sidecars = during;
        }
        init = (init.0.max(during.0), init.1.max(during.1));
    }
    ((app.0 + sidecars.0).max(init.0), (app.1 + sidecars.1).max(init.1))
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
    fn fits_until_a_resource_runs_out() {
        let a = with_requests("1500m", "100Mi");
        let b = with_requests("500m", "100Mi");
        assert_eq!(admit(&a, &[], &ROOM), Ok(()));
        assert_eq!(admit(&b, &[&a], &ROOM), Ok(()), "exactly full fits");
        let c = with_requests("1m", "1Mi");
        assert_eq!(
            admit(&c, &[&a, &b], &ROOM),
            Err(reject("OutOfcpu", "Node didn't have enough resource: cpu, requested: 1, used: 2000, capacity: 2000".into()))
        );
        let big = with_requests("0", "2Gi");
        assert_eq!(admit(&big, &[], &ROOM).unwrap_err().reason, "OutOfmemory");
        // A pod without requests fits anywhere there is room for one more pod.
        let none = pod(json!({"containers": [{"name": "c"}]}));
        assert_eq!(admit(&none, &[&a, &b], &ROOM), Ok(()));
        assert_eq!(
            admit(&none, &[&a, &b, &none], &ROOM),
            Err(reject("OutOfpods", "Node didn't have enough resource: pods, requested: 1, used: 3, capacity: 3".into()))
        );
    }

    #[test]
    fn unsupported_volumes_are_refused() {
        let p = pod(json!({"containers": [{"name": "c"}], "volumes": [{"name": "x", "emptyDir": {"medium": "HugePages"}}]}));
        let r = admit(&p, &[], &ROOM).unwrap_err();
        assert_eq!(r.reason, "UnsupportedVolume");
        assert!(r.message.contains("HugePages"), "{}", r.message);
    }
}
