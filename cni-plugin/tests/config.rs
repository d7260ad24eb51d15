//! Config parsing and validation.
#![allow(clippy::unwrap_used)]

use ferro_cni::config::{parse_subnet_env, IpamConf, NetConf};
use ferro_cni::CniError;
use serde_json::{json, Value};

/// A conflist's plugin entry as containerd/libcni hands it to the plugin: the list's
/// cniVersion and name injected, runtimeConfig from capabilities, no prevResult on ADD.
fn containerd_1_0() -> Value {
    json!({
        "cniVersion": "1.0.0",
        "name": "ferro",
        "type": "ferro",
        "bridge": "ferro0",
        "isGateway": true,
        "isDefaultGateway": true,
        "ipMasq": true,
        "mtu": 1450,
        "hairpinMode": true,
        "capabilities": {"portMappings": true},
        "runtimeConfig": {"portMappings": [{"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}]},
        "ipam": {
            "type": "ferro",
            "ranges": [
                [{"subnet": "10.244.1.0/24", "rangeStart": "10.244.1.10", "rangeEnd": "10.244.1.250", "gateway": "10.244.1.1"}],
                [{"subnet": "fd00:10:244:1::/64"}]
            ],
            "routes": [{"dst": "0.0.0.0/0"}, {"dst": "::/0"}],
            "dataDir": "/var/lib/cni/networks"
        }
    })
}

fn parse(v: &Value) -> NetConf {
    NetConf::parse(v.to_string().as_bytes()).unwrap()
}

fn err_of(v: &Value) -> CniError {
    match NetConf::parse(v.to_string().as_bytes()) {
        Ok(c) => c.validate().unwrap_err(),
        Err(e) => e,
    }
}

fn with(mut v: Value, path: &[&str], val: Value) -> Value {
    let mut cur = &mut v;
    for p in &path[..path.len() - 1] {
        cur = if let Ok(i) = p.parse::<usize>() {
            &mut cur[i]
        } else {
            &mut cur[*p]
        };
    }
    let last = path[path.len() - 1];
    if val.is_null() {
        cur.as_object_mut().unwrap().remove(last);
    } else if let Ok(i) = last.parse::<usize>() {
        let arr = cur.as_array_mut().unwrap();
        if i == arr.len() {
            arr.push(val);
        } else {
            arr[i] = val;
        }
    } else {
        cur[last] = val;
    }
    v
}

#[test]
fn containerd_1_0_0_config_parses_and_validates() {
    let c = parse(&containerd_1_0());
    c.validate().unwrap();
    assert_eq!(c.name, "ferro");
    assert!(c.is_gateway && c.is_default_gateway && c.ip_masq && c.hairpin_mode);
    assert!(!c.promisc_mode);
    assert_eq!(c.mtu, Some(1450));
    assert!(c.prev_result.is_none());
    assert!(c.runtime_config.is_some());
    assert!(c.extra.contains_key("capabilities"));
    let Some(IpamConf::Builtin(b)) = &c.ipam else {
        panic!("builtin ipam")
    };
    assert_eq!(b.ranges.len(), 2);
    let sets = c.range_sets().unwrap().unwrap();
    assert_eq!(sets[0].0[0].start.to_string(), "10.244.1.10");
    assert_eq!(sets[1].0[0].gateway.to_string(), "fd00:10:244:1::1");
}

#[test]
fn legacy_0_4_0_config_with_prev_result_and_defaults() {
    let v = json!({
        "cniVersion": "0.4.0",
        "name": "k8s-pod-network",
        "type": "ferro",
        "podCIDR": "10.88.0.0/16",
        "args": {"cni": {"labels": []}},
        "prevResult": {"cniVersion": "0.4.0", "ips": [{"version": "4", "address": "10.88.0.5/16"}]}
    });
    let c = parse(&v);
    c.validate().unwrap();
    assert_eq!(c.bridge, "ferro0");
    assert_eq!(c.subnet_file.to_str(), Some("/run/ferro/netd/subnet.env"));
    assert_eq!(c.data_dir().to_str(), Some("/var/lib/cni/networks"));
    assert!(c.prev_result.is_some());
    let sets = c.range_sets().unwrap().unwrap();
    assert_eq!(sets.len(), 1);
    assert_eq!(sets[0].0[0].end.to_string(), "10.88.255.254");
}

#[test]
fn pod_cidr_node_reads_subnet_file() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("subnet.env");
    std::fs::write(
        &file,
        "# by ferro-netd\nFERRO_SUBNET=10.244.3.0/24,fd00:3::/64\nFERRO_MTU=1450\n",
    )
    .unwrap();
    let v = json!({"cniVersion": "1.1.0", "name": "n", "type": "ferro", "podCIDR": "node",
                   "subnetFile": file.to_str().unwrap()});
    let c = parse(&v);
    c.validate().unwrap();
    let sets = c.range_sets().unwrap().unwrap();
    assert_eq!(sets.len(), 2);
    assert_eq!(sets[0].0[0].subnet.to_string(), "10.244.3.0/24");
    assert_eq!(sets[1].0[0].subnet.to_string(), "fd00:3::/64");
    // missing file: an I/O error, not a panic
    std::fs::remove_file(&file).unwrap();
    assert_eq!(c.range_sets().unwrap_err().code(), 5);
    assert_eq!(parse_subnet_env("OTHER=1").unwrap_err().code(), 7);
}

#[test]
fn delegated_ipam_keeps_raw_json() {
    let ipam = json!({"type": "host-local", "ranges": [[{"subnet": "10.1.0.0/16"}]], "custom": 1});
    let c = parse(&with(containerd_1_0(), &["ipam"], ipam.clone()));
    c.validate().unwrap();
    match &c.ipam {
        Some(IpamConf::Delegate { plugin_type, raw }) => {
            assert_eq!(plugin_type, "host-local");
            assert_eq!(raw, &ipam);
        }
        other => panic!("{other:?}"),
    }
    assert!(c.range_sets().unwrap().is_none());
}

#[test]
fn decode_errors_are_code_6() {
    assert_eq!(NetConf::parse(b"{not json").unwrap_err().code(), 6);
    assert_eq!(NetConf::parse(b"{\"name\":\"x\"}").unwrap_err().code(), 6); // no cniVersion
    let typo = with(
        containerd_1_0(),
        &["ipam", "ranges", "0", "0", "rangestart"],
        json!("10.244.1.5"),
    );
    assert_eq!(
        NetConf::parse(typo.to_string().as_bytes())
            .unwrap_err()
            .code(),
        6
    );
    let mtu = with(containerd_1_0(), &["mtu"], json!("big"));
    assert_eq!(
        NetConf::parse(mtu.to_string().as_bytes())
            .unwrap_err()
            .code(),
        6
    );
}

#[test]
fn validation_errors() {
    let base = containerd_1_0;
    let r00 = ["ipam", "ranges", "0", "0"];
    let field = |f: &str| {
        let mut p: Vec<&str> = r00.to_vec();
        p.push(Box::leak(f.to_string().into_boxed_str()));
        p
    };
    let cases: Vec<(Value, u32, &str)> = vec![
        (
            with(base(), &["cniVersion"], json!("0.3.1")),
            1,
            "incompatible cni version",
        ),
        (
            with(base(), &["cniVersion"], json!("2.0.0")),
            1,
            "incompatible cni version",
        ),
        (
            with(base(), &["name"], Value::Null),
            7,
            "missing network name",
        ),
        (with(base(), &["name"], json!("../etc")), 7, "must match"),
        (with(base(), &["type"], json!("bridge")), 7, "plugin type"),
        (
            with(base(), &["bridge"], json!("a-very-long-bridge-name")),
            7,
            "bridge name",
        ),
        (with(base(), &["mtu"], json!(10)), 7, "mtu 10"),
        (
            with(base(), &["isGateway"], json!(false)),
            7,
            "isDefaultGateway requires isGateway",
        ),
        (with(base(), &["ipam"], Value::Null), 7, "missing ipam"),
        (
            with(base(), &["ipam", "ranges"], json!([])),
            7,
            "ipam.ranges is empty",
        ),
        (
            with(base(), &["ipam", "ranges", "1"], json!([])),
            7,
            "empty range set",
        ),
        (
            with(base(), &["podCIDR"], json!("10.0.0.0/16")),
            7,
            "not both",
        ),
        (
            with(base(), &field("subnet"), json!("10.244.1.0/33")),
            7,
            "bad subnet",
        ),
        (
            with(base(), &field("subnet"), json!("banana")),
            7,
            "bad subnet",
        ),
        (
            with(base(), &field("subnet"), json!("10.244.1.0/31")),
            7,
            "too small",
        ),
        (
            with(base(), &field("rangeStart"), json!("10.244.2.10")),
            7,
            "rangeStart: 10.244.2.10 is outside subnet",
        ),
        (
            with(base(), &field("rangeEnd"), json!("10.245.0.1")),
            7,
            "rangeEnd: 10.245.0.1 is outside subnet",
        ),
        (
            with(base(), &field("rangeEnd"), json!("10.244.1.255")),
            7,
            "broadcast address",
        ),
        (
            with(base(), &field("rangeStart"), json!("10.244.1.0")),
            7,
            "network address",
        ),
        (
            with(base(), &field("rangeStart"), json!("nope")),
            7,
            "not an IP address",
        ),
        (
            with(
                with(base(), &field("rangeStart"), json!("10.244.1.200")),
                &field("rangeEnd"),
                json!("10.244.1.100"),
            ),
            7,
            "after rangeEnd",
        ),
        (
            with(base(), &field("gateway"), json!("192.168.0.1")),
            7,
            "gateway: 192.168.0.1 is outside subnet",
        ),
        (
            with(base(), &["ipam", "routes", "0", "dst"], json!("default")),
            7,
            "ipam.routes[0].dst",
        ),
        (
            with(
                base(),
                &["ipam", "ranges", "0", "1"],
                json!({"subnet": "10.244.1.0/24", "rangeStart": "10.244.1.100", "rangeEnd": "10.244.1.120"}),
            ),
            7,
            "ranges overlap: ipam.ranges[0][0]",
        ),
        (
            with(
                base(),
                &["ipam", "ranges", "0", "1"],
                json!({"subnet": "fd00::/64"}),
            ),
            7,
            "mixes IPv4 and IPv6",
        ),
        (
            with(
                base(),
                &["ipam", "ranges", "1", "0"],
                json!({"subnet": "10.244.0.0/16"}),
            ),
            7,
            "ranges overlap: ipam.ranges[0][0] (10.244.1.10-10.244.1.250) and ipam.ranges[1][0]",
        ),
        (
            with(base(), &["ipam"], json!({"type": "host-local"}))
                .as_object()
                .cloned()
                .map(|mut o| {
                    o.insert("podCIDR".into(), json!("10.0.0.0/16"));
                    Value::Object(o)
                })
                .unwrap(),
            7,
            "podCIDR only applies",
        ),
    ];
    for (v, code, msg) in cases {
        let e = err_of(&v);
        assert_eq!(e.code(), code, "{e} for {v}");
        assert!(
            e.to_string().contains(msg),
            "{e:?} does not mention {msg:?}"
        );
    }
    // disjoint ranges in one set are fine
    let ok = with(
        base(),
        &["ipam", "ranges", "0", "1"],
        json!({"subnet": "10.244.9.0/24"}),
    );
    parse(&ok).validate().unwrap();
}
