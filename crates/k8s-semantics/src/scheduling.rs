//! Scheduling rules of the core API types, exactly as upstream's helpers
//! (`k8s.io/component-helpers/scheduling/corev1` and its `nodeaffinity` package,
//! `k8s.io/api/core/v1` toleration methods):
//!
//! - taints and tolerations: [`tolerates`] (`Toleration.ToleratesTaint`),
//!   [`tolerations_tolerate_taint`], [`find_untolerated_taint`]
//!   (`FindMatchingUntoleratedTaint`), [`matching_tolerations`] (`GetMatchingTolerations`),
//!   [`count_intolerable_prefer_no_schedule`] (the TaintToleration score);
//! - node selector terms: [`NodeSelector`] (`nodeaffinity.LazyErrorNodeSelector`: terms ORed,
//!   requirements ANDed, an empty or invalid term matching nothing), [`node_selector_matches`]
//!   (`spec.nodeSelector`, `labels.SelectorFromSet`), [`RequiredNodeAffinity`]
//!   (`GetRequiredNodeAffinity(pod).Match(node)`), [`PreferredSchedulingTerms`]
//!   (`NewPreferredSchedulingTerms(...).Score(node)`);
//! - topology selector terms: [`match_topology_selector_terms`]
//!   (`MatchTopologySelectorTerms`, StorageClass `allowedTopologies`).
//!
//! A node is passed as its name and labels, so a caller can match a node known only by name.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Node, Pod, PreferredSchedulingTerm, Taint, Toleration, TopologySelectorTerm,
};

/// The taint effects.
pub const NO_SCHEDULE: &str = "NoSchedule";
pub const PREFER_NO_SCHEDULE: &str = "PreferNoSchedule";
pub const NO_EXECUTE: &str = "NoExecute";

/// The field key `matchFields` supports (upstream validation refuses any other).
pub const NODE_FIELD_NAME: &str = "metadata.name";

// ---------------------------------------------------------------------------
// taints and tolerations
// ---------------------------------------------------------------------------

/// Upstream `Toleration.ToleratesTaint`: an empty effect matches every effect, an empty key
/// every key (with `Exists`: an empty key and `Exists` tolerate everything); `Equal` or no
/// operator compares values, `Exists` ignores them; any other operator tolerates nothing.
/// `tolerationSeconds` does not matter here.
pub fn tolerates(toleration: &Toleration, taint: &Taint) -> bool {
    let effect = toleration.effect.as_deref().unwrap_or("");
    if !effect.is_empty() && effect != taint.effect {
        return false;
    }
    let key = toleration.key.as_deref().unwrap_or("");
    if !key.is_empty() && key != taint.key {
        return false;
    }
    match toleration.operator.as_deref().unwrap_or("") {
        "" | "Equal" => {
            toleration.value.as_deref().unwrap_or("") == taint.value.as_deref().unwrap_or("")
        }
        "Exists" => true,
        _ => false,
    }
}

/// Upstream `TolerationsTolerateTaint`: some toleration tolerates the taint.
pub fn tolerations_tolerate_taint(tolerations: &[Toleration], taint: &Taint) -> bool {
    tolerations.iter().any(|t| tolerates(t, taint))
}

/// Upstream `FindMatchingUntoleratedTaint`: the first taint that `include` selects and no
/// toleration tolerates. The scheduler's filter includes NoSchedule and NoExecute
/// ([`does_not_schedule`]).
pub fn find_untolerated_taint<'t>(
    taints: &'t [Taint],
    tolerations: &[Toleration],
    include: impl Fn(&Taint) -> bool,
) -> Option<&'t Taint> {
    taints
        .iter()
        .filter(|t| include(t))
        .find(|t| !tolerations_tolerate_taint(tolerations, t))
}

/// Whether the taint keeps new pods off the node (effect NoSchedule or NoExecute), the filter
/// of upstream's TaintToleration plugin.
pub fn does_not_schedule(taint: &Taint) -> bool {
    taint.effect == NO_SCHEDULE || taint.effect == NO_EXECUTE
}

/// Upstream `GetMatchingTolerations`: for each taint, the first toleration that tolerates it;
/// None when some taint is not tolerated.
pub fn matching_tolerations<'a, 't>(
    taints: impl IntoIterator<Item = &'a Taint>,
    tolerations: &'t [Toleration],
) -> Option<Vec<&'t Toleration>> {
    taints
        .into_iter()
        .map(|taint| tolerations.iter().find(|t| tolerates(t, taint)))
        .collect()
}

