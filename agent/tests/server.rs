//! The agent's HTTPS server behind the real ferro-control-plane, driven by the real kubectl:
//! `logs` (plain, --tail, --timestamps, --limit-bytes, -f), `exec` (with and without stdin),
//! `attach` and `port-forward`, against a busybox container that a private containerd (the ferro-lab
//! fixture) runs.
//!
//! containerd's streaming server listens on 127.0.0.1 inside the lab's network namespace, so
//! everything runs there: the test body runs on a thread that entered the namespace
//! (`setns`) before building its tokio runtime, and the control plane and kubectl are started
//! with `ip netns exec`. The Node object points the control plane at the server
//! (127.0.0.1:<port>); a fake `Lookup` maps the Pod to the sandbox and container created
//! through CRI. Needs root and the lab's packages; fails, never skips, without them.
#![allow(clippy::unwrap_used)]

mod lab;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lab::{control_plane_bin, free_port, Proc};

use ferro_agent::server::{serve_on, ContainerRef, Lookup, ServerConfig};
use ferro_lab::containerd::{Containerd, Options};
use ferro_lab::cri::api;
use ferro_lab::images;
use ferro_lab::netns::NetNs;
use futures::{SinkExt as _, StreamExt as _};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, PostParams};
use serde_json::json;
use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _};
use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

/// The fake pod workers: one pod, one container.
#[derive(Default)]
struct Fake {
    pods: Mutex<Vec<Pod>>,
    containers: Mutex<HashMap<(String, String, String), ContainerRef>>,
    sandboxes: Mutex<HashMap<(String, String), String>>,
}

impl Lookup for Fake {
    fn pods(&self) -> Vec<Pod> {
        self.pods.lock().unwrap().clone()
    }
    fn container(&self, ns: &str, pod: &str, c: &str) -> Option<ContainerRef> {
        self.containers.lock().unwrap().get(&(ns.into(), pod.into(), c.into())).cloned()
    }
    fn sandbox(&self, ns: &str, pod: &str) -> Option<String> {
        self.sandboxes.lock().unwrap().get(&(ns.into(), pod.into())).cloned()
    }
}

struct Kubectl {
    netns: String,
    kubeconfig: PathBuf,
    home: PathBuf,
}

impl Kubectl {
    fn command(&self, args: &[&str]) -> tokio::process::Command {
        let mut c = tokio::process::Command::new("ip");
        c.args(["netns", "exec", &self.netns, "kubectl", "--kubeconfig"])
            .arg(&self.kubeconfig)
            .args(args)
            .env("HOME", &self.home)
            .kill_on_drop(true);
        c
    }

