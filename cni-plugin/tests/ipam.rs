//! IPAM store: order, wrap-around, idempotency, release, GC, exhaustion, IPv6, concurrency,
//! and host-local's on-disk format.
#![allow(clippy::unwrap_used)]

use std::collections::HashSet;
use std::net::IpAddr;
use std::path::Path;

use ferro_cni::ipam::{Range, RangeSet, Store};

fn range(subnet: &str, start: Option<&str>, end: Option<&str>) -> Range {
    Range::new(
        subnet.parse().unwrap(),
        start.map(|s| s.parse().unwrap()),
        end.map(|s| s.parse().unwrap()),
        None,
    )
    .unwrap()
}

fn store(dir: &Path, sets: Vec<Vec<Range>>) -> Store {
    Store::new(dir, "net1", sets.into_iter().map(RangeSet).collect())
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn ino(p: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(p).unwrap().ino()
}

/// The names in the network's directory with `prefix`.
fn names_with(dir: &Path, prefix: &str) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir.join("net1"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.starts_with(prefix))
        .collect();
    v.sort();
    v
}

fn alloc1(s: &Store, id: &str) -> IpAddr {
    let a = s.allocate(id, "eth0").unwrap();
    assert_eq!(a.len(), 1);
    a[0].ip
}

#[test]
fn allocates_in_order_skipping_gateway_with_prefix_and_gateway() {
    let dir = tempfile::tempdir().unwrap();
    let s = store(dir.path(), vec![vec![range("10.1.0.0/24", None, None)]]);
    let a = s.allocate("c1", "eth0").unwrap();
    assert_eq!(a[0].ip, ip("10.1.0.2")); // .1 is the default gateway
    assert_eq!(a[0].prefix, 24);
    assert_eq!(a[0].gateway, ip("10.1.0.1"));
    assert_eq!(a[0].address().to_string(), "10.1.0.2/24");
    assert_eq!(alloc1(&s, "c2"), ip("10.1.0.3"));
    assert_eq!(alloc1(&s, "c3"), ip("10.1.0.4"));
}

#[test]
fn host_local_disk_format() {
    let dir = tempfile::tempdir().unwrap();
    let s = store(dir.path(), vec![vec![range("10.1.0.0/24", None, None)]]);
    alloc1(&s, "abc123");
    let net = dir.path().join("net1");
    assert_eq!(
        std::fs::read_to_string(net.join("10.1.0.2")).unwrap(),
        "abc123\r\neth0"
    );
    assert_eq!(
        std::fs::read_to_string(net.join("last_reserved_ip.0")).unwrap(),
        "10.1.0.2"
    );
    assert!(net.join("lock").exists());
    let names: HashSet<String> = std::fs::read_dir(&net)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    let want: HashSet<String> = [
        "10.1.0.2",
        ".ref:abc123:eth0:10.1.0.2",
        "last_reserved_ip.0",
        "lock",
    ]
    .map(String::from)
    .into();
    assert_eq!(names, want, "no temp files left behind");
    assert_eq!(ino(&net.join("10.1.0.2")), ino(&net.join(".ref:abc123:eth0:10.1.0.2")));
    // a reservation written by host-local (or with "\n") is recognised
    std::fs::write(net.join("10.1.0.9"), "other\neth1\n").unwrap();
    assert_eq!(s.find("other", "eth1").unwrap(), vec![ip("10.1.0.9")]);
}

#[test]
fn round_robin_after_last_reserved_and_wraps_around() {
    let dir = tempfile::tempdir().unwrap();
    let s = store(
        dir.path(),
        vec![vec![range(
            "10.1.0.0/24",
            Some("10.1.0.10"),
            Some("10.1.0.12"),
        )]],
    );
    assert_eq!(alloc1(&s, "a"), ip("10.1.0.10"));
    assert_eq!(alloc1(&s, "b"), ip("10.1.0.11"));
    s.release("a", "eth0").unwrap();
    // round-robin: continues after the last reserved (.11), not at the freed .10
    assert_eq!(alloc1(&s, "c"), ip("10.1.0.12"));
    // wraps to the start of the range
    assert_eq!(alloc1(&s, "d"), ip("10.1.0.10"));
    // last_reserved_ip outside the ranges (config changed): start at rangeStart
    std::fs::write(dir.path().join("net1/last_reserved_ip.0"), "192.168.9.9").unwrap();
    s.release("b", "eth0").unwrap();
    assert_eq!(alloc1(&s, "e"), ip("10.1.0.11"));
    // the hint is overwritten in place: a longer earlier value leaves no tail behind
    let last = dir.path().join("net1/last_reserved_ip.0");
    assert_eq!(std::fs::read_to_string(&last).unwrap(), "10.1.0.11");
    // a torn or garbage hint only restarts the scan at rangeStart
    std::fs::write(&last, "10.1.0.1garbage-from-a-crash").unwrap();
    s.release("e", "eth0").unwrap();
    assert_eq!(alloc1(&s, "f"), ip("10.1.0.11"));
    assert_eq!(std::fs::read_to_string(&last).unwrap(), "10.1.0.11");
}