/// The TaintToleration score's raw count (upstream `countIntolerableTaintsPreferNoSchedule`):
/// the PreferNoSchedule taints that no toleration with an empty or PreferNoSchedule effect
/// tolerates.
pub fn count_intolerable_prefer_no_schedule(taints: &[Taint], tolerations: &[Toleration]) -> usize {
    let prefer: Vec<&Toleration> = tolerations
        .iter()
        .filter(|t| {
            matches!(
                t.effect.as_deref(),
                None | Some("") | Some(PREFER_NO_SCHEDULE)
            )
        })
        .collect();
    taints
        .iter()
        .filter(|t| t.effect == PREFER_NO_SCHEDULE)
        .filter(|taint| !prefer.iter().any(|t| tolerates(t, taint)))
        .count()
}

// ---------------------------------------------------------------------------
// names
// ---------------------------------------------------------------------------

/// `([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]`, the name part of a qualified name and a
/// non-empty label value.
fn is_name_part(s: &str) -> bool {
    let b = s.as_bytes();
    match (b.first(), b.last()) {
        (Some(f), Some(l)) => {
            f.is_ascii_alphanumeric()
                && l.is_ascii_alphanumeric()
                && b.iter()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
        }
        _ => false,
    }
}

/// Upstream `IsDNS1123Subdomain`.
fn is_dns1123_subdomain(s: &str) -> bool {
    s.len() <= 253
        && s.split('.').all(|label| {
            let b = label.as_bytes();
            match (b.first(), b.last()) {
                (Some(f), Some(l)) => {
                    (f.is_ascii_lowercase() || f.is_ascii_digit())
                        && (l.is_ascii_lowercase() || l.is_ascii_digit())
                        && b.iter()
                            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
                }
                _ => false,
            }
        })
}

/// Upstream `IsQualifiedName` (label keys, resource names): an optional DNS subdomain prefix
/// and `/`, then a name of at most 63 characters.
pub fn is_qualified_name(s: &str) -> bool {
    let name = match s.split_once('/') {
        None => s,
        Some((prefix, name)) => {
            if prefix.is_empty() || !is_dns1123_subdomain(prefix) || name.contains('/') {
                return false;
            }
            name
        }
    };
    name.len() <= 63 && is_name_part(name)
}

/// Upstream `IsValidLabelValue`: empty, or at most 63 characters of the name alphabet.
pub fn is_label_value(s: &str) -> bool {
    s.is_empty() || (s.len() <= 63 && is_name_part(s))
}

// ---------------------------------------------------------------------------
// node selector terms
// ---------------------------------------------------------------------------

/// Why a node selector term is invalid (upstream's parse errors, which make the term match no
/// node).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SelectorError {
    #[error("operator {0:?} is not supported")]
    UnsupportedOperator(String),
    #[error("invalid label key {0:?}")]
    InvalidKey(String),
    #[error("invalid label value {value:?} for key {key:?}")]
    InvalidValue { key: String, value: String },
    #[error("for 'in', 'notin' operators, values set can't be empty")]
    EmptyValues,
    #[error("values set must be empty for exists and does not exist")]
    UnexpectedValues,
    #[error("for 'Gt', 'Lt' operators, exactly one value is required")]
    NotOneValue,
    #[error("for 'Gt', 'Lt' operators, the value must be an integer: {0:?}")]
    NotAnInteger(String),
    #[error("matchFields {0:?}: must have one element")]
    NotOneFieldValue(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Op {
    In(Vec<String>),
    NotIn(Vec<String>),
    Exists,
    DoesNotExist,
    Gt(i64),
    Lt(i64),
}

/// A label requirement checked as upstream's `labels.NewRequirement`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Requirement {
    key: String,
    op: Op,
}

/// Go's `strconv.ParseInt(s, 10, 64)`.
fn parse_int(s: &str) -> Option<i64> {
    s.parse().ok()
}

impl Requirement {
    fn new(key: &str, operator: &str, values: &[String]) -> Result<Requirement, SelectorError> {
        if !is_qualified_name(key) {
            return Err(SelectorError::InvalidKey(key.to_string()));
        }
        if let Some(v) = values.iter().find(|v| !is_label_value(v)) {
            return Err(SelectorError::InvalidValue {
                key: key.to_string(),
                value: v.clone(),
            });
        }
        let one_int = || match values {
            [v] => parse_int(v).ok_or_else(|| SelectorError::NotAnInteger(v.clone())),
            _ => Err(SelectorError::NotOneValue),
        };
        let op = match operator {
            "In" | "NotIn" if values.is_empty() => return Err(SelectorError::EmptyValues),
            "In" => Op::In(values.to_vec()),
            "NotIn" => Op::NotIn(values.to_vec()),
            "Exists" | "DoesNotExist" if !values.is_empty() => {
                return Err(SelectorError::UnexpectedValues)
            }
            "Exists" => Op::Exists,
            "DoesNotExist" => Op::DoesNotExist,
            "Gt" => Op::Gt(one_int()?),
            "Lt" => Op::Lt(one_int()?),
            other => return Err(SelectorError::UnsupportedOperator(other.to_string())),
        };
        Ok(Requirement {
            key: key.to_string(),
            op,
        })
    }

