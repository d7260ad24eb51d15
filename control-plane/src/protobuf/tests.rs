//! Typed k8s-pb objects encoded with prost, decoded here and compared with hand-built
//! k8s-openapi values.

use std::collections::BTreeMap;

use k8s_openapi::api::{apps, core, policy};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1 as meta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use k8s_pb::api::apps::v1 as pb_apps;
use k8s_pb::api::core::v1 as pb;
use k8s_pb::api::policy::v1 as pb_policy;
use k8s_pb::apimachinery::pkg::api::resource::Quantity as PbQuantity;
use k8s_pb::apimachinery::pkg::apis::meta::v1 as pb_meta;
use k8s_pb::apimachinery::pkg::runtime::{TypeMeta, Unknown};
use k8s_pb::apimachinery::pkg::util::intstr::IntOrString as PbIntOrString;
use prost::Message as _;
use serde_json::{json, Value};

use super::*;

fn s(v: &str) -> Option<String> {
    Some(v.to_string())
}

fn envelope(api_version: &str, kind: &str, raw: Vec<u8>) -> Vec<u8> {
    let u = Unknown {
        type_meta: Some(TypeMeta { api_version: s(api_version), kind: s(kind) }),
        raw: Some(raw),
        content_encoding: s(""),
        content_type: s(""),
    };
    let mut body = MAGIC.to_vec();
    body.extend(u.encode_to_vec());
    body
}

fn decode<T: serde::de::DeserializeOwned>(api_version: &str, kind: &str, msg: &impl prost::Message) -> (Value, T) {
    let v = decode_body(&envelope(api_version, kind, msg.encode_to_vec())).unwrap();
    let typed = serde_json::from_value(v.clone()).unwrap();
    (v, typed)
}

fn quantities(kv: &[(&str, &str)]) -> BTreeMap<String, PbQuantity> {
    kv.iter().map(|(k, v)| (k.to_string(), PbQuantity { string: s(v) })).collect()
}