    /// Runs kubectl to completion (30 s at most) with `stdin`, returning its stdout; panics
    /// with its stderr when it fails.
    async fn run(&self, args: &[&str], stdin: Option<&str>) -> String {
        let mut c = self.command(args);
        c.stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = c.spawn().unwrap();
        if let Some(input) = stdin {
            let mut w = child.stdin.take().unwrap();
            w.write_all(input.as_bytes()).await.unwrap();
            drop(w);
        }
        let out = tokio::time::timeout(Duration::from_secs(30), child.wait_with_output())
            .await
            .unwrap_or_else(|_| panic!("kubectl {args:?} did not finish in 30s"))
            .unwrap();
        assert!(
            out.status.success(),
            "kubectl {args:?} failed ({}):\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }
}

async fn wait_for<T, F, Fut>(what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

type Tls = tokio_rustls::client::TlsStream<tokio::net::TcpStream>;

/// A WebSocket exec through the control plane's pod proxy (the admin's token, the cluster CA),
/// offering `protocols`; the handshake's answer.
async fn ws_exec(cp_dir: &Path, cp_port: u16, query: &str, protocols: &str) -> (WebSocketStream<Tls>, String) {
    use rustls::pki_types::pem::PemObject as _;
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls::pki_types::CertificateDer::pem_file_iter(cp_dir.join("ca.crt")).unwrap() {
        roots.add(c.unwrap()).unwrap();
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", cp_port)).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
    let tls = tokio_rustls::TlsConnector::from(Arc::new(cfg)).connect(name, tcp).await.unwrap();
    let tokens = std::fs::read_to_string(cp_dir.join("tokens.csv")).unwrap();
    let token = tokens.lines().find(|l| l.split(',').nth(1) == Some("admin")).unwrap().split(',').next().unwrap();
    let url = format!("wss://127.0.0.1:{cp_port}/api/v1/namespaces/default/pods/srv/exec?{query}");
    let mut req = url.into_client_request().unwrap();
    req.headers_mut().insert("authorization", format!("Bearer {token}").parse().unwrap());
    req.headers_mut().insert("sec-websocket-protocol", protocols.parse().unwrap());
    let (ws, resp) = tokio_tungstenite::client_async(req, tls).await.unwrap();
    assert_eq!(resp.status(), 101);
    let chosen = resp.headers().get("sec-websocket-protocol").unwrap().to_str().unwrap().to_string();
    (ws, chosen)
}

/// What a v5 session delivered: stdout, stderr, the Status of channel 3, the close code.
#[derive(Debug, Default)]
struct Outcome {
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    error: Vec<u8>,
    close: Option<u16>,
}

impl Outcome {
    fn status(&self) -> serde_json::Value {
        serde_json::from_slice(&self.error)
            .unwrap_or_else(|e| panic!("{e}: {:?}", String::from_utf8_lossy(&self.error)))
    }
}

/// Reads a session's messages until the server closes it (30 s at most).
async fn collect<S>(ws: &mut S, out: &mut Outcome, until: impl Fn(&Outcome) -> bool)
where
    S: futures::Stream<Item = Result<Message, tokio_tungstenite::tungstenite::Error>> + Unpin,
{
    let read = async {
        while let Some(m) = ws.next().await {
            match m.unwrap() {
                Message::Binary(b) => match b.first() {
                    Some(1) => out.stdout.extend_from_slice(&b[1..]),
                    Some(2) => out.stderr.extend_from_slice(&b[1..]),
                    Some(3) => out.error.extend_from_slice(&b[1..]),
                    other => panic!("a message on channel {other:?}"),
                },
                Message::Close(f) => {
                    out.close = Some(f.map(|f| u16::from(f.code)).unwrap_or(1005));
                }
                _ => {}
            }
            if until(out) {
                return;
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(30), read)
        .await
        .unwrap_or_else(|_| panic!("the session did not end in 30s: {out:?}"));
}

fn stdin(data: &[u8]) -> Message {
    let mut m = vec![0u8];
    m.extend_from_slice(data);
    Message::Binary(m.into())
}

/// v5's "stdin closed".
fn close_stdin() -> Message {
    Message::Binary(vec![255u8, 0].into())
}

/// A line long enough (32 KiB) for containerd to split it into partial records.
const LONG: usize = 32768;

#[test]
#[ignore = "privileged: needs root and containerd; run by scripts/test.sh"]
fn kubectl_logs_exec_and_port_forward_through_the_agent_server() {
    // The server's debug log, shown with a failure.
    let _ = tracing_subscriber::fmt().with_env_filter("ferro_agent=debug").with_test_writer().try_init();
    ferro_lab::require_root().unwrap();
    ferro_lab::require_bin("kubectl", "kubectl").unwrap();
    ferro_lab::require_bin("curl", "curl").unwrap();
    let work = tempfile::Builder::new().prefix("ferro-agent-server").tempdir().unwrap();
    let pause = images::build_static_pause().unwrap();
    let tars = images::build_images(work.path(), &pause).unwrap();
    let ns = NetNs::new(&format!("fagent-srv-{}", std::process::id())).unwrap();
    let conflist = json!({
        "cniVersion": "1.0.0",
        "name": "fagent-srv",
        "plugins": [{
            "type": "bridge", "bridge": "fsrvbr0", "isGateway": true,
            "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.82.0.0/24"}]], "dataDir": work.path().join("ipam")},
        }],
    });
    let opts = Options {
        sandbox_image: images::PAUSE_IMAGE.into(),
        cni_plugins: ["bridge", "host-local", "loopback"]
            .iter()
            .map(|p| (p.to_string(), Path::new("/usr/lib/cni").join(p)))
            .collect(),
        cni_configs: vec![("10-bridge.conflist".into(), conflist.to_string())],
        runtime_binary: None,
        root_fs_bytes: None,
    };
    let ctrd = Containerd::start(&ns, &opts).unwrap();
    ctrd.import(&tars.pause).unwrap();
    ctrd.import(&tars.busybox).unwrap();

    let netns_path = ns.path();
    let netns_name = ns.name().to_string();
    let socket = ctrd.socket();
    let dir = work.path().to_path_buf();
    let body = std::thread::spawn(move || {
        let f = std::fs::File::open(&netns_path).unwrap();
        nix::sched::setns(&f, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        rt.block_on(in_netns(netns_name, socket, dir));
    })
    .join();
    // Pods go through CRI before containerd stops, so the runtime's shims exit on their own.
    remove_all_pods(&ctrd.socket());
    if let Err(panic) = body {
        eprintln!("containerd log (tail):\n{}", ctrd.log().lines().rev().take(40).collect::<Vec<_>>().join("\n"));
        std::panic::resume_unwind(panic);
    }
    drop(ctrd);
}

/// StopPodSandbox + RemovePodSandbox for every sandbox (errors ignored: cleanup).
fn remove_all_pods(socket: &Path) {
    let Ok(rt) = tokio::runtime::Builder::new_current_thread().enable_all().build() else { return };
    rt.block_on(async {
        let Ok((mut runtime, _)) = ferro_lab::cri::connect(socket).await else { return };
        let Ok(list) = runtime.list_pod_sandbox(api::ListPodSandboxRequest { filter: None }).await else { return };
        for s in list.into_inner().items {
            let _ = runtime.stop_pod_sandbox(api::StopPodSandboxRequest { pod_sandbox_id: s.id.clone() }).await;
            let _ = runtime.remove_pod_sandbox(api::RemovePodSandboxRequest { pod_sandbox_id: s.id }).await;
        }
    });
}

async fn in_netns(netns: String, socket: PathBuf, dir: PathBuf) {
    // The control plane, inside the namespace.
    let cp_dir = dir.join("cp");
    std::fs::create_dir_all(&cp_dir).unwrap();
    let cp_port = free_port();
    let cp_log = std::fs::File::create(dir.join("cp.log")).unwrap();
    let child = Command::new("ip")
        .args(["netns", "exec", &netns])
        .arg(control_plane_bin())
        .arg("--data-dir")
        .arg(&cp_dir)
        .args(["--bind-address", "127.0.0.1", "--secure-port", &cp_port.to_string()])
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(cp_log)
        .spawn()
        .unwrap();
    let _cp = Proc(Some(child));
    let cp_logs = || std::fs::read_to_string(dir.join("cp.log")).unwrap_or_default();
    wait_for("the control plane", || async {
        (cp_dir.join("admin.kubeconfig").exists() && tokio::net::TcpStream::connect(("127.0.0.1", cp_port)).await.is_ok())
            .then_some(())
    })
    .await;
    let kubeconfig = cp_dir.join("admin.kubeconfig");
    let kc = kube::config::Kubeconfig::read_from(&kubeconfig).unwrap();
    let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await.unwrap();
    let client = kube::Client::try_from(cfg).unwrap();

    // A pod through CRI: a busybox container that logs, serves http on 8080 and sleeps.
    let (mut runtime, _) = ferro_lab::cri::connect(&socket).await.unwrap();
    let logs_dir = dir.join("pod-logs");
    let sandbox_config = api::PodSandboxConfig {
        metadata: Some(api::PodSandboxMetadata {
            name: "srv".into(),
            uid: "6d1c1a52-0000-4000-8000-0000000000aa".into(),
            namespace: "default".into(),
            attempt: 0,
        }),
        hostname: "srv".into(),
        log_directory: logs_dir.display().to_string(),
        linux: Some(api::LinuxPodSandboxConfig::default()),
        ..Default::default()
    };
    let sandbox = runtime
        .run_pod_sandbox(api::RunPodSandboxRequest { config: Some(sandbox_config.clone()), runtime_handler: String::new() })
        .await
        .unwrap()
        .into_inner()
        .pod_sandbox_id;
    let script = "s=x; for i in 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15; do s=$s$s; done; echo $s; \
                  echo line 1; echo line 2; sleep 1; echo line 3 >&2; \
                  echo hello-from-pod > /www/index.html; httpd -p 8080 -h /www; \
                  while [ ! -e /tmp/go ]; do sleep 1; done; echo later; \
                  while [ ! -e /tmp/go2 ]; do sleep 1; done; echo attached; exec sleep 3600";
    let container = runtime
        .create_container(api::CreateContainerRequest {
            pod_sandbox_id: sandbox.clone(),
            config: Some(api::ContainerConfig {
                metadata: Some(api::ContainerMetadata { name: "c".into(), attempt: 0 }),
                image: Some(api::ImageSpec { image: images::BUSYBOX_IMAGE.into(), ..Default::default() }),
                command: vec!["sh".into(), "-c".into(), script.into()],
                log_path: "c_0.log".into(),
                linux: Some(api::LinuxContainerConfig::default()),
                ..Default::default()
            }),
            sandbox_config: Some(sandbox_config),
        })
        .await
        .unwrap()
        .into_inner()
        .container_id;
    runtime.start_container(api::StartContainerRequest { container_id: container.clone() }).await.unwrap();

    // The server, with the fake pod workers.
    let fake = Arc::new(Fake::default());
    let key = ("default".to_string(), "srv".to_string());
    fake.sandboxes.lock().unwrap().insert(key.clone(), sandbox.clone());
    fake.containers.lock().unwrap().insert(
        (key.0.clone(), key.1.clone(), "c".into()),
        ContainerRef { id: container.clone(), log_path: logs_dir.join("c_0.log"), previous_log_path: None, running: true },
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let server_cfg = ServerConfig {
        address: listener.local_addr().unwrap(),
        tls_cert_file: None,
        tls_key_file: None,
        client_ca_pem: Some(std::fs::read(cp_dir.join("ca.crt")).unwrap()),
        cert_dir: dir.join("agent-pki"),
        node_name: "node-srv".into(),
        node_ips: vec!["127.0.0.1".parse().unwrap()],
        runtime_socket: socket.clone(),
        // TokenReviews and SubjectAccessReviews go to ferro-control-plane.
        kube: Some(client.clone()),
        authorization: ferro_agent::server::authz::AuthzConfig {
            mode: ferro_agent::server::authz::Mode::Webhook,
            ..Default::default()
        },
        stats: None,
    };
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(serve_on(listener, server_cfg, fake.clone(), async move {
        let _ = stop_rx.await;
    }));

    // The Node (pointing at the server) and the Pod bound to it.
    let nodes: Api<Node> = Api::all(client.clone());
    let node: Node = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-srv"},
    }))
    .unwrap();
    let mut node = nodes.create(&PostParams::default(), &node).await.unwrap();
    node.status = Some(
        serde_json::from_value(json!({
            "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}, {"type": "Hostname", "address": "node-srv"}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": port}},
        }))
        .unwrap(),
    );
    nodes
        .replace_status("node-srv", &PostParams::default(), &node)
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "srv", "namespace": "default"},
        "spec": {"nodeName": "node-srv", "containers": [{"name": "c", "image": images::BUSYBOX_IMAGE}]},
    }))
    .unwrap();
    let mut pod = pods.create(&PostParams::default(), &pod).await.unwrap();
    // What the pod workers would report (kubectl port-forward wants a Running pod).
    pod.status = Some(
        serde_json::from_value(json!({
            "phase": "Running",
            "containerStatuses": [{"name": "c", "ready": true, "restartCount": 0, "image": images::BUSYBOX_IMAGE,
                "imageID": "", "containerID": format!("containerd://{container}"),
                "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}}}],
        }))
        .unwrap(),
    );
    let pod = pods.replace_status("srv", &PostParams::default(), &pod).await.unwrap();
    fake.pods.lock().unwrap().push(pod);

    let home = dir.join("home");
    std::fs::create_dir_all(&home).unwrap();
    let kubectl = Kubectl { netns: netns.clone(), kubeconfig: kubeconfig.clone(), home };

    // Logs: the long line arrives whole (containerd wrote it as partial records).
    let long = "x".repeat(LONG);
    let want = format!("{long}\nline 1\nline 2\nline 3\n");
    let all = wait_for("the container's output in kubectl logs", || async {
        let out = kubectl.run(&["logs", "srv"], None).await;
        (out.len() >= want.len()).then_some(out)
    })
    .await;
    let short = |s: &str| s.replace(&long, "<LONG>");
    assert_eq!(short(&all), short(&want), "control plane log:\n{}", cp_logs());
    let raw = std::fs::read_to_string(logs_dir.join("c_0.log")).unwrap();
    assert!(raw.contains(" stdout P "), "containerd did not split the long line:\n{}", &raw[..200.min(raw.len())]);
    assert_eq!(kubectl.run(&["logs", "srv", "--tail=2"], None).await, "line 2\nline 3\n");
    let stamped = kubectl.run(&["logs", "srv", "--tail=1", "--timestamps"], None).await;
    let (time, rest) = stamped.split_once(' ').unwrap();
    assert_eq!(rest, "line 3\n");
    assert!(time.parse::<jiff::Timestamp>().is_ok() && time.len() == 30, "{stamped}");
    assert_eq!(kubectl.run(&["logs", "srv", "--limit-bytes=3", "--tail=1"], None).await, "lin");
    assert_eq!(short(&kubectl.run(&["logs", "srv", "--since=1h"], None).await), short(&want));
    let previous = kubectl.command(&["logs", "srv", "--previous"]).output().await.unwrap();
    let err = String::from_utf8_lossy(&previous.stderr);
    assert!(!previous.status.success(), "{err}");
    // The agent's plain-text message is checked with curl below: ferro-control-plane passes the
    // 400 through as it is, and kubectl only prints the reason for a body that is no Status
    // (upstream's API server wraps the agent's text into a Status).
    assert!(err.contains("(BadRequest)"), "{err}");

    // Exec: kubectl asks for WebSocket v5 first, which the agent serves (bridged to the
    // runtime's SPDY); the counters at the end show that no request fell back.
    assert_eq!(kubectl.run(&["exec", "srv", "--", "echo", "hi"], None).await, "hi\n");
    assert_eq!(kubectl.run(&["exec", "-i", "srv", "--", "cat"], Some("hello\nworld\n")).await, "hello\nworld\n");
    let hostname = kubectl.run(&["exec", "srv", "-c", "c", "--", "sh", "-c", "hostname; echo err >&2"], None).await;
    assert_eq!(hostname, "srv\n");
    // A failing command: kubectl reads the exit code from the Status on channel 3.
    let failing =
        kubectl.command(&["exec", "srv", "--", "sh", "-c", "echo out; echo err >&2; exit 3"]).output().await.unwrap();
    assert_eq!(failing.status.code(), Some(3), "{}", String::from_utf8_lossy(&failing.stderr));
    assert_eq!(String::from_utf8_lossy(&failing.stdout), "out\n");
    assert!(
        String::from_utf8_lossy(&failing.stderr).starts_with("err\n"),
        "{}",
        String::from_utf8_lossy(&failing.stderr)
    );
    // SPDY clients (kubectl with WebSockets turned off, upstream's API server) are spliced
    // with the runtime as before.
    let mut spdy = kubectl.command(&["exec", "-i", "srv", "--", "cat"]);
    spdy.env("KUBECTL_REMOTE_COMMAND_WEBSOCKETS", "false")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut spdy = spdy.spawn().unwrap();
    spdy.stdin.take().unwrap().write_all(b"over spdy\n").await.unwrap();
    let spdy = spdy.wait_with_output().await.unwrap();
    assert!(spdy.status.success(), "{}", String::from_utf8_lossy(&spdy.stderr));
    assert_eq!(String::from_utf8_lossy(&spdy.stdout), "over spdy\n");

    // A WebSocket client of its own, offering v5 only.
    let (mut ws, chosen) =
        ws_exec(&cp_dir, cp_port, "command=cat&stdin=true&stdout=true&stderr=true", "v5.channel.k8s.io").await;
    assert_eq!(chosen, "v5.channel.k8s.io");
    ws.send(stdin(b"hello\n")).await.unwrap();
    ws.send(close_stdin()).await.unwrap();
    let mut out = Outcome::default();
    collect(&mut ws, &mut out, |_| false).await;
    assert_eq!(String::from_utf8_lossy(&out.stdout), "hello\n", "{out:?}");
    assert_eq!(out.status()["status"], "Success", "{out:?}");
    assert_eq!(out.close, Some(1000));
    // The exit code in a Failure Status.
    let (mut ws, _) = ws_exec(
        &cp_dir,
        cp_port,
        "command=sh&command=-c&command=echo%20oops%20%3E%262%3B%20exit%203&stdout=true&stderr=true",
        "v5.channel.k8s.io",
    )
    .await;
    let mut out = Outcome::default();
    collect(&mut ws, &mut out, |_| false).await;
    assert_eq!(String::from_utf8_lossy(&out.stderr), "oops\n", "{out:?}");
    let status = out.status();
    assert_eq!(status["status"], "Failure", "{status}");
    assert_eq!(status["reason"], "NonZeroExitCode", "{status}");
    assert_eq!(status["details"]["causes"][0]["reason"], "ExitCode", "{status}");
    assert_eq!(status["details"]["causes"][0]["message"], "3", "{status}");
    // More than the 64 KiB SPDY windows, both ways at once: stdin written while stdout is read.
    let (ws, _) = ws_exec(&cp_dir, cp_port, "command=cat&stdin=true&stdout=true", "v5.channel.k8s.io").await;
    let (mut tx, mut rx) = ws.split();
    let big: Vec<u8> = (0..300_000u32).map(|i| b'a' + (i % 26) as u8).collect();
    let input = big.clone();
    let writer = tokio::spawn(async move {
        for chunk in input.chunks(10_000) {
            tx.send(stdin(chunk)).await.unwrap();
        }
        tx.send(close_stdin()).await.unwrap();
        tx
    });
    let mut out = Outcome::default();
    collect(&mut rx, &mut out, |_| false).await;
    let _tx = writer.await.unwrap();
    assert_eq!(out.stdout.len(), big.len());
    assert!(out.stdout == big, "the echoed bytes differ");
    assert_eq!(out.status()["status"], "Success");
    // A client offering only v4: the agent forwards it to the runtime's own WebSocket server
    // and splices (the runtime ends the session by closing the connection, no close frame).
    let (mut ws, chosen) = ws_exec(&cp_dir, cp_port, "command=echo&command=v4&stdout=true", "v4.channel.k8s.io").await;
    assert_eq!(chosen, "v4.channel.k8s.io");
    let mut out = Outcome::default();
    let read = async {
        while let Some(Ok(m)) = ws.next().await {
            if let Message::Binary(b) = m {
                match b.first() {
                    Some(1) => out.stdout.extend_from_slice(&b[1..]),
                    Some(3) => out.error.extend_from_slice(&b[1..]),
                    _ => {}
                }
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(30), read).await.unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "v4\n", "{out:?}");
    // A terminal, resized: `busybox stty size` answers each line the shell reads, until it sees the
    // size the client sent (the resize and stdin are separate streams, so the first answer
    // may still be the old size, or, before any size was set, busybox's complaint about the
    // terminal's 0x0 size: "stty: standard input"); `q` ends it.
    let (mut ws, _) = ws_exec(
        &cp_dir,
        cp_port,
        "command=sh&command=-c&command=while%20read%20x%3B%20do%20%5B%20%22%24x%22%20%3D%20q%20%5D%20%26%26%20exit%200%3B%20busybox%20stty%20size%3B%20done&stdin=true&stdout=true&tty=true",
        "v5.channel.k8s.io",
    )
    .await;
    ws.send(Message::Binary([&[4u8][..], br#"{"Width":100,"Height":30}"#].concat().into())).await.unwrap();
    let mut out = Outcome::default();
    let sizes = |o: &Outcome| {
        String::from_utf8_lossy(&o.stdout)
            .split("\r\n")
            .filter(|l| {
                l.split(' ').count() == 2
                    && l.split(' ').all(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
            })
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    let answers = |o: &Outcome| {
        sizes(o).len()
            + String::from_utf8_lossy(&o.stdout)
                .split("\r\n")
                .filter(|l| l.starts_with("stty: standard input"))
                .count()
    };
    let mut resized = false;
    for i in 0..50 {
        ws.send(stdin(b"\n")).await.unwrap();
        collect(&mut ws, &mut out, |o| answers(o) > i).await;
        if sizes(&out).last().map(String::as_str) == Some("30 100") {
            resized = true;
            break;
        }
    }
    assert!(resized, "{:?}", String::from_utf8_lossy(&out.stdout));
    ws.send(stdin(b"q\n")).await.unwrap();
    collect(&mut ws, &mut out, |_| false).await;
    assert_eq!(out.status()["status"], "Success", "{out:?}");

    // Straight to the server (below, and to watch the request counters).
    let curl = |path: &str, cert: bool| {
        let mut c = tokio::process::Command::new("curl");
        c.args(["-sk", "--max-time", "10", "-w", "\n%{http_code}"]);
        if cert {
            c.arg("--cert").arg(cp_dir.join("kubelet-client.crt")).arg("--key").arg(cp_dir.join("kubelet-client.key"));
        }
        c.arg(format!("https://127.0.0.1:{port}{path}"));
        async move {
            let out = c.output().await.unwrap();
            let text = String::from_utf8(out.stdout).unwrap();
            let (body, code) = text.rsplit_once('\n').unwrap();
            (code.to_string(), body.to_string())
        }
    };
    // logs -f: a line the container writes later (once told to) arrives on the open stream.
    let mut follow = kubectl.command(&["logs", "-f", "--tail=1", "srv"]);
    follow.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut follow = follow.spawn().unwrap();
    let mut lines = tokio::io::BufReader::new(follow.stdout.take().unwrap()).lines();
    let first = tokio::time::timeout(Duration::from_secs(20), lines.next_line()).await.unwrap().unwrap();
    assert_eq!(first.as_deref(), Some("line 3"));
    kubectl.run(&["exec", "srv", "--", "mkdir", "/tmp/go"], None).await;
    let next = tokio::time::timeout(Duration::from_secs(20), lines.next_line()).await.unwrap().unwrap();
    assert_eq!(next.as_deref(), Some("later"));
    follow.kill().await.unwrap();

    // attach: output the container writes once attached arrives. The attach stream is up once
    // the server counted its 101.
    let mut attach = kubectl.command(&["attach", "srv", "-c", "c"]);
    attach.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut attach = attach.spawn().unwrap();
    wait_for("the attach stream", || async {
        let (_, m) = curl("/metrics", true).await;
        m.contains("ferro_agent_server_requests_total{path=\"attach\",code=\"101\"} 1\n").then_some(())
    })
    .await;
    kubectl.run(&["exec", "srv", "--", "mkdir", "/tmp/go2"], None).await;
    let mut attached = tokio::io::BufReader::new(attach.stdout.take().unwrap()).lines();
    let line = tokio::time::timeout(Duration::from_secs(20), attached.next_line()).await.unwrap().unwrap();
    assert_eq!(line.as_deref(), Some("attached"));
    attach.kill().await.unwrap();

    // port-forward: kubectl listens where it runs (in the namespace); the runtime dials the
    // pod's port 8080.
    let local = free_port();
    let mut pf = kubectl.command(&["port-forward", "pod/srv", &format!("{local}:8080")]);
    pf.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut pf = pf.spawn().unwrap();
    let mut pf_out = tokio::io::BufReader::new(pf.stdout.take().unwrap()).lines();
    let ready = tokio::time::timeout(Duration::from_secs(20), pf_out.next_line()).await.unwrap().unwrap();
    if !ready.as_deref().is_some_and(|l| l.starts_with("Forwarding from")) {
        let mut err = String::new();
        let _ = pf.stderr.take().unwrap().read_to_string(&mut err).await;
        panic!("kubectl port-forward: {ready:?}\n{err}");
    }
    for _ in 0..2 {
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", local)).await.unwrap();
        s.write_all(b"GET /index.html HTTP/1.0\r\nHost: x\r\n\r\n").await.unwrap();
        let mut resp = String::new();
        tokio::time::timeout(Duration::from_secs(20), s.read_to_string(&mut resp)).await.unwrap().unwrap();
        assert!(resp.starts_with("HTTP/1.") && resp.contains("hello-from-pod"), "{resp}");
    }
    pf.kill().await.unwrap();

    // Authorization by SubjectAccessReview against ferro-control-plane: its admin token (a
    // TokenReview names the admin, system:masters) may, a client certificate of the cluster CA
    // for a user without rights is authenticated but refused, in upstream's words, on every
    // path (for /pods after the fine-grained `pods` and then `proxy` were both denied).
    let token = std::fs::read_to_string(cp_dir.join("admin.kubeconfig"))
        .unwrap()
        .lines()
        .find_map(|l| l.trim().strip_prefix("token:").map(|t| t.trim().trim_matches('"').to_string()))
        .unwrap();
    let with_token = |path: &str, token: &str| {
        let mut c = tokio::process::Command::new("curl");
        c.args(["-sk", "--max-time", "10", "-w", "\n%{http_code}", "-H", &format!("Authorization: Bearer {token}")]);
        c.arg(format!("https://127.0.0.1:{port}{path}"));
        async move {
            let text = String::from_utf8(c.output().await.unwrap().stdout).unwrap();
            let (body, code) = text.rsplit_once('\n').unwrap();
            (code.to_string(), body.to_string())
        }
    };
    assert_eq!(with_token("/healthz", &token).await, ("200".into(), "ok\n".into()));
    assert_eq!(with_token("/healthz", "not-a-token").await.0, "401");
    let jane = Command::new(control_plane_bin())
        .arg("kubeconfig")
        .arg("--data-dir")
        .arg(&cp_dir)
        .args(["--user", "jane", "--server", "https://127.0.0.1:1"])
        .output()
        .unwrap();
    assert!(jane.status.success(), "{}", String::from_utf8_lossy(&jane.stderr));
    let jane: serde_yaml::Value = serde_yaml::from_slice(&jane.stdout).unwrap();
    use base64::Engine as _;
    let pem = |field: &str| {
        let b64 = jane["users"][0]["user"][field].as_str().unwrap();
        base64::engine::general_purpose::STANDARD.decode(b64).unwrap()
    };
    std::fs::write(dir.join("jane.crt"), pem("client-certificate-data")).unwrap();
    std::fs::write(dir.join("jane.key"), pem("client-key-data")).unwrap();
    for (path, sub) in [("/healthz", "proxy"), ("/pods", "proxy"), ("/metrics", "metrics"), ("/containerLogs/default/srv/c", "proxy")] {
        let out = tokio::process::Command::new("curl")
            .args(["-sk", "--max-time", "10", "-w", "\n%{http_code}", "--cert"])
            .arg(dir.join("jane.crt"))
            .arg("--key")
            .arg(dir.join("jane.key"))
            .arg(format!("https://127.0.0.1:{port}{path}"))
            .output()
            .await
            .unwrap();
        let text = String::from_utf8(out.stdout).unwrap();
        assert_eq!(
            text,
            format!("Forbidden (user=jane, verb=get, resource=nodes, subresource={sub})\n\n403"),
            "{path}"
        );
    }

    // The API server's kubelet-client certificate is accepted, no certificate is 401 (every
    // path), unknown pods and containers are 404s in upstream's words.
    for path in ["/healthz", "/pods", "/metrics", "/containerLogs/default/srv/c"] {
        assert_eq!(curl(path, false).await, ("401".into(), "Unauthorized\n".into()), "{path}");
    }
    assert_eq!(curl("/healthz", true).await, ("200".into(), "ok\n".into()));
    let (code, list) = curl("/pods", true).await;
    assert_eq!(code, "200");
    let list: serde_json::Value = serde_json::from_str(&list).unwrap();
    assert_eq!(list["kind"], "PodList");
    assert_eq!(list["items"][0]["metadata"]["name"], "srv");
    assert_eq!(
        curl("/containerLogs/default/nope/c", true).await,
        ("404".into(), "pod \"nope\" not found\n".into())
    );
    assert_eq!(
        curl("/containerLogs/default/srv/other", true).await,
        ("404".into(), "container \"other\" in pod \"srv\" is not available\n".into())
    );
    assert_eq!(
        curl("/containerLogs/default/srv/c?previous=true", true).await,
        ("400".into(), "previous terminated container \"c\" in pod \"srv\" not found\n".into())
    );
    let (code, metrics) = curl("/metrics", true).await;
    assert_eq!(code, "200");
    for want in [
        "ferro_agent_pods 1\n",
        "ferro_agent_running_containers 1\n",
        // One without credentials, one with a token the API server does not know.
        "ferro_agent_server_requests_total{path=\"healthz\",code=\"401\"} 2\n",
        // jane, refused by the SubjectAccessReviews.
        "ferro_agent_server_requests_total{path=\"healthz\",code=\"403\"} 1\n",
        "ferro_agent_server_requests_total{path=\"pods\",code=\"403\"} 1\n",
        "ferro_agent_server_requests_total{path=\"metrics\",code=\"403\"} 1\n",
        "ferro_agent_server_requests_total{path=\"containerLogs\",code=\"403\"} 1\n",
        "ferro_agent_server_requests_total{path=\"portForward\",code=\"101\"}",
        // kubectl's WebSocket requests (v5.channel.k8s.io, SPDY/3.1+portforward.k8s.io) were
        // served by the agent: 7 kubectl execs (one of them over SPDY) and 5 of the test's own
        // (one of them v4, spliced with the runtime's WebSocket server).
        "ferro_agent_server_requests_total{path=\"exec\",code=\"101\"} 12\n",
        "ferro_agent_stream_requests_total{path=\"exec\",protocol=\"websocket\"} 1\n",
        "ferro_agent_stream_requests_total{path=\"exec\",protocol=\"v5.channel.k8s.io\"} 10\n",
        "ferro_agent_stream_requests_total{path=\"exec\",protocol=\"spdy\"} 1\n",
        "ferro_agent_server_requests_total{path=\"attach\",code=\"101\"} 1\n",
        "ferro_agent_stream_requests_total{path=\"attach\",protocol=\"v5.channel.k8s.io\"} 1\n",
        "ferro_agent_stream_requests_total{path=\"portForward\",protocol=\"SPDY/3.1+portforward.k8s.io\"} 1\n",
        "process_resident_memory_bytes ",
    ] {
        assert!(metrics.contains(want), "{want} missing:\n{metrics}");
    }
    // No streaming request was refused and retried.
    for path in ["exec", "attach", "portForward"] {
        assert!(!metrics.contains(&format!("path=\"{path}\",code=\"403\"")), "{metrics}");
    }

    let _ = stop_tx.send(());
    server.await.unwrap().unwrap();
}
