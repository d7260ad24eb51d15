//! ferro-lab: the pieces of the lab that scripts/up.sh needs, so the shell does not repeat the
//! fixture's Rust logic.
//!
//! - `images --out DIR`: builds the offline test images (static ferro-pause, Debian's
//!   busybox-static) as docker-archive tars `DIR/pause.tar` and `DIR/busybox.tar` and prints
//!   `pause DIR/pause.tar` and `busybox DIR/busybox.tar`.
//! - `containerd-config --dir D --run-dir R --sandbox-image X [--registry HOST:PORT]
//!   --cni-bin B --cni-conf C`: prints containerd's config.toml (root and opt under D, state,
//!   sockets and runc's root under R); with `--registry`, the CRI plugin's registry
//!   config_path is `D/certs.d` and `D/certs.d/HOST:PORT/hosts.toml` is written (plain http).
//! - `containerd-start-script --config C [--shim-dir S]`: prints the script to run with `ip
//!   netns exec NS sh`: cgroup mounts as this process sees them, the shim socket dir bound
//!   over /run/containerd, `exec containerd --config C`.
//! - `cri-pull --socket S IMAGE...`: pulls each image through CRI (ImageService.PullImage, so
//!   with the CRI plugin's registry config) and prints `IMAGE IMAGE-REF`.
//! - `cri-teardown --socket S`: stops and removes every pod sandbox through CRI (which stops
//!   their containers and calls CNI DEL), then prints how many there were.
//! - `cluster [--nodes N] [--pool-size Q] [--bin-dir D]`: the multi-node lab
//!   (ferro_lab::cluster) in the foreground: prints how to reach it, runs until SIGINT or
//!   SIGTERM, then removes everything it made (scripts/lab-up.sh).

use std::path::PathBuf;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use ferro_lab::containerd::{self, Layout, Options};
use ferro_lab::cri::{self, api};
use ferro_lab::images;

#[derive(Parser, Debug)]
#[command(name = "ferro-lab", about = "helpers of the ferro lab (scripts/up.sh)")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Build the test images (pause, busybox) as docker-archive tars in --out.
    Images {
        #[arg(long)]
        out: PathBuf,
    },
    /// Print containerd's config.toml (and write the registry's hosts.toml).
    ContainerdConfig {
        /// Persistent data: containerd's root, opt, the registry config_path (certs.d).
        #[arg(long)]
        dir: PathBuf,
        /// Run-time state: containerd's state, sockets, runc's root.
        #[arg(long)]
        run_dir: PathBuf,
        /// The CRI plugin's sandbox_image.
        #[arg(long)]
        sandbox_image: String,
        /// A registry (HOST:PORT) to pull from over plain http.
        #[arg(long)]
        registry: Option<String>,
        /// The CRI plugin's CNI bin_dir.
        #[arg(long)]
        cni_bin: PathBuf,
        /// The CRI plugin's CNI conf_dir.
        #[arg(long)]
        cni_conf: PathBuf,
    },
    /// Print the script that starts containerd inside `ip netns exec`.
    ContainerdStartScript {
        #[arg(long)]
        config: PathBuf,
        /// Bound over /run/containerd in containerd's mount namespace (shim sockets).
        #[arg(long)]
        shim_dir: Option<PathBuf>,
    },
    /// Pull images through CRI.
    CriPull {
        /// containerd's socket.
        #[arg(long)]
        socket: PathBuf,
        #[arg(required = true)]
        images: Vec<String>,
    },
    /// Stop and remove every pod sandbox through CRI.
    CriTeardown {
        /// containerd's socket.
        #[arg(long)]
        socket: PathBuf,
    },
    /// Run the multi-node lab until SIGINT or SIGTERM, then remove it.
    Cluster {
        #[arg(long, default_value_t = 3)]
        nodes: usize,
        /// Each node's ferro-csi pool.
        #[arg(long, default_value = "1Gi")]
        pool_size: String,
        /// Where ferro-control-plane, ferro-agent, ferro-netd, ferro-cni, ferro-proxy and
        /// ferro-csi are (default: this binary's directory).
        #[arg(long)]
        bin_dir: Option<PathBuf>,
        /// The control plane's --node-monitor-grace-period.
        #[arg(long, default_value = "40s")]
        node_monitor_grace_period: String,
    },
}