    /// Upstream `Requirement.Matches`; Gt and Lt need a label that parses as an integer.
    fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        let actual = labels.get(&self.key);
        match &self.op {
            Op::In(values) => actual.is_some_and(|v| values.contains(v)),
            Op::NotIn(values) => actual.is_none_or(|v| !values.contains(v)),
            Op::Exists => actual.is_some(),
            Op::DoesNotExist => actual.is_none(),
            Op::Gt(want) => actual.and_then(|v| parse_int(v)).is_some_and(|v| v > *want),
            Op::Lt(want) => actual.and_then(|v| parse_int(v)).is_some_and(|v| v < *want),
        }
    }
}

/// A `matchFields` requirement: the field's value equal (In) or not equal (NotIn) to the one
/// value (upstream `nodeSelectorRequirementsAsFieldSelector`).
#[derive(Debug, Clone, PartialEq, Eq)]
struct FieldRequirement {
    key: String,
    value: String,
    equal: bool,
}

/// One node selector term, parsed once (upstream `nodeSelectorTerm`): its label requirements
/// and field requirements all hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeSelectorTerm {
    labels: Vec<Requirement>,
    fields: Vec<FieldRequirement>,
}

impl NodeSelectorTerm {
    /// Parses a term; None for an empty one (no expressions, no fields), which matches no node.
    pub fn parse(
        t: &k8s_openapi::api::core::v1::NodeSelectorTerm,
    ) -> Result<Option<NodeSelectorTerm>, SelectorError> {
        let exprs = t.match_expressions.as_deref().unwrap_or(&[]);
        let fields = t.match_fields.as_deref().unwrap_or(&[]);
        if exprs.is_empty() && fields.is_empty() {
            return Ok(None);
        }
        let labels = exprs
            .iter()
            .map(|e| Requirement::new(&e.key, &e.operator, e.values.as_deref().unwrap_or(&[])))
            .collect::<Result<Vec<_>, _>>()?;
        let fields = fields
            .iter()
            .map(|f| {
                let equal = match f.operator.as_str() {
                    "In" => true,
                    "NotIn" => false,
                    other => return Err(SelectorError::UnsupportedOperator(other.to_string())),
                };
                match f.values.as_deref().unwrap_or(&[]) {
                    [value] => Ok(FieldRequirement {
                        key: f.key.clone(),
                        value: value.clone(),
                        equal,
                    }),
                    _ => Err(SelectorError::NotOneFieldValue(f.key.clone())),
                }
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Some(NodeSelectorTerm { labels, fields }))
    }

    /// Whether the node matches (upstream `nodeSelectorTerm.match`). The only node field is
    /// `metadata.name`; another key reads as empty (validation refuses it), and a node without
    /// a name skips the field requirements, as upstream's does.
    pub fn matches(&self, node_name: &str, labels: &BTreeMap<String, String>) -> bool {
        self.labels.iter().all(|r| r.matches(labels))
            && (node_name.is_empty()
                || self.fields.iter().all(|f| {
                    let actual = if f.key == NODE_FIELD_NAME {
                        node_name
                    } else {
                        ""
                    };
                    (actual == f.value) == f.equal
                }))
    }
}

/// A required node selector (upstream `LazyErrorNodeSelector`): the terms are ORed; an empty
/// term is dropped and an invalid one kept as its error, both matching nothing, so no terms
/// (or only such terms) match no node.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NodeSelector {
    terms: Vec<Result<NodeSelectorTerm, SelectorError>>,
}

impl NodeSelector {
    pub fn new(s: &k8s_openapi::api::core::v1::NodeSelector) -> NodeSelector {
        NodeSelector {
            terms: s
                .node_selector_terms
                .iter()
                .filter_map(|t| NodeSelectorTerm::parse(t).transpose())
                .collect(),
        }
    }

