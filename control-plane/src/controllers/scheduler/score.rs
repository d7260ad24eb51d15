//! The score plugins of the default profile that ferro implements, each named as upstream
//! names it: every plugin scores a feasible node 0-100 with weight 1, and [`scores`] sums them.
//! NodeAffinity (preferred terms) and TaintToleration (PreferNoSchedule) score raw counts that
//! upstream's NormalizeScore scales by the maximum over the feasible nodes.

use k8s_semantics::scheduling::count_intolerable_prefer_no_schedule;

use super::plan::{NodeInfo, PodFacts};
use crate::controllers::quantity::Milli;

const MAX_SCORE: i64 = 100;
pub(super) const MB: i128 = 1024 * 1024;
/// ImageLocality: below this (scaled) size the score is 0 (upstream `minThreshold`).
const IMAGE_MIN_THRESHOLD: i128 = 23 * MB;
/// ImageLocality: per-container size at which the score saturates (upstream
/// `maxContainerThreshold`).
const IMAGE_MAX_CONTAINER_THRESHOLD: i128 = 1000 * MB;

/// The total score of each of the `feasible` nodes (`all` are every node, for ImageLocality's
/// spread), in their order.
pub(super) fn scores(facts: &PodFacts, feasible: &[&NodeInfo], all: &[&NodeInfo]) -> Vec<i64> {
    let image_locality = ImageLocality::new(facts, all);
    let mut totals: Vec<i64> = feasible
        .iter()
        .map(|node| {
            least_allocated(facts, node)
                + balanced_allocation(facts, node)
                + image_locality.score(node)
        })
        .collect();
    let mut affinity: Vec<i64> = feasible
        .iter()
        .map(|node| node_affinity(facts, node))
        .collect();
    let mut taints: Vec<i64> = feasible
        .iter()
        .map(|node| taint_toleration(facts, node))
        .collect();
    normalize(&mut affinity, false);
    normalize(&mut taints, true);
    for (i, total) in totals.iter_mut().enumerate() {
        *total += affinity[i] + taints[i];
    }
    totals
}

/// NodeResourcesFit with the LeastAllocated strategy (cpu and memory, weight 1 each), on the
/// requests with upstream's scoring defaults for containers that set none.
fn least_allocated(facts: &PodFacts, node: &NodeInfo) -> i64 {
    let (pod_cpu, pod_mem) = facts.non_zero;
    let (ncpu, nmem) = node.non_zero_requested();
    (least_requested(ncpu + pod_cpu, node.allocatable.cpu)
        + least_requested(nmem + pod_mem, node.allocatable.memory))
        / 2
}

/// NodeResourcesBalancedAllocation (actual requests): 1 - standard deviation of the cpu and
/// memory fractions.
fn balanced_allocation(facts: &PodFacts, node: &NodeInfo) -> i64 {
    let fractions: Vec<f64> = [
        fraction(
            node.requested.cpu + facts.requests.cpu,
            node.allocatable.cpu,
        ),
        fraction(
            node.requested.memory + facts.requests.memory,
            node.allocatable.memory,
        ),
    ]
    .into_iter()
    .flatten()
    .collect();
    let std = if let [a, b] = fractions.as_slice() {
        ((a - b) / 2.0).abs()
    } else {
        0.0
    };
    ((1.0 - std) * MAX_SCORE as f64) as i64
}

/// ImageLocality: the sizes of the pod's images the node holds, each scaled by the share of
/// all nodes holding it, between upstream's thresholds.
struct ImageLocality<'f> {
    /// Each of the pod's images with the share of all nodes that hold it.
    spread: Vec<(&'f str, f64)>,
    max: i128,
}

impl<'f> ImageLocality<'f> {
    fn new(facts: &'f PodFacts, all: &[&NodeInfo]) -> ImageLocality<'f> {
        let spread = facts
            .images
            .iter()
            .map(|i| {
                let holders = all.iter().filter(|n| n.images.contains_key(i)).count();
                (i.as_str(), holders as f64 / all.len().max(1) as f64)
            })
            .collect();
        ImageLocality {
            spread,
            max: IMAGE_MAX_CONTAINER_THRESHOLD * facts.images.len() as i128,
        }
    }

    fn score(&self, node: &NodeInfo) -> i64 {
        if self.max <= IMAGE_MIN_THRESHOLD {
            return 0;
        }
        let sum: i128 = self
            .spread
            .iter()
            .filter_map(|(img, spread)| {
                node.images
                    .get(*img)
                    .map(|size| (*size as f64 * spread) as i128)
            })
            .sum();
        let clamped = sum.clamp(IMAGE_MIN_THRESHOLD, self.max);
        i64::try_from(
            i128::from(MAX_SCORE) * (clamped - IMAGE_MIN_THRESHOLD)
                / (self.max - IMAGE_MIN_THRESHOLD),
        )
        .unwrap_or(0)
    }
}

/// NodeAffinity (preferred terms), raw: the sum of the matching terms' weights.
fn node_affinity(facts: &PodFacts, node: &NodeInfo) -> i64 {
    facts.preferred.score(node.name(), node.labels())
}

/// TaintToleration, raw: how many PreferNoSchedule taints the pod does not tolerate (fewer is
/// better: normalized reversed).
fn taint_toleration(facts: &PodFacts, node: &NodeInfo) -> i64 {
    count_intolerable_prefer_no_schedule(node.taints(), facts.tolerations) as i64
}

/// Upstream `leastRequestedScore`.
fn least_requested(requested: Milli, capacity: Milli) -> i64 {
    if capacity.0 <= 0 || requested > capacity {
        return 0;
    }
    i64::try_from((capacity.0 - requested.0) * i128::from(MAX_SCORE) / capacity.0).unwrap_or(0)
}

fn fraction(requested: Milli, capacity: Milli) -> Option<f64> {
    if capacity.0 <= 0 {
        return None;
    }
    Some((requested.0 as f64 / capacity.0 as f64).min(1.0))
}

/// Upstream's NormalizeScore helper: scale to 0-100 by the maximum, optionally reversed.
fn normalize(scores: &mut [i64], reverse: bool) {
    let max = scores.iter().copied().max().unwrap_or(0);
    if max == 0 {
        if reverse {
            scores.iter_mut().for_each(|s| *s = MAX_SCORE);
        }
        return;
    }
    for s in scores.iter_mut() {
        let v = MAX_SCORE * *s / max;
        *s = if reverse { MAX_SCORE - v } else { v };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalize_scales_by_the_maximum_and_reverses() {
        let mut s = [0, 2, 4];
        normalize(&mut s, false);
        assert_eq!(s, [0, 50, 100]);
        let mut s = [0, 2, 4];
        normalize(&mut s, true);
        assert_eq!(s, [100, 50, 0]);
        // nothing to tell apart: all best when reversed (no intolerable taints anywhere)
        let mut s = [0, 0];
        normalize(&mut s, true);
        assert_eq!(s, [100, 100]);
        let mut s = [0, 0];
        normalize(&mut s, false);
        assert_eq!(s, [0, 0]);
    }

    #[test]
    fn least_requested_is_the_free_share() {
        assert_eq!(least_requested(Milli(250), Milli(1000)), 75);
        assert_eq!(least_requested(Milli(1000), Milli(1000)), 0);
        // over-committed or no capacity: 0
        assert_eq!(least_requested(Milli(1001), Milli(1000)), 0);
        assert_eq!(least_requested(Milli(0), Milli(0)), 0);
    }
}
