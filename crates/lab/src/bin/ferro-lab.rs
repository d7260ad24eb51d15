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

use std::path::PathBuf;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use ferro_lab::containerd::{self, Layout, Options};
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
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().cmd {
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
    }
    Ok(())
}