    /// The parse errors of its terms (upstream `NewNodeSelector` refuses a selector with any).
    pub fn errors(&self) -> impl Iterator<Item = &SelectorError> {
        self.terms.iter().filter_map(|t| t.as_ref().err())
    }

    /// Whether some valid term matches the node.
    pub fn matches(&self, node_name: &str, labels: &BTreeMap<String, String>) -> bool {
        self.terms
            .iter()
            .any(|t| t.as_ref().is_ok_and(|t| t.matches(node_name, labels)))
    }

    /// [`NodeSelector::matches`] for a node object.
    pub fn matches_node(&self, node: &Node) -> bool {
        self.matches(node_name(node), node_labels(node))
    }
}

static NO_LABELS: BTreeMap<String, String> = BTreeMap::new();

fn node_name(node: &Node) -> &str {
    node.metadata.name.as_deref().unwrap_or("")
}

fn node_labels(node: &Node) -> &BTreeMap<String, String> {
    node.metadata.labels.as_ref().unwrap_or(&NO_LABELS)
}

/// `spec.nodeSelector` (upstream `labels.SelectorFromSet`): every pair is a label of the node
/// with that value; an empty map matches every node.
pub fn node_selector_matches(
    selector: &BTreeMap<String, String>,
    labels: &BTreeMap<String, String>,
) -> bool {
    selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

/// A pod's hard node constraints (upstream `GetRequiredNodeAffinity(pod)`):
/// `spec.nodeSelector` and, when set, the required node affinity, both holding.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RequiredNodeAffinity {
    node_selector: BTreeMap<String, String>,
    affinity: Option<NodeSelector>,
}

impl RequiredNodeAffinity {
    pub fn of(pod: &Pod) -> RequiredNodeAffinity {
        let spec = pod.spec.as_ref();
        RequiredNodeAffinity {
            node_selector: spec
                .and_then(|s| s.node_selector.clone())
                .unwrap_or_default(),
            affinity: spec
                .and_then(|s| s.affinity.as_ref())
                .and_then(|a| a.node_affinity.as_ref())
                .and_then(|a| {
                    a.required_during_scheduling_ignored_during_execution
                        .as_ref()
                })
                .map(NodeSelector::new),
        }
    }

    /// Upstream `RequiredNodeAffinity.Match`.
    pub fn matches(&self, node_name: &str, labels: &BTreeMap<String, String>) -> bool {
        node_selector_matches(&self.node_selector, labels)
            && self
                .affinity
                .as_ref()
                .is_none_or(|a| a.matches(node_name, labels))
    }

    /// [`RequiredNodeAffinity::matches`] for a node object.
    pub fn matches_node(&self, node: &Node) -> bool {
        self.matches(node_name(node), node_labels(node))
    }
}

/// Preferred node affinity terms with their weights (upstream `PreferredSchedulingTerms`):
/// terms with weight 0 or no requirements are dropped.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PreferredSchedulingTerms {
    terms: Vec<(i64, NodeSelectorTerm)>,
}

impl PreferredSchedulingTerms {
    /// Parses the terms; like upstream `NewPreferredSchedulingTerms` it fails when any term is
    /// invalid (API validation refuses such a pod).
    pub fn new(
        terms: &[PreferredSchedulingTerm],
    ) -> Result<PreferredSchedulingTerms, SelectorError> {
        let mut out = Vec::with_capacity(terms.len());
        for t in terms.iter().filter(|t| t.weight != 0) {
            if let Some(term) = NodeSelectorTerm::parse(&t.preference)? {
                out.push((i64::from(t.weight), term));
            }
        }
        Ok(PreferredSchedulingTerms { terms: out })
    }

    /// The pod's preferred node affinity terms.
    pub fn of(pod: &Pod) -> Result<PreferredSchedulingTerms, SelectorError> {
        let terms = pod
            .spec
            .as_ref()
            .and_then(|s| s.affinity.as_ref())
            .and_then(|a| a.node_affinity.as_ref())
            .and_then(|a| {
                a.preferred_during_scheduling_ignored_during_execution
                    .as_deref()
            })
            .unwrap_or(&[]);
        PreferredSchedulingTerms::new(terms)
    }

    /// The sum of the weights of the terms the node matches (upstream `Score`).
    pub fn score(&self, node_name: &str, labels: &BTreeMap<String, String>) -> i64 {
        self.terms
            .iter()
            .filter(|(_, t)| t.matches(node_name, labels))
            .map(|(w, _)| *w)
            .sum()
    }

    pub fn is_empty(&self) -> bool {
        self.terms.is_empty()
    }
}