fn int_str(i: i32) -> Option<PbIntOrString> {
    Some(PbIntOrString { r#type: Some(0), int_val: Some(i), str_val: None })
}

fn str_int(v: &str) -> Option<PbIntOrString> {
    Some(PbIntOrString { r#type: Some(1), int_val: None, str_val: s(v) })
}

#[test]
fn pod() {
    let labels: BTreeMap<String, String> = [("app".to_string(), "web".to_string())].into();
    let pod = pb::Pod {
        metadata: Some(pb_meta::ObjectMeta {
            name: s("web"),
            namespace: s("default"),
            labels: labels.clone(),
            creation_timestamp: Some(pb_meta::Time { seconds: Some(1_700_000_000), nanos: Some(0) }),
            ..Default::default()
        }),
        spec: Some(pb::PodSpec {
            containers: vec![pb::Container {
                name: s("c"),
                image: s("nginx:1.21"),
                ports: vec![pb::ContainerPort { name: s("http"), container_port: Some(80), protocol: s("TCP"), ..Default::default() }],
                resources: Some(pb::ResourceRequirements {
                    limits: quantities(&[("cpu", "500m")]),
                    requests: quantities(&[("memory", "64Mi")]),
                    ..Default::default()
                }),
                env: vec![pb::EnvVar { name: s("X"), value: s("1"), value_from: None }],
                readiness_probe: Some(pb::Probe {
                    handler: Some(pb::ProbeHandler {
                        http_get: Some(pb::HttpGetAction { path: s("/"), port: str_int("http"), ..Default::default() }),
                        ..Default::default()
                    }),
                    period_seconds: Some(5),
                    ..Default::default()
                }),
                liveness_probe: Some(pb::Probe {
                    handler: Some(pb::ProbeHandler {
                        tcp_socket: Some(pb::TcpSocketAction { port: int_str(8080), host: None }),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }],
            tolerations: vec![pb::Toleration {
                key: s("node.kubernetes.io/unreachable"),
                operator: s("Exists"),
                effect: s("NoExecute"),
                toleration_seconds: Some(300),
                ..Default::default()
            }],
            ..Default::default()
        }),
        status: Some(pb::PodStatus {
            host_ip: s("10.0.0.1"),
            pod_ips: vec![pb::PodIp { ip: s("10.1.0.5") }],
            ..Default::default()
        }),
    };
    let (v, typed): (Value, core::v1::Pod) = decode("v1", "Pod", &pod);
    assert_eq!(v["metadata"]["creationTimestamp"], "2023-11-14T22:13:20Z");
    assert_eq!(v["spec"]["containers"][0]["readinessProbe"]["httpGet"]["port"], "http");
    assert_eq!(v["spec"]["containers"][0]["livenessProbe"]["tcpSocket"]["port"], 8080);
    let expected = core::v1::Pod {
        metadata: meta::ObjectMeta {
            name: s("web"),
            namespace: s("default"),
            labels: Some(labels),
            creation_timestamp: Some(meta::Time("2023-11-14T22:13:20Z".parse().unwrap())),
            ..Default::default()
        },
        spec: Some(core::v1::PodSpec {
            containers: vec![core::v1::Container {
                name: "c".into(),
                image: s("nginx:1.21"),
                ports: Some(vec![core::v1::ContainerPort {
                    name: s("http"),
                    container_port: 80,
                    protocol: s("TCP"),
                    ..Default::default()
                }]),
                resources: Some(core::v1::ResourceRequirements {
                    limits: Some([("cpu".to_string(), Quantity("500m".into()))].into()),
                    requests: Some([("memory".to_string(), Quantity("64Mi".into()))].into()),
                    ..Default::default()
                }),
                env: Some(vec![core::v1::EnvVar { name: "X".into(), value: s("1"), value_from: None }]),
                readiness_probe: Some(core::v1::Probe {
                    http_get: Some(core::v1::HTTPGetAction {
                        path: s("/"),
                        port: IntOrString::String("http".into()),
                        ..Default::default()
                    }),
                    period_seconds: Some(5),
                    ..Default::default()
                }),
                liveness_probe: Some(core::v1::Probe {
                    tcp_socket: Some(core::v1::TCPSocketAction { port: IntOrString::Int(8080), host: None }),
                    ..Default::default()
                }),
                ..Default::default()
            }],
            tolerations: Some(vec![core::v1::Toleration {
                key: s("node.kubernetes.io/unreachable"),
                operator: s("Exists"),
                effect: s("NoExecute"),
                toleration_seconds: Some(300),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        status: Some(core::v1::PodStatus {
            host_ip: s("10.0.0.1"),
            pod_ips: Some(vec![core::v1::PodIP { ip: "10.1.0.5".into() }]),
            ..Default::default()
        }),
    };
    assert_eq!(typed, expected);
}

#[test]
fn secret_bytes_are_base64() {
    let secret = pb::Secret {
        metadata: Some(pb_meta::ObjectMeta { name: s("s1"), ..Default::default() }),
        data: [("k".to_string(), b"v\x00\xff".to_vec())].into(),
        r#type: s("Opaque"),
        ..Default::default()
    };
    let (v, typed): (Value, core::v1::Secret) = decode("v1", "Secret", &secret);
    assert_eq!(v["data"], json!({"k": "dgD/"}));
    let expected = core::v1::Secret {
        metadata: meta::ObjectMeta { name: s("s1"), ..Default::default() },
        data: Some([("k".to_string(), k8s_openapi::ByteString(b"v\x00\xff".to_vec()))].into()),
        type_: s("Opaque"),
        ..Default::default()
    };
    assert_eq!(typed, expected);
}

#[test]
fn deployment_int_or_string_and_zero() {
    let labels: BTreeMap<String, String> = [("app".to_string(), "web".to_string())].into();
    let d = pb_apps::Deployment {
        metadata: Some(pb_meta::ObjectMeta { name: s("web"), ..Default::default() }),
        spec: Some(pb_apps::DeploymentSpec {
            replicas: Some(3),
            selector: Some(pb_meta::LabelSelector { match_labels: labels.clone(), match_expressions: vec![] }),
            template: Some(pb::PodTemplateSpec {
                metadata: Some(pb_meta::ObjectMeta { labels: labels.clone(), ..Default::default() }),
                spec: Some(pb::PodSpec {
                    containers: vec![pb::Container { name: s("nginx"), image: s("nginx:1.21"), ..Default::default() }],
                    ..Default::default()
                }),
            }),
            strategy: Some(pb_apps::DeploymentStrategy {
                r#type: s("RollingUpdate"),
                rolling_update: Some(pb_apps::RollingUpdateDeployment { max_unavailable: int_str(0), max_surge: str_int("25%") }),
            }),
            ..Default::default()
        }),
        status: Some(pb_apps::DeploymentStatus::default()),
    };
    let (v, typed): (Value, apps::v1::Deployment) = decode("apps/v1", "Deployment", &d);
    assert_eq!(v["spec"]["strategy"]["rollingUpdate"], json!({"maxUnavailable": 0, "maxSurge": "25%"}));
    // proto2: a present empty message is {}
    assert_eq!(v["status"], json!({}));
    let expected = apps::v1::Deployment {
        metadata: meta::ObjectMeta { name: s("web"), ..Default::default() },
        spec: Some(apps::v1::DeploymentSpec {
            replicas: Some(3),
            // an empty repeated field is absent on the wire: None
            selector: meta::LabelSelector { match_labels: Some(labels.clone()), match_expressions: None },
            template: core::v1::PodTemplateSpec {
                metadata: Some(meta::ObjectMeta { labels: Some(labels), ..Default::default() }),
                spec: Some(core::v1::PodSpec {
                    containers: vec![core::v1::Container { name: "nginx".into(), image: s("nginx:1.21"), ..Default::default() }],
                    ..Default::default()
                }),
            },
            strategy: Some(apps::v1::DeploymentStrategy {
                type_: s("RollingUpdate"),
                rolling_update: Some(apps::v1::RollingUpdateDeployment {
                    max_unavailable: Some(IntOrString::Int(0)),
                    max_surge: Some(IntOrString::String("25%".into())),
                }),
            }),
            ..Default::default()
        }),
        status: Some(Default::default()),
    };
    assert_eq!(typed, expected);
}

#[test]
fn eviction_with_delete_options() {
    let e = pb_policy::Eviction {
        metadata: Some(pb_meta::ObjectMeta { name: s("web"), namespace: s("default"), ..Default::default() }),
        delete_options: Some(pb_meta::DeleteOptions {
            grace_period_seconds: Some(0),
            preconditions: Some(pb_meta::Preconditions { uid: s("u-1"), resource_version: None }),
            dry_run: vec!["All".into()],
            ..Default::default()
        }),
    };
    let (v, typed): (Value, policy::v1::Eviction) = decode("policy/v1", "Eviction", &e);
    assert_eq!(v["deleteOptions"]["gracePeriodSeconds"], 0);
    let expected = policy::v1::Eviction {
        metadata: meta::ObjectMeta { name: s("web"), namespace: s("default"), ..Default::default() },
        delete_options: Some(meta::DeleteOptions {
            grace_period_seconds: Some(0),
            preconditions: Some(meta::Preconditions { uid: s("u-1"), resource_version: None }),
            dry_run: Some(vec!["All".into()]),
            ..Default::default()
        }),
    };
    assert_eq!(typed, expected);
    // DeleteOptions alone (a DELETE body) is accepted under any group version
    let d = pb_meta::DeleteOptions { propagation_policy: s("Foreground"), ..Default::default() };
    let v = decode_body(&envelope("apps/v1", "DeleteOptions", d.encode_to_vec())).unwrap();
    assert_eq!(v, json!({"apiVersion": "apps/v1", "kind": "DeleteOptions", "propagationPolicy": "Foreground"}));
}

#[test]
fn service_ip_families_and_target_port() {
    let svc = pb::Service {
        metadata: Some(pb_meta::ObjectMeta { name: s("s"), ..Default::default() }),
        spec: Some(pb::ServiceSpec {
            r#type: s("ClusterIP"),
            ip_families: vec!["IPv4".into()],
            ip_family_policy: s("SingleStack"),
            ports: vec![pb::ServicePort {
                name: s("80-8080"),
                protocol: s("TCP"),
                port: Some(80),
                target_port: int_str(8080),
                ..Default::default()
            }],
            selector: [("app".to_string(), "s".to_string())].into(),
            ..Default::default()
        }),
        status: None,
    };
    let (v, typed): (Value, core::v1::Service) = decode("v1", "Service", &svc);
    assert_eq!(v["spec"]["ipFamilies"], json!(["IPv4"]));
    let expected = core::v1::Service {
        metadata: meta::ObjectMeta { name: s("s"), ..Default::default() },
        spec: Some(core::v1::ServiceSpec {
            type_: s("ClusterIP"),
            ip_families: Some(vec!["IPv4".into()]),
            ip_family_policy: s("SingleStack"),
            ports: Some(vec![core::v1::ServicePort {
                name: s("80-8080"),
                protocol: s("TCP"),
                port: 80,
                target_port: Some(IntOrString::Int(8080)),
                ..Default::default()
            }]),
            selector: Some([("app".to_string(), "s".to_string())].into()),
            ..Default::default()
        }),
        status: None,
    };
    assert_eq!(typed, expected);
}

#[test]
fn zero_values_present_on_the_wire() {
    // Zero numbers and booleans on the wire come through (proto2: Go sends pointer fields only
    // when set); empty optional strings are Go's unset non-pointer strings.
    let cm = pb::ConfigMap {
        metadata: Some(pb_meta::ObjectMeta {
            name: s("c1"),
            generate_name: s(""),
            resource_version: s(""),
            generation: Some(0),
            creation_timestamp: Some(pb_meta::Time::default()), // zero time: empty message
            ..Default::default()
        }),
        data: [("a".to_string(), String::new())].into(),
        immutable: Some(false),
        ..Default::default()
    };
    let v = decode_body(&envelope("v1", "ConfigMap", cm.encode_to_vec())).unwrap();
    assert_eq!(
        v,
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c1", "generation": 0},
               "data": {"a": ""}, "immutable": false})
    );
    // "" storage class (no dynamic provisioning) is a Go *string and is kept
    let pvc = pb::PersistentVolumeClaim {
        metadata: Some(pb_meta::ObjectMeta { name: s("c"), namespace: s(""), ..Default::default() }),
        spec: Some(pb::PersistentVolumeClaimSpec {
            storage_class_name: s(""),
            volume_name: s(""),
            access_modes: vec!["ReadWriteOnce".into()],
            ..Default::default()
        }),
        status: None,
    };
    let v = decode_body(&envelope("v1", "PersistentVolumeClaim", pvc.encode_to_vec())).unwrap();
    assert_eq!(v["metadata"], json!({"name": "c"}));
    assert_eq!(v["spec"], json!({"storageClassName": "", "accessModes": ["ReadWriteOnce"]}));
}

#[test]
fn micro_time() {
    let ev = pb::Event {
        metadata: Some(pb_meta::ObjectMeta { name: s("e"), ..Default::default() }),
        event_time: Some(pb_meta::MicroTime { seconds: Some(1_700_000_000), nanos: Some(123_456_789) }),
        count: Some(2),
        ..Default::default()
    };
    let (v, _typed): (Value, core::v1::Event) = decode("v1", "Event", &ev);
    assert_eq!(v["eventTime"], "2023-11-14T22:13:20.123456Z");
    assert_eq!(v["count"], 2);
}

#[test]
fn bad_bodies_are_errors() {
    let cm = pb::ConfigMap {
        metadata: Some(pb_meta::ObjectMeta { name: s("c1"), ..Default::default() }),
        data: [("a".to_string(), "b".to_string())].into(),
        ..Default::default()
    };
    let good = envelope("v1", "ConfigMap", cm.encode_to_vec());
    assert!(decode_body(&good).is_ok());
    // every truncation of the envelope is an error, never a panic
    for n in 0..good.len() {
        let _ = decode_body(&good[..n]);
    }
    assert!(matches!(decode_body(&good[..good.len() - 1]), Err(ProtobufError::Truncated)));
    assert!(matches!(decode_body(b"{\"kind\":\"ConfigMap\"}"), Err(ProtobufError::NoMagic)));
    assert!(matches!(decode_body(&good[4..]), Err(ProtobufError::NoMagic)));
    let e = decode_body(&envelope("v1", "Frobnicator", cm.encode_to_vec())).unwrap_err();
    assert!(matches!(e, ProtobufError::UnknownKind { .. }));
    assert_eq!(e.to_string(), "no kind \"Frobnicator\" is registered for version \"v1\" in protobuf request bodies");
    assert!(matches!(
        decode_body(&envelope("apps/v1", "ConfigMap", cm.encode_to_vec())),
        Err(ProtobufError::UnknownKind { .. })
    ));
    // metadata (field 1, a message) sent as a varint
    let e = decode_body(&envelope("v1", "ConfigMap", vec![0x08, 0x01])).unwrap_err();
    assert!(matches!(e, ProtobufError::WireType { field: "metadata", .. }), "{e}");
    // a string that is not UTF-8
    let bad_name = pb::ConfigMap { metadata: None, ..Default::default() }.encode_to_vec();
    let mut raw = bad_name;
    raw.extend([0x0a, 0x03, 0x0a, 0x01, 0xff]);
    assert!(decode_body(&envelope("v1", "ConfigMap", raw)).is_err());
    // compressed or foreign content is refused
    let mut u = Unknown::decode(&good[4..]).unwrap();
    u.content_encoding = s("gzip");
    let mut body = MAGIC.to_vec();
    body.extend(u.encode_to_vec());
    assert!(matches!(decode_body(&body), Err(ProtobufError::ContentEncoding(_))));
    // a length running past the end of a nested message
    assert!(matches!(decode_body(&envelope("v1", "ConfigMap", vec![0x0a, 0x05, 0x0a, 0x09, b'x'])), Err(ProtobufError::Truncated)));
}

fn varint(mut v: u64) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let b = (v & 0x7f) as u8;
        v >>= 7;
        if v == 0 {
            out.push(b);
            return out;
        }
        out.push(b | 0x80);
    }
}

fn with_groups(pod_security_context: Vec<u8>) -> Vec<u8> {
    // Pod {2 spec: PodSpec {14 securityContext: ...}}
    let mut spec = vec![0x72];
    spec.extend(varint(pod_security_context.len() as u64));
    spec.extend(pod_security_context);
    let mut pod = vec![0x12];
    pod.extend(varint(spec.len() as u64));
    pod.extend(spec);
    pod
}

#[test]
fn unpacked_and_packed_repeated_scalars() {
    // prost writes supplementalGroups unpacked (k8s-pb says packed = "false"), as Go does
    let pod = pb::Pod {
        spec: Some(pb::PodSpec {
            security_context: Some(pb::PodSecurityContext { supplemental_groups: vec![1, 150, -1], ..Default::default() }),
            ..Default::default()
        }),
        ..Default::default()
    };
    let v = decode_body(&envelope("v1", "Pod", pod.encode_to_vec())).unwrap();
    assert_eq!(v["spec"]["securityContext"]["supplementalGroups"], json!([1, 150, -1]));
    // the packed form of the same list
    let mut packed = vec![0x01, 0x96, 0x01];
    packed.extend([0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01]);
    let mut psc = vec![0x22];
    psc.extend(varint(packed.len() as u64));
    psc.extend(packed);
    let v = decode_body(&envelope("v1", "Pod", with_groups(psc))).unwrap();
    assert_eq!(v["spec"]["securityContext"]["supplementalGroups"], json!([1, 150, -1]));
    // one unpacked element; a 64-bit value for an int64 field is refused
    let v = decode_body(&envelope("v1", "Pod", with_groups(vec![0x20, 0x07])));
    assert_eq!(v.unwrap()["spec"]["securityContext"]["supplementalGroups"], json!([7]));
    assert!(decode_body(&envelope("v1", "Pod", with_groups(vec![0x21, 0, 0, 0, 0, 0, 0, 0, 0]))).is_err());
}

#[test]
fn every_served_kind_has_a_root() {
    // The snapshot kinds are CustomResourceDefinitions upstream: JSON only; so are
    // CustomResourceDefinitions here (client-go's apiextensions clientset and kubectl send JSON).
    for r in crate::resources::RESOURCES.iter().filter(|r| !matches!(r.group, "snapshot.storage.k8s.io" | "apiextensions.k8s.io")) {
        assert!(
            schema::ROOTS.iter().any(|x| x.kind == r.kind && x.api_version == r.api_version()),
            "{} {} has no protobuf schema: run the generator",
            r.api_version(),
            r.kind
        );
    }
}