#[test]
fn wraps_across_ranges_of_one_set() {
    let dir = tempfile::tempdir().unwrap();
    let s = store(
        dir.path(),
        vec![vec![
            range("10.1.0.0/24", Some("10.1.0.253"), Some("10.1.0.254")),
            range("10.2.0.0/24", Some("10.2.0.5"), Some("10.2.0.5")),
        ]],
    );
    let got: Vec<IpAddr> = ["a", "b", "c"].iter().map(|id| alloc1(&s, id)).collect();
    assert_eq!(
        got,
        vec![ip("10.1.0.253"), ip("10.1.0.254"), ip("10.2.0.5")]
    );
    let a = s.allocate("c", "eth0").unwrap();
    assert_eq!((a[0].prefix, a[0].gateway), (24, ip("10.2.0.1")));
    s.release("a", "eth0").unwrap();
    assert_eq!(alloc1(&s, "d"), ip("10.1.0.253"));
}

#[test]
fn never_network_broadcast_or_gateway() {
    let dir = tempfile::tempdir().unwrap();
    // /30: network .0, gateway .1 (default), .2 usable, broadcast .3
    let s = store(dir.path(), vec![vec![range("10.9.0.0/30", None, None)]]);
    assert_eq!(alloc1(&s, "a"), ip("10.9.0.2"));
    let e = s.allocate("b", "eth0").unwrap_err();
    assert_eq!(e.code(), 100);
    assert!(e.to_string().contains("address range exhausted"), "{e}");
    // an explicit gateway inside rangeStart..rangeEnd is skipped too
    let r = Range::new(
        "10.8.0.0/29".parse().unwrap(),
        Some(ip("10.8.0.1")),
        Some(ip("10.8.0.3")),
        Some(ip("10.8.0.2")),
    )
    .unwrap();
    let s = Store::new(dir.path(), "net2", vec![RangeSet(vec![r])]);
    assert_eq!(alloc1(&s, "a"), ip("10.8.0.1"));
    assert_eq!(alloc1(&s, "b"), ip("10.8.0.3"));
    assert_eq!(s.allocate("c", "eth0").unwrap_err().code(), 100);
}

#[test]
fn re_add_is_idempotent_per_container_and_ifname() {
    let dir = tempfile::tempdir().unwrap();
    let s = store(dir.path(), vec![vec![range("10.1.0.0/24", None, None)]]);
    let first = s.allocate("c1", "eth0").unwrap();
    assert_eq!(s.allocate("c1", "eth0").unwrap(), first);
    // another interface of the same container gets its own address
    assert_ne!(s.allocate("c1", "net1").unwrap()[0].ip, first[0].ip);
    // the same id on a fresh handle (new process) finds it too
    let s2 = store(dir.path(), vec![vec![range("10.1.0.0/24", None, None)]]);
    assert_eq!(s2.allocate("c1", "eth0").unwrap(), first);
}

#[test]
fn release_is_idempotent_and_only_frees_the_owner() {
    let dir = tempfile::tempdir().unwrap();
    let s = store(
        dir.path(),
        vec![
            vec![range("10.1.0.0/24", None, None)],
            vec![range("fd00::/120", None, None)],
        ],
    );
    // release before anything exists
    assert!(s.release("x", "eth0").unwrap().is_empty());
    let a = s.allocate("c1", "eth0").unwrap();
    assert_eq!(a.len(), 2);
    alloc_two(&s, "c2");
    let mut freed = s.release("c1", "eth0").unwrap();
    freed.sort();
    assert_eq!(freed, vec![a[0].ip, a[1].ip]);
    assert!(s.release("c1", "eth0").unwrap().is_empty());
    assert_eq!(s.find("c2", "eth0").unwrap().len(), 2);
    assert!(s.find("c1", "eth0").unwrap().is_empty());
}

fn alloc_two(s: &Store, id: &str) {
    assert_eq!(s.allocate(id, "eth0").unwrap().len(), 2);
}

#[test]
fn gc_releases_everything_not_valid() {
    let dir = tempfile::tempdir().unwrap();
    let s = store(dir.path(), vec![vec![range("10.1.0.0/24", None, None)]]);
    let keep = alloc1(&s, "keep");
    let gone = alloc1(&s, "gone");
    let other_if = s.allocate("keep", "eth1").unwrap()[0].ip;
    let freed = Store::new(dir.path(), "net1", Vec::new())
        .gc(&[("keep".to_string(), "eth0".to_string())])
        .unwrap();
    let freed: HashSet<IpAddr> = freed.into_iter().collect();
    assert_eq!(freed, HashSet::from([gone, other_if]));
    assert_eq!(s.find("keep", "eth0").unwrap(), vec![keep]);
    // GC of a network never used is a no-op
    assert!(Store::new(dir.path(), "unused", Vec::new())
        .gc(&[])
        .unwrap()
        .is_empty());
}

