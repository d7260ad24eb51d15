//! Node IPAM planning (pure): which subnet of the cluster CIDR a node gets.

use std::collections::BTreeSet;

use ipnet::IpNet;

/// The first subnet of `prefix` bits inside `cluster` that is not in `used`.
pub fn first_free(cluster: IpNet, prefix: u8, used: &BTreeSet<IpNet>) -> Option<IpNet> {
    let subnets = cluster.subnets(prefix).ok()?;
    // bounded: a /8 split into /24s is 65,536 candidates, checked against a set
    subnets.take(1 << 20).find(|s| !used.iter().any(|u| u.contains(&s.network()) || s.contains(&u.network())))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn hands_out_the_first_free_subnet() {
        let cluster: IpNet = "10.244.0.0/16".parse().unwrap();
        let mut used = BTreeSet::new();
        assert_eq!(first_free(cluster, 24, &used).unwrap().to_string(), "10.244.0.0/24");
        used.insert("10.244.0.0/24".parse().unwrap());
        used.insert("10.244.2.0/24".parse().unwrap());
        assert_eq!(first_free(cluster, 24, &used).unwrap().to_string(), "10.244.1.0/24");
        // a larger subnet in use blocks the ones it covers
        used.insert("10.244.0.0/22".parse().unwrap());
        assert_eq!(first_free(cluster, 24, &used).unwrap().to_string(), "10.244.4.0/24");
        let small: IpNet = "10.0.0.0/23".parse().unwrap();
        let full: BTreeSet<IpNet> = ["10.0.0.0/24", "10.0.1.0/24"].iter().map(|s| s.parse().unwrap()).collect();
        assert!(first_free(small, 24, &full).is_none());
    }
}
