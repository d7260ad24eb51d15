//! Runs the built ferro-cni executable the way a runtime does.
#![allow(clippy::unwrap_used)]

use std::io::Write;
use std::process::{Command, Output, Stdio};

fn run(envs: &[(&str, &str)], stdin: &str) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_ferro-cni"))
        .env_clear()
        .envs(envs.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The plugin may exit before reading stdin (bad environment): ignore EPIPE.
    let _ = child.stdin.take().unwrap().write_all(stdin.as_bytes());
    child.wait_with_output().unwrap()
}

fn stdout_json(out: &Output) -> serde_json::Value {
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn version_command() {
    let out = run(&[("CNI_COMMAND", "VERSION")], r#"{"cniVersion":"1.0.0"}"#);
    assert!(out.status.success());
    assert_eq!(
        stdout_json(&out),
        serde_json::json!({"cniVersion": "1.1.0", "supportedVersions": ["0.4.0", "1.0.0", "1.1.0"]})
    );
}

const ADD_ENV: [(&str, &str); 5] = [
    ("CNI_COMMAND", "ADD"),
    ("CNI_CONTAINERID", "abc"),
    ("CNI_NETNS", "/var/run/netns/x"),
    ("CNI_IFNAME", "eth0"),
    ("CNI_PATH", "/opt/cni/bin"),
];

#[test]
fn malformed_config_is_error_code_6() {
    let out = run(&ADD_ENV, r#"{"cniVersion": "1.0.0", "name": "#);
    assert!(!out.status.success());
    let v = stdout_json(&out);
    assert_eq!(v["code"], 6);
    assert_eq!(v["msg"], "Failed to decode content");
    assert_eq!(v["cniVersion"], "1.1.0");
    assert!(v["details"]
        .as_str()
        .unwrap()
        .contains("network configuration"));
}

#[test]
fn errors_use_the_callers_version_and_bad_env_is_code_4() {
    let conf = r#"{"cniVersion": "0.4.0", "name": "n", "type": "ferro", "podCIDR": "10.1.0.0/16"}"#;
    // CNI_NETNS names no namespace: ADD stops with code 4 before touching anything.
    let out = run(&ADD_ENV, conf);
    assert!(!out.status.success());
    let v = stdout_json(&out);
    assert_eq!(
        (v["code"].as_u64(), v["cniVersion"].as_str()),
        (Some(4), Some("0.4.0"))
    );
    let out = run(&ADD_ENV[..3], conf);
    assert!(!out.status.success());
    assert_eq!(stdout_json(&out)["code"], 4);
}