#[test]
fn exhaustion_of_a_later_set_rolls_back_earlier_sets() {
    let dir = tempfile::tempdir().unwrap();
    let s = store(
        dir.path(),
        vec![
            vec![range("10.1.0.0/24", None, None)],
            vec![range("10.2.0.0/24", Some("10.2.0.7"), Some("10.2.0.7"))],
        ],
    );
    s.allocate("a", "eth0").unwrap();
    let e = s.allocate("b", "eth0").unwrap_err();
    assert_eq!(e.code(), 100);
    assert!(s.find("b", "eth0").unwrap().is_empty(), "no address leaked");
    s.release("a", "eth0").unwrap();
    let b = s.allocate("b", "eth0").unwrap();
    assert_eq!(b[1].ip, ip("10.2.0.7"));
}

#[test]
fn ipv6_range() {
    let dir = tempfile::tempdir().unwrap();
    let s = store(
        dir.path(),
        vec![vec![range(
            "fd00:10::/64",
            Some("fd00:10::ffff:fffe"),
            None,
        )]],
    );
    let a = s.allocate("a", "eth0").unwrap();
    assert_eq!(a[0].ip, ip("fd00:10::ffff:fffe"));
    assert_eq!(a[0].prefix, 64);
    assert_eq!(a[0].gateway, ip("fd00:10::1"));
    assert_eq!(alloc1(&s, "b"), ip("fd00:10::ffff:ffff"));
    assert!(dir.path().join("net1/fd00:10::ffff:ffff").exists());
    // small v6 range exhausts and wraps
    let s = Store::new(
        dir.path(),
        "v6small",
        vec![RangeSet(vec![range("fd00:20::/126", None, None)])],
    );
    // ::0 network (skipped), ::1 gateway, ::2, ::3 (IPv6 has no broadcast; host-local uses it)
    assert_eq!(alloc1(&s, "a"), ip("fd00:20::2"));
    assert_eq!(alloc1(&s, "b"), ip("fd00:20::3"));
    assert_eq!(s.allocate("c", "eth0").unwrap_err().code(), 100);
    s.release("a", "eth0").unwrap();
    assert_eq!(alloc1(&s, "c"), ip("fd00:20::2"));
}

#[test]
fn concurrent_handles_never_share_an_address() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    let threads: Vec<_> = (0..50)
        .map(|i| {
            let path = path.clone();
            std::thread::spawn(move || {
                let s = store(
                    &path,
                    vec![
                        vec![range("10.5.0.0/24", None, None)],
                        vec![range("fd00:5::/64", None, None)],
                    ],
                );
                s.allocate(&format!("ctr-{i}"), "eth0").unwrap()
            })
        })
        .collect();
    let all: Vec<IpAddr> = threads
        .into_iter()
        .flat_map(|t| t.join().unwrap())
        .map(|a| a.ip)
        .collect();
    assert_eq!(all.len(), 100);
    let unique: HashSet<IpAddr> = all.iter().copied().collect();
    assert_eq!(unique.len(), 100);
    let v4: HashSet<IpAddr> = all.iter().copied().filter(IpAddr::is_ipv4).collect();
    let want: HashSet<IpAddr> = (2..52).map(|i| ip(&format!("10.5.0.{i}"))).collect();
    assert_eq!(v4, want, "50 allocations fill .2-.51 with no gaps");
}

#[test]
fn a_released_reservation_file_is_reused_by_the_next_one() {
    let dir = tempfile::tempdir().unwrap();
    let s = store(dir.path(), vec![vec![range("10.1.0.0/24", None, None)]]);
    let net = dir.path().join("net1");
    let a = alloc1(&s, "a");
    let a_ino = ino(&net.join(a.to_string()));
    assert_eq!(s.release("a", "eth0").unwrap(), vec![a]);
    assert!(!net.join(a.to_string()).exists());
    assert_eq!(names_with(dir.path(), ".ref:"), Vec::<String>::new());
    assert_eq!(names_with(dir.path(), ".free:"), vec![format!(".free:{a_ino}")]);
    // the released file is not a reservation of anyone
    assert!(s.find("a", "eth0").unwrap().is_empty());

    let b = alloc1(&s, "a-much-longer-container-id-than-before");
    assert_ne!(a, b);
    assert_eq!(ino(&net.join(b.to_string())), a_ino, "same file, renamed");
    assert_eq!(
        std::fs::read_to_string(net.join(b.to_string())).unwrap(),
        "a-much-longer-container-id-than-before\r\neth0"
    );
    let c = alloc1(&s, "c");
    assert_eq!(
        std::fs::read_to_string(net.join(c.to_string())).unwrap(),
        "c\r\neth0",
        "a new file when none is free"
    );
    assert!(names_with(dir.path(), ".free:").is_empty());
    // shorter content over a longer one leaves nothing of the old
    s.release("a-much-longer-container-id-than-before", "eth0")
        .unwrap();
    let d = alloc1(&s, "d");
    assert_eq!(std::fs::read_to_string(net.join(d.to_string())).unwrap(), "d\r\neth0");
}

