//! Privileged: the real backends load their rules into a node namespace, and real packets
//! (busybox wget between namespaces) reach the endpoints the tracers predict.
#![allow(clippy::unwrap_used)]

mod common;

use common::World;

#[test]
#[ignore = "privileged: needs root and network namespaces; run by scripts/test.sh"]
fn the_fixture_routes_pods_and_client() {
    let w = World::new("fx", 2).unwrap();
    assert_eq!(w.get_in_pod(0, "http://10.244.0.12:8080/").unwrap(), "pod1");
    assert_eq!(w.get_in_node("http://10.244.0.11:8080/").unwrap(), "pod0");
    assert_eq!(World::remote_ip(&w.get_in_client("http://10.244.0.11:8080/cgi-bin/ip").unwrap()), common::CLIENT_IP);
}
