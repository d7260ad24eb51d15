//! Privileged CRI test: containerd 1.6 (Debian's) invokes the real ferro-cni exactly as it
//! would any CNI plugin. The ferro-lab fixture builds the test images offline, starts a
//! private containerd inside a node network namespace (its own root, state, socket and CNI
//! dirs; the CRI plugin's bin_dir holds `ferro` -> ferro-cni and the reference `loopback`),
//! and the test drives it over CRI v1: RunPodSandbox, PodSandboxStatus (the IP is from
//! ferro-cni's range and reserved in its IPAM dir), StopPodSandbox + RemovePodSandbox (the IP
//! is released, the veth gone). Needs root; fails, never skips, without it or the packages.
#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::net::IpAddr;
use std::path::Path;

use ferro_lab::containerd::{Containerd, Options};
use ferro_lab::cri::api;
use ferro_lab::images;
use ferro_lab::netns::NetNs;
use serde_json::json;

const SUBNET: &str = "10.80.0.0/24";
const BRIDGE: &str = "fclabbr0";

fn ip_files(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .filter(|n| n.parse::<IpAddr>().is_ok())
                .collect()
        })
        .unwrap_or_default()
}

#[test]
#[ignore = "privileged: needs root and network namespaces; run by scripts/test.sh"]
fn containerd_cri_pod_sandbox_gets_and_releases_an_address_from_ferro_cni() {
    ferro_lab::require_root().unwrap();
    let work = tempfile::tempdir().unwrap();
    let pause = images::build_static_pause().unwrap();
    let tars = images::build_images(work.path(), &pause).unwrap();
    let ipam = work.path().join("ipam");
    let node = NetNs::new(&format!("fclab-node-{}", std::process::id())).unwrap();
    let conflist = json!({
        "cniVersion": "1.0.0",
        "name": "ferro-lab",
        "plugins": [{
            "type": "ferro", "bridge": BRIDGE, "isGateway": true, "mtu": 1450,
            "ipam": {"ranges": [[{"subnet": SUBNET}]], "dataDir": ipam},
        }],
    });
    let opts = Options {
        sandbox_image: images::PAUSE_IMAGE.into(),
        cni_plugins: vec![
            ("ferro".into(), env!("CARGO_BIN_EXE_ferro-cni").into()),
            ("loopback".into(), "/usr/lib/cni/loopback".into()),
        ],
        cni_configs: vec![("10-ferro.conflist".into(), conflist.to_string())],
        runtime_binary: None,
        root_fs_bytes: None,
    };
    let ctrd = Containerd::start(&node, &opts).unwrap();
    ctrd.import(&tars.pause).unwrap();
    ctrd.import(&tars.busybox).unwrap();
    let listed = ctrd.ctr(&["images", "ls", "-q"]).unwrap();
    assert!(listed.contains(images::PAUSE_IMAGE), "{listed}");
    assert!(listed.contains(images::BUSYBOX_IMAGE), "{listed}");

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let (mut runtime, mut image) = ferro_lab::cri::connect(&ctrd.socket()).await.unwrap();
        let version = runtime
            .version(api::VersionRequest {
                version: "v1".into(),
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(version.runtime_name, "containerd");
        let imgs = image
            .list_images(api::ListImagesRequest { filter: None })
            .await
            .unwrap()
            .into_inner();
        assert!(
            imgs.images
                .iter()
                .any(|i| i.repo_tags.iter().any(|t| t == images::PAUSE_IMAGE)),
            "CRI does not see the pause image: {imgs:?}"
        );

        let config = api::PodSandboxConfig {
            metadata: Some(api::PodSandboxMetadata {
                name: "lab-pod".into(),
                uid: "6d1c1a52-0000-4000-8000-000000000001".into(),
                namespace: "default".into(),
                attempt: 0,
            }),
            hostname: "lab-pod".into(),
            log_directory: work.path().join("logs").display().to_string(),
            labels: HashMap::from([("app".to_string(), "lab".to_string())]),
            linux: Some(api::LinuxPodSandboxConfig::default()),
            ..Default::default()
        };
        let run = runtime
            .run_pod_sandbox(api::RunPodSandboxRequest {
                config: Some(config),
                runtime_handler: String::new(),
            })
            .await;
        let id = match run {
            Ok(r) => r.into_inner().pod_sandbox_id,
            Err(e) => panic!("RunPodSandbox: {e}\ncontainerd log:\n{}", ctrd.log()),
        };
        let status = runtime
            .pod_sandbox_status(api::PodSandboxStatusRequest {
                pod_sandbox_id: id.clone(),
                verbose: false,
            })
            .await
            .unwrap()
            .into_inner()
            .status
            .unwrap();
        assert_eq!(status.state, api::PodSandboxState::SandboxReady as i32);
        let ip: IpAddr = status.network.as_ref().unwrap().ip.parse().unwrap();
        let net: ipnet::IpNet = SUBNET.parse().unwrap();
        assert!(net.contains(&ip), "{ip} not in {SUBNET}");
        assert_eq!(
            ip_files(&ipam.join("ferro-lab")),
            vec![ip.to_string()],
            "ferro-cni's reservation"
        );
        // The host end of the pod's veth is on ferro's bridge in the node namespace.
        let ports = std::process::Command::new("ip")
            .args(["-n", node.name(), "-o", "link", "show", "master", BRIDGE])
            .output()
            .unwrap();
        assert_eq!(
            String::from_utf8_lossy(&ports.stdout).lines().count(),
            1,
            "{}",
            String::from_utf8_lossy(&ports.stdout)
        );
        // The pod answers from its namespace: ping it from the node.
        let ping = std::process::Command::new("ip")
            .args(["netns", "exec", node.name(), "ping", "-c1", "-W2"])
            .arg(ip.to_string())
            .output()
            .unwrap();
        assert!(ping.status.success(), "node cannot ping the pod at {ip}");

        runtime
            .stop_pod_sandbox(api::StopPodSandboxRequest {
                pod_sandbox_id: id.clone(),
            })
            .await
            .unwrap();
        assert!(
            ip_files(&ipam.join("ferro-lab")).is_empty(),
            "StopPodSandbox did not release the address"
        );
        runtime
            .remove_pod_sandbox(api::RemovePodSandboxRequest {
                pod_sandbox_id: id.clone(),
            })
            .await
            .unwrap();
        let left = runtime
            .list_pod_sandbox(api::ListPodSandboxRequest { filter: None })
            .await
            .unwrap()
            .into_inner();
        assert!(left.items.is_empty(), "{left:?}");
        // DEL leaves the deletion of the pair to a detached child and containerd deletes
        // the namespace: the pair goes soon after, not necessarily before RemovePodSandbox
        // returns.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        loop {
            let ports = std::process::Command::new("ip")
                .args(["-n", node.name(), "-o", "link", "show", "master", BRIDGE])
                .output()
                .unwrap();
            let ports = String::from_utf8_lossy(&ports.stdout).trim().to_string();
            if ports.is_empty() {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "veth left on the bridge: {ports}"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        // That child is not left as a zombie of containerd (it would be if containerd were a
        // subreaper that never waits for it).
        let ctrd_pid = ctrd.pid().unwrap().to_string();
        let zombies: Vec<String> = std::fs::read_dir("/proc")
            .unwrap()
            .filter_map(|e| std::fs::read_to_string(e.ok()?.path().join("stat")).ok())
            .filter(|st| {
                let fields: Vec<&str> = st
                    .rsplit(')')
                    .next()
                    .unwrap_or("")
                    .split_whitespace()
                    .collect();
                fields.first() == Some(&"Z") && fields.get(1) == Some(&ctrd_pid.as_str())
            })
            .collect();
        assert!(zombies.is_empty(), "zombies of containerd: {zombies:?}");
    });
    drop(ctrd);
}