#[test]
fn released_files_are_kept_up_to_a_limit() {
    let dir = tempfile::tempdir().unwrap();
    let s = store(dir.path(), vec![vec![range("10.1.0.0/16", None, None)]]);
    let n = ferro_cni::ipam::FREE_MAX + 5;
    for i in 0..n {
        alloc1(&s, &format!("c{i}"));
    }
    for i in 0..n {
        assert_eq!(s.release(&format!("c{i}"), "eth0").unwrap().len(), 1);
    }
    assert_eq!(names_with(dir.path(), ".free:").len(), ferro_cni::ipam::FREE_MAX);
    assert!(names_with(dir.path(), ".ref:").is_empty());
    assert!(names_with(dir.path(), "10.").is_empty());
}

#[test]
fn reservations_without_a_valid_reference_are_read_from_their_content() {
    let dir = tempfile::tempdir().unwrap();
    let s = store(dir.path(), vec![vec![range("10.1.0.0/24", None, None)]]);
    let net = dir.path().join("net1");
    alloc1(&s, "first"); // creates the directory
    // host-local's file: no reference
    std::fs::write(net.join("10.1.0.20"), "hl\r\neth0").unwrap();
    // a reference left by a crash before its address was linked
    std::fs::write(net.join(".ref:ghost:eth0:10.1.0.21"), "ghost\r\neth0").unwrap();
    // a stale reference whose address now is another owner's file
    std::fs::write(net.join(".ref:old:eth0:10.1.0.22"), "old\r\neth0").unwrap();
    std::fs::write(net.join("10.1.0.22"), "new\r\neth0").unwrap();
    // a temp file a crash left
    std::fs::write(net.join(".tmp-1-0"), "x").unwrap();

    assert_eq!(s.find("hl", "eth0").unwrap(), vec![ip("10.1.0.20")]);
    assert!(s.find("ghost", "eth0").unwrap().is_empty());
    assert!(s.find("old", "eth0").unwrap().is_empty());
    assert_eq!(s.find("new", "eth0").unwrap(), vec![ip("10.1.0.22")]);
    // an ADD of "old" gets a fresh address, not the one its stale reference names
    let old = alloc1(&s, "old");
    assert_ne!(old, ip("10.1.0.22"));
    assert_eq!(s.find("old", "eth0").unwrap(), vec![old]);

    assert_eq!(s.release("hl", "eth0").unwrap(), vec![ip("10.1.0.20")]);
    assert_eq!(s.release("new", "eth0").unwrap(), vec![ip("10.1.0.22")]);
    assert_eq!(
        std::fs::read_to_string(net.join("10.1.0.21")).ok(),
        None,
        "a stale reference reserves nothing"
    );
    // the stale and temp files were reused by the next reservations, none is left
    for id in ["r1", "r2", "r3"] {
        alloc1(&s, id);
    }
    assert!(names_with(dir.path(), ".tmp-").is_empty());
    assert_eq!(
        names_with(dir.path(), ".ref:"),
        [
            ".ref:first:eth0:10.1.0.2",
            ".ref:old:eth0:10.1.0.3",
            ".ref:r1:eth0:10.1.0.4",
            ".ref:r2:eth0:10.1.0.5",
            ".ref:r3:eth0:10.1.0.6",
        ]
    );
}

#[test]
fn owners_whose_names_cannot_be_a_reference_get_a_plain_reservation() {
    let dir = tempfile::tempdir().unwrap();
    let s = store(dir.path(), vec![vec![range("10.1.0.0/24", None, None)]]);
    let long = "x".repeat(250);
    let a = alloc1(&s, &long);
    let b = s.allocate("with:colon", "eth0").unwrap()[0].ip;
    assert!(names_with(dir.path(), ".ref:").is_empty());
    assert_eq!(s.find(&long, "eth0").unwrap(), vec![a]);
    assert_eq!(s.find("with:colon", "eth0").unwrap(), vec![b]);
    assert_eq!(s.release(&long, "eth0").unwrap(), vec![a]);
    assert_eq!(s.release("with:colon", "eth0").unwrap(), vec![b]);
    assert!(names_with(dir.path(), ".").is_empty(), "no temp file left");
}
