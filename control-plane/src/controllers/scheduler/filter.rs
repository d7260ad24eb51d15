//! The filter plugins of the default profile that ferro implements, each named as upstream
//! names it, in upstream's order: whether the pod can run on the node, and if not, the reasons
//! upstream prints. The first failing plugin decides ([`run`]); one plugin can give several
//! reasons (`Insufficient cpu` and `Insufficient memory`).
//!
//! NodeName has no filter here: a pod with `spec.nodeName` is not pending (see
//! [`super::plan::is_pending`]). The volume claims' pre-filter is [`super::plan`]'s
//! `resolve_claims`, which fails the pod on every node at once.

use k8s_semantics::resources::PODS;
use k8s_semantics::scheduling::{
    does_not_schedule, find_untolerated_taint, tolerations_tolerate_taint,
};

use super::plan::{no_schedule_taint, plan_volumes, NodeInfo, PodFacts, VolumeView};

const TAINT_UNSCHEDULABLE: &str = "node.kubernetes.io/unschedulable";

// reasons, as upstream prints them
const REASON_UNSCHEDULABLE: &str = "node(s) were unschedulable";
const REASON_NOT_READY: &str = "node(s) were not ready";
const REASON_AFFINITY: &str = "node(s) didn't match Pod's node affinity/selector";
const REASON_PORTS: &str = "node(s) didn't have free ports for the requested pod ports";
const REASON_TOO_MANY_PODS: &str = "Too many pods";

/// A failed filter: the reasons and whether preemption could help (upstream `Unschedulable`
/// vs `UnschedulableAndUnresolvable`).
pub(super) struct Failure {
    pub(super) reasons: Vec<String>,
    pub(super) resolvable: bool,
}

impl Failure {
    fn unresolvable(reason: impl Into<String>) -> Failure {
        Failure {
            reasons: vec![reason.into()],
            resolvable: false,
        }
    }
}

/// A filter plugin: `Ok` when the node can take the pod.
pub(super) type Filter = fn(&PodFacts, &NodeInfo, &VolumeView) -> Result<(), Failure>;

/// The filter plugins by upstream name, in upstream's order (`NodeReady` is ferro's
/// addition, see the `plan` module documentation).
pub(super) const FILTERS: &[(&str, Filter)] = &[
    ("NodeUnschedulable", node_unschedulable),
    ("NodeReady", node_ready),
    ("TaintToleration", taint_toleration),
    ("NodeAffinity", node_affinity),
    ("NodePorts", node_ports),
    ("NodeResourcesFit", node_resources_fit),
    ("VolumeBinding", volume_binding),
];

/// Runs the filters in order; the first failing one decides.
pub(super) fn run(facts: &PodFacts, node: &NodeInfo, view: &VolumeView) -> Result<(), Failure> {
    for (_, filter) in FILTERS {
        filter(facts, node, view)?;
    }
    Ok(())
}

/// NodeUnschedulable: a cordoned node, unless the pod tolerates the `unschedulable` taint.
fn node_unschedulable(facts: &PodFacts, node: &NodeInfo, _: &VolumeView) -> Result<(), Failure> {
    let spec = node.node.spec.as_ref();
    if spec.and_then(|s| s.unschedulable) == Some(true)
        && !tolerations_tolerate_taint(facts.tolerations, &no_schedule_taint(TAINT_UNSCHEDULABLE))
    {
        return Err(Failure::unresolvable(REASON_UNSCHEDULABLE));
    }
    Ok(())
}

/// Readiness (ferro): a node whose Ready condition is not True, unless the pod tolerates the
/// taint upstream's node lifecycle controller would have added.
fn node_ready(facts: &PodFacts, node: &NodeInfo, _: &VolumeView) -> Result<(), Failure> {
    if let Some(taint) = &node.not_ready_taint {
        if !tolerations_tolerate_taint(facts.tolerations, taint) {
            return Err(Failure::unresolvable(REASON_NOT_READY));
        }
    }
    Ok(())
}

/// TaintToleration: the first NoSchedule or NoExecute taint the pod does not tolerate.
fn taint_toleration(facts: &PodFacts, node: &NodeInfo, _: &VolumeView) -> Result<(), Failure> {
    if let Some(taint) = find_untolerated_taint(node.taints(), facts.tolerations, does_not_schedule)
    {
        return Err(Failure::unresolvable(format!(
            "node(s) had untolerated taint {{{}: {}}}",
            taint.key,
            taint.value.as_deref().unwrap_or("")
        )));
    }
    Ok(())
}

/// NodeAffinity: `spec.nodeSelector` and the required node affinity.
fn node_affinity(facts: &PodFacts, node: &NodeInfo, _: &VolumeView) -> Result<(), Failure> {
    if !facts.required.matches(node.name(), node.labels()) {
        return Err(Failure::unresolvable(REASON_AFFINITY));
    }
    Ok(())
}

/// NodePorts: a wanted host port already used on the node.
fn node_ports(facts: &PodFacts, node: &NodeInfo, _: &VolumeView) -> Result<(), Failure> {
    if facts.ports.iter().any(|p| node.port_conflicts(p)) {
        return Err(Failure {
            reasons: vec![REASON_PORTS.to_string()],
            resolvable: true,
        });
    }
    Ok(())
}

/// NodeResourcesFit: upstream `fitsRequest`, pods count first, then every requested resource.
fn node_resources_fit(facts: &PodFacts, node: &NodeInfo, _: &VolumeView) -> Result<(), Failure> {
    let reasons: Vec<String> = facts
        .requests
        .insufficient(&node.allocatable, &node.requested)
        .into_iter()
        .map(|name| {
            if name == PODS {
                REASON_TOO_MANY_PODS.to_string()
            } else {
                format!("Insufficient {name}")
            }
        })
        .collect();
    if !reasons.is_empty() {
        return Err(Failure {
            reasons,
            resolvable: true,
        });
    }
    Ok(())
}

/// VolumeBinding: every claim bound to a volume reachable from the node, or bindable or
/// provisionable there.
fn volume_binding(facts: &PodFacts, node: &NodeInfo, view: &VolumeView) -> Result<(), Failure> {
    if !facts.claims.is_empty() {
        let plan = plan_volumes(&facts.claims, view, node);
        if !plan.reasons.is_empty() {
            return Err(Failure {
                reasons: plan.reasons.into_iter().map(String::from).collect(),
                resolvable: false,
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_run_in_upstreams_plugin_order() {
        let names: Vec<&str> = FILTERS.iter().map(|(name, _)| *name).collect();
        assert_eq!(
            names,
            [
                "NodeUnschedulable",
                "NodeReady",
                "TaintToleration",
                "NodeAffinity",
                "NodePorts",
                "NodeResourcesFit",
                "VolumeBinding"
            ]
        );
    }
}