/// Upstream `MatchTopologySelectorTerms` (StorageClass `allowedTopologies`): no terms match
/// every node; otherwise some term's requirements (each "label in values") all hold. An empty
/// term, or one with an invalid requirement (empty values, a bad key or value), matches nothing.
pub fn match_topology_selector_terms(
    terms: &[TopologySelectorTerm],
    labels: &BTreeMap<String, String>,
) -> bool {
    terms.is_empty()
        || terms.iter().any(|t| {
            let exprs = t.match_label_expressions.as_deref().unwrap_or(&[]);
            !exprs.is_empty()
                && exprs.iter().all(|e| {
                    Requirement::new(&e.key, "In", &e.values).is_ok_and(|r| r.matches(labels))
                })
        })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    fn from<T: serde::de::DeserializeOwned>(v: Value) -> T {
        serde_json::from_value(v).unwrap()
    }

    fn taint(key: &str, value: &str, effect: &str) -> Taint {
        from(json!({"key": key, "value": value, "effect": effect}))
    }

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn toleration_matrix() {
        // (toleration, taint key, value, effect, tolerated)
        let cases = [
            (json!({"operator": "Exists"}), "a", "b", "NoSchedule", true),
            (json!({"operator": "Exists"}), "x", "", "NoExecute", true),
            (
                json!({"operator": "Exists", "effect": "NoExecute"}),
                "a",
                "b",
                "NoSchedule",
                false,
            ),
            (
                json!({"operator": "Exists", "effect": "NoExecute"}),
                "a",
                "b",
                "NoExecute",
                true,
            ),
            (
                json!({"key": "a", "operator": "Equal", "value": "b"}),
                "a",
                "b",
                "NoSchedule",
                true,
            ),
            (
                json!({"key": "a", "operator": "Equal", "value": "c"}),
                "a",
                "b",
                "NoSchedule",
                false,
            ),
            (
                json!({"key": "a", "value": "b"}),
                "a",
                "b",
                "NoSchedule",
                true,
            ),
            (json!({"key": "a"}), "a", "b", "NoSchedule", false),
            (json!({"key": "a"}), "a", "", "NoSchedule", true),
            (
                json!({"key": "z", "operator": "Exists"}),
                "a",
                "b",
                "NoSchedule",
                false,
            ),
            (
                json!({"key": "a", "operator": "Exists"}),
                "a",
                "b",
                "NoSchedule",
                true,
            ),
            (
                json!({"key": "a", "operator": "Exists"}),
                "a",
                "b",
                "NoExecute",
                true,
            ),
            (
                json!({"key": "a", "operator": "Exists"}),
                "a",
                "b",
                "PreferNoSchedule",
                true,
            ),
            (
                json!({"key": "a", "operator": "Exists", "effect": "NoSchedule"}),
                "a",
                "b",
                "NoExecute",
                false,
            ),
            // Equal with an empty key: every key, but the values must match
            (
                json!({"operator": "Equal", "value": "b"}),
                "any",
                "b",
                "NoSchedule",
                true,
            ),
            (
                json!({"operator": "Equal", "value": "b"}),
                "any",
                "c",
                "NoSchedule",
                false,
            ),
            (
                json!({"key": "", "effect": ""}),
                "any",
                "",
                "NoExecute",
                true,
            ),
            (
                json!({"key": "a", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 0}),
                "a",
                "b",
                "NoExecute",
                true,
            ),
            (
                json!({"key": "a", "operator": "Gt", "value": "1"}),
                "a",
                "2",
                "NoSchedule",
                false,
            ),
        ];
        for (tol, key, value, effect, want) in cases {
            let t: Toleration = from(tol.clone());
            assert_eq!(
                tolerates(&t, &taint(key, value, effect)),
                want,
                "{tol} vs {key}={value}:{effect}"
            );
        }
    }

    #[test]
    fn untolerated_and_matching_tolerations() {
        let taints = [
            taint("soft", "", "PreferNoSchedule"),
            taint("a", "1", "NoSchedule"),
            taint("b", "", "NoExecute"),
        ];
        let tols: Vec<Toleration> = from(json!([
            {"key": "a", "value": "1"},
            {"key": "b", "operator": "Exists", "tolerationSeconds": 30},
            {"key": "b", "operator": "Exists"}
        ]));
        assert_eq!(
            find_untolerated_taint(&taints, &tols, does_not_schedule),
            None
        );
        assert_eq!(
            find_untolerated_taint(&taints, &tols[1..], does_not_schedule).map(|t| t.key.as_str()),
            Some("a")
        );
        assert_eq!(
            find_untolerated_taint(&taints, &tols, |_| true).map(|t| t.key.as_str()),
            Some("soft"),
            "the filter decides which taints count"
        );
        assert!(tolerations_tolerate_taint(&tols, &taints[2]));
        assert!(!tolerations_tolerate_taint(&[], &taints[2]));
        let m = matching_tolerations(&taints[1..], &tols).unwrap();
        assert_eq!(
            m,
            [&tols[0], &tols[1]],
            "the first matching toleration of each taint"
        );
        assert!(matching_tolerations(&taints, &tols).is_none());
        assert_eq!(matching_tolerations(&[], &tols), Some(vec![]));
    }

    #[test]
    fn prefer_no_schedule_counts_only_tolerations_with_empty_or_prefer_effect() {
        let taints = [
            taint("x", "", "PreferNoSchedule"),
            taint("y", "", "PreferNoSchedule"),
            taint("z", "", "NoSchedule"),
        ];
        // (tolerations, count)
        let cases = [
            (json!([]), 2),
            (json!([{"key": "x", "operator": "Exists"}]), 1),
            (
                json!([{"key": "x", "operator": "Exists", "effect": "PreferNoSchedule"}]),
                1,
            ),
            (
                json!([{"key": "x", "operator": "Exists", "effect": "NoSchedule"}]),
                2,
            ),
            (json!([{"operator": "Exists"}]), 0),
        ];
        for (tols, want) in cases {
            let tols: Vec<Toleration> = from(tols);
            assert_eq!(
                count_intolerable_prefer_no_schedule(&taints, &tols),
                want,
                "{tols:?}"
            );
        }
    }

    fn selector(terms: Value) -> NodeSelector {
        NodeSelector::new(&from(json!({"nodeSelectorTerms": terms})))
    }

    fn expr(key: &str, op: &str, values: &[&str]) -> Value {
        json!([{"matchExpressions": [{"key": key, "operator": op, "values": values}]}])
    }

    fn field(op: &str, values: &[&str]) -> Value {
        json!([{"matchFields": [{"key": "metadata.name", "operator": op, "values": values}]}])
    }

    #[test]
    fn node_selector_terms() {
        let node = labels(&[("zone", "a"), ("cores", "8"), ("name", "x"), ("neg", "-3")]);
        // (case, terms, matches node "n")
        let cases = [
            ("In", expr("zone", "In", &["a", "b"]), true),
            ("In, other value", expr("zone", "In", &["b"]), false),
            ("In, missing label", expr("missing", "In", &["a"]), false),
            ("NotIn", expr("zone", "NotIn", &["b"]), true),
            ("NotIn, same value", expr("zone", "NotIn", &["a"]), false),
            (
                "NotIn, missing label",
                expr("missing", "NotIn", &["a"]),
                true,
            ),
            ("Exists", expr("zone", "Exists", &[]), true),
            ("Exists, missing", expr("missing", "Exists", &[]), false),
            (
                "DoesNotExist, missing",
                expr("missing", "DoesNotExist", &[]),
                true,
            ),
            ("DoesNotExist", expr("zone", "DoesNotExist", &[]), false),
            ("Gt", expr("cores", "Gt", &["4"]), true),
            ("Gt is strict", expr("cores", "Gt", &["8"]), false),
            ("Lt", expr("cores", "Lt", &["9"]), true),
            ("Lt is strict", expr("cores", "Lt", &["8"]), false),
            (
                "Lt, a negative label compares as an integer",
                expr("neg", "Lt", &["0"]),
                true,
            ),
            // values must be label values too, so no sign: upstream refuses the requirement
            (
                "Gt, negative value: invalid term",
                expr("neg", "Gt", &["-4"]),
                false,
            ),
            (
                "Gt, signed value: invalid term",
                expr("cores", "Gt", &["+7"]),
                false,
            ),
            ("Gt, non-integer label", expr("name", "Gt", &["1"]), false),
            (
                "Gt, non-integer value: invalid term",
                expr("cores", "Gt", &["many"]),
                false,
            ),
            (
                "Gt, fractional value: invalid term",
                expr("cores", "Gt", &["1.5"]),
                false,
            ),
            (
                "Lt, two values: invalid term",
                expr("cores", "Lt", &["9", "10"]),
                false,
            ),
            ("Lt, missing label", expr("missing", "Lt", &["100"]), false),
            (
                "In without values: invalid term",
                expr("zone", "In", &[]),
                false,
            ),
            (
                "NotIn without values: invalid term",
                expr("missing", "NotIn", &[]),
                false,
            ),
            (
                "Exists with values: invalid term",
                expr("zone", "Exists", &["a"]),
                false,
            ),
            ("unknown operator", expr("zone", "Like", &["a"]), false),
            ("invalid key", expr("bad key", "DoesNotExist", &[]), false),
            (
                "invalid value",
                expr("zone", "NotIn", &["not a value"]),
                false,
            ),
            ("matchFields In", field("In", &["n"]), true),
            ("matchFields In, other node", field("In", &["m"]), false),
            ("matchFields NotIn", field("NotIn", &["m"]), true),
            (
                "matchFields NotIn, this node",
                field("NotIn", &["n"]),
                false,
            ),
            (
                "matchFields with two values: invalid term",
                field("In", &["n", "m"]),
                false,
            ),
            (
                "matchFields Exists: invalid term",
                field("Exists", &[]),
                false,
            ),
            (
                "matchFields on another field reads it as empty",
                json!([{"matchFields": [{"key": "metadata.uid", "operator": "In", "values": ["n"]}]}]),
                false,
            ),
            (
                "expressions and fields of a term are ANDed",
                json!([{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}],
                        "matchFields": [{"key": "metadata.name", "operator": "In", "values": ["m"]}]}]),
                false,
            ),
            (
                "expressions of a term are ANDed",
                json!([{"matchExpressions": [
                    {"key": "zone", "operator": "In", "values": ["a"]},
                    {"key": "cores", "operator": "Gt", "values": ["10"]}
                ]}]),
                false,
            ),
            (
                "terms are ORed",
                json!([
                    {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["z"]}]},
                    {"matchExpressions": [{"key": "cores", "operator": "Gt", "values": ["2"]}]}
                ]),
                true,
            ),
            (
                "an invalid term does not spoil a valid one",
                json!([
                    {"matchExpressions": [{"key": "cores", "operator": "Gt", "values": ["x"]}]},
                    {"matchExpressions": [{"key": "zone", "operator": "Exists"}]}
                ]),
                true,
            ),
            (
                "one invalid requirement invalidates its whole term",
                json!([{"matchExpressions": [
                    {"key": "zone", "operator": "Exists"},
                    {"key": "cores", "operator": "Lt", "values": ["x"]}
                ]}]),
                false,
            ),
            ("no terms match nothing", json!([]), false),
            ("an empty term matches nothing", json!([{}]), false),
            (
                "an empty term next to a matching one",
                json!([{"matchExpressions": []}, {"matchExpressions": [{"key": "zone", "operator": "Exists"}]}]),
                true,
            ),
        ];
        for (case, terms, want) in cases {
            assert_eq!(selector(terms).matches("n", &node), want, "{case}");
        }
        assert_eq!(
            selector(expr("cores", "Gt", &["many"]))
                .errors()
                .collect::<Vec<_>>(),
            [&SelectorError::NotAnInteger("many".into())]
        );
        assert_eq!(selector(expr("zone", "In", &["a"])).errors().count(), 0);
        // a node without a name skips the field requirements (upstream extractNodeFields)
        assert!(selector(field("In", &["m"])).matches("", &node));
        let n: Node = from(json!({"metadata": {"name": "n", "labels": {"zone": "a"}}}));
        assert!(selector(expr("zone", "In", &["a"])).matches_node(&n));
    }

    #[test]
    fn required_node_affinity_combines_node_selector_and_affinity() {
        let pod = |spec: Value| -> Pod { from(json!({"metadata": {"name": "p"}, "spec": spec})) };
        let node: Node =
            from(json!({"metadata": {"name": "n", "labels": {"zone": "a", "disk": "ssd"}}}));
        let affinity = |terms: Value| json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}});
        // (case, pod spec, matches)
        let cases = [
            ("nothing required", json!({"containers": []}), true),
            (
                "empty nodeSelector",
                json!({"containers": [], "nodeSelector": {}}),
                true,
            ),
            (
                "nodeSelector",
                json!({"containers": [], "nodeSelector": {"disk": "ssd"}}),
                true,
            ),
            (
                "nodeSelector, all pairs",
                json!({"containers": [], "nodeSelector": {"disk": "ssd", "zone": "b"}}),
                false,
            ),
            (
                "nodeSelector, missing label",
                json!({"containers": [], "nodeSelector": {"gpu": ""}}),
                false,
            ),
            (
                "affinity",
                json!({"containers": [], "affinity": affinity(expr("zone", "In", &["a"]))}),
                true,
            ),
            (
                "affinity with no terms",
                json!({"containers": [], "affinity": affinity(json!([]))}),
                false,
            ),
            (
                "affinity with an empty term",
                json!({"containers": [], "affinity": affinity(json!([{}]))}),
                false,
            ),
            (
                "affinity object without required",
                json!({"containers": [], "affinity": {"nodeAffinity": {}}}),
                true,
            ),
            (
                "both must hold",
                json!({"containers": [], "nodeSelector": {"zone": "b"}, "affinity": affinity(expr("zone", "Exists", &[]))}),
                false,
            ),
            (
                "both hold",
                json!({"containers": [], "nodeSelector": {"zone": "a"}, "affinity": affinity(field("In", &["n"]))}),
                true,
            ),
        ];
        for (case, spec, want) in cases {
            assert_eq!(
                RequiredNodeAffinity::of(&pod(spec)).matches_node(&node),
                want,
                "{case}"
            );
        }
    }

    #[test]
    fn preferred_terms_sum_the_weights_of_matching_terms() {
        let terms: Vec<PreferredSchedulingTerm> = from(json!([
            {"weight": 10, "preference": {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}},
            {"weight": 5, "preference": {"matchExpressions": [{"key": "disk", "operator": "Exists"}]}},
            {"weight": 0, "preference": {"matchExpressions": [{"key": "zone", "operator": "Exists"}]}},
            {"weight": 7, "preference": {}}
        ]));
        let p = PreferredSchedulingTerms::new(&terms).unwrap();
        assert_eq!(p.score("n", &labels(&[("zone", "a"), ("disk", "ssd")])), 15);
        assert_eq!(p.score("n", &labels(&[("zone", "b"), ("disk", "ssd")])), 5);
        assert_eq!(p.score("n", &labels(&[])), 0);
        let bad: Vec<PreferredSchedulingTerm> = from(json!([
            {"weight": 1, "preference": {"matchExpressions": [{"key": "cores", "operator": "Gt", "values": ["x"]}]}}
        ]));
        assert_eq!(
            PreferredSchedulingTerms::new(&bad),
            Err(SelectorError::NotAnInteger("x".into()))
        );
        let pod: Pod = from(json!({"metadata": {"name": "p"}, "spec": {"containers": []}}));
        assert!(PreferredSchedulingTerms::of(&pod).unwrap().is_empty());
    }

    #[test]
    fn topology_selector_terms() {
        let node = labels(&[("topology.kubernetes.io/zone", "z1"), ("rack", "r1")]);
        let zone = |values: &[&str]| json!({"matchLabelExpressions": [{"key": "topology.kubernetes.io/zone", "values": values}]});
        // (case, terms, matches)
        let cases = [
            ("no terms match everything", json!([]), true),
            ("an empty term matches nothing", json!([{}]), false),
            (
                "an empty term list inside matches nothing",
                json!([{"matchLabelExpressions": []}]),
                false,
            ),
            ("in values", json!([zone(&["z1", "z2"])]), true),
            ("not in values", json!([zone(&["z2"])]), false),
            (
                "no values: invalid, matches nothing",
                json!([zone(&[])]),
                false,
            ),
            (
                "terms are ORed",
                json!([zone(&["z2"]), zone(&["z1"])]),
                true,
            ),
            (
                "requirements of a term are ANDed",
                json!([{"matchLabelExpressions": [
                    {"key": "topology.kubernetes.io/zone", "values": ["z1"]},
                    {"key": "rack", "values": ["r2"]}
                ]}]),
                false,
            ),
            (
                "missing label",
                json!([{"matchLabelExpressions": [{"key": "other", "values": ["z1"]}]}]),
                false,
            ),
        ];
        for (case, terms, want) in cases {
            let terms: Vec<TopologySelectorTerm> = from(terms);
            assert_eq!(match_topology_selector_terms(&terms, &node), want, "{case}");
        }
    }

    #[test]
    fn qualified_names_and_label_values() {
        for (name, ok) in [
            ("zone", true),
            ("topology.kubernetes.io/zone", true),
            ("a/b/c", false),
            ("/zone", false),
            ("Example.com/zone", false),
            ("example.com/", false),
            ("-zone", false),
            ("zone_1.x", true),
            (&"a".repeat(63), true),
            (&"a".repeat(64), false),
            ("", false),
        ] {
            assert_eq!(is_qualified_name(name), ok, "{name}");
        }
        for (value, ok) in [
            ("", true),
            ("a", true),
            ("a b", false),
            ("-a", false),
            ("A_1.b", true),
        ] {
            assert_eq!(is_label_value(value), ok, "{value}");
        }
    }
}