/// The multi-node lab in the foreground: up, then down at SIGINT or SIGTERM.
fn cluster(nodes: usize, pool_size: &str, bin_dir: Option<PathBuf>, grace: &str) -> anyhow::Result<()> {
    use ferro_lab::cluster::{node_ip, node_name, Bins, Cluster};
    anyhow::ensure!((1..=9).contains(&nodes), "--nodes {nodes}: between 1 and 9");
    let dir = match bin_dir {
        Some(d) => d,
        None => std::env::current_exe()?.parent().context("no directory of ferro-lab")?.to_path_buf(),
    };
    let pools = vec![pool_size; nodes];
    // From here a SIGINT or SIGTERM unwinds (during the start: a panic in the lab's next wait),
    // so whatever part of the lab exists is removed.
    ferro_lab::interrupt::unwind_on_signal()?;
    eprintln!("starting the control plane and {nodes} nodes (binaries from {})", dir.display());
    let c = Cluster::start_with(Bins::new(&dir)?, "cli", &pools, grace)?;
    let kubectl = format!("ip netns exec {} kubectl --kubeconfig {}", c.under.name(), c.admin_kubeconfig().display());
    println!("ferro cluster up: {nodes} nodes");
    for (i, n) in c.nodes.iter().enumerate() {
        println!("  {} {} (netns {}), logs in {}", node_name(i), node_ip(i), n.ns.name(), n.dir.display());
    }
    println!("  kubectl: {kubectl} get nodes");
    println!("stop with Ctrl-C or SIGTERM: everything is removed");
    let sig = loop {
        if let Some(sig) = ferro_lab::interrupt::received() {
            break sig;
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    };
    eprintln!("{sig}: stopping the cluster and removing what it made");
    drop(c);
    Ok(())
}

fn block_on<F: std::future::Future>(f: F) -> anyhow::Result<F::Output> {
    Ok(tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(f))
}

/// Waits (up to 60 s) until the CRI plugin answers Status: after a restart it takes a while
/// to recover its state ("server is not initialized yet") although containerd answers.
async fn wait_cri(
    runtime: &mut k8s_cri::v1::runtime_service_client::RuntimeServiceClient<
        tonic::transport::Channel,
    >,
) -> anyhow::Result<()> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        match runtime.status(api::StatusRequest { verbose: false }).await {
            Ok(_) => return Ok(()),
            Err(e) if std::time::Instant::now() > deadline => {
                anyhow::bail!(
                    "the CRI plugin did not answer Status within 60s: {}",
                    e.message()
                )
            }
            Err(_) => tokio::time::sleep(std::time::Duration::from_millis(250)).await,
        }
    }
}

async fn cri_pull(socket: &std::path::Path, images: &[String]) -> anyhow::Result<()> {
    let (mut runtime, mut image) = cri::connect(socket).await?;
    wait_cri(&mut runtime).await?;
    for name in images {
        let resp = image
            .pull_image(api::PullImageRequest {
                image: Some(api::ImageSpec {
                    image: name.clone(),
                    ..Default::default()
                }),
                auth: None,
                sandbox_config: None,
            })
            .await
            .with_context(|| format!("pull {name} through CRI"))?
            .into_inner();
        println!("{name} {}", resp.image_ref);
    }
    Ok(())
}

async fn cri_teardown(socket: &std::path::Path) -> anyhow::Result<()> {
    let (mut runtime, _) = cri::connect(socket).await?;
    wait_cri(&mut runtime).await?;
    let sandboxes = runtime
        .list_pod_sandbox(api::ListPodSandboxRequest { filter: None })
        .await
        .context("list pod sandboxes")?
        .into_inner()
        .items;
    let mut failed = Vec::new();
    for sb in &sandboxes {
        let id = sb.id.clone();
        let stop = runtime
            .stop_pod_sandbox(api::StopPodSandboxRequest {
                pod_sandbox_id: id.clone(),
            })
            .await;
        let remove = runtime
            .remove_pod_sandbox(api::RemovePodSandboxRequest {
                pod_sandbox_id: id.clone(),
            })
            .await;
        if let Some(e) = stop.err().or(remove.err()) {
            failed.push(format!("{id}: {}", e.message()));
        }
    }
    println!("{} pod sandboxes removed", sandboxes.len() - failed.len());
    if !failed.is_empty() {
        anyhow::bail!("some pod sandboxes were not removed: {}", failed.join("; "));
    }
    Ok(())
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().cmd {
        Cmd::Cluster { nodes, pool_size, bin_dir, node_monitor_grace_period } => {
            cluster(nodes, &pool_size, bin_dir, &node_monitor_grace_period)?;
        }
        Cmd::Images { out } => {
            std::fs::create_dir_all(&out).with_context(|| format!("create {}", out.display()))?;
            let pause = images::build_static_pause()?;
            // umoci refuses an existing layout: build in a fresh dir, keep only the tars.
            let work = tempfile::Builder::new()
                .prefix("images-")
                .tempdir_in(&out)?;
            let tars = images::build_images(work.path(), &pause)?;
            for (name, tar) in [("pause", &tars.pause), ("busybox", &tars.busybox)] {
                let dest = out.join(format!("{name}.tar"));
                std::fs::rename(tar, &dest)
                    .with_context(|| format!("move {} to {}", tar.display(), dest.display()))?;
                println!("{name} {}", dest.display());
            }
        }
        Cmd::ContainerdConfig {
            dir,
            run_dir,
            sandbox_image,
            registry,
            cni_bin,
            cni_conf,
        } => {
            let mut layout = Layout::split(&dir, &run_dir, &cni_bin, &cni_conf);
            match (&registry, &layout.registry_config_path) {
                (Some(host), Some(path)) => {
                    containerd::write_registry_hosts(path, host)?;
                }
                _ => layout.registry_config_path = None,
            }
            let opts = Options {
                sandbox_image,
                cni_plugins: Vec::new(),
                cni_configs: Vec::new(),
                runtime_binary: None,
                root_fs_bytes: None,
            };
            print!("{}", containerd::render_config(&layout, &opts));
        }
        Cmd::ContainerdStartScript { config, shim_dir } => {
            let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")?;
            print!(
                "{}",
                containerd::start_script(&mountinfo, &config, shim_dir.as_deref())
            );
        }
        Cmd::CriPull { socket, images } => block_on(cri_pull(&socket, &images))??,
        Cmd::CriTeardown { socket } => block_on(cri_teardown(&socket))??,
    }
    Ok(())
}
