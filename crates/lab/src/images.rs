//! Test images built offline.
//!
//! Both images are OCI layouts made with `umoci` (`init`, `new`, `insert`, `config`) from a
//! root filesystem assembled here, then written as docker-archive tars by `skopeo copy` so
//! `ctr images import` takes them with their names. Why not a registry: importing needs no
//! extra process, port or `hosts.toml`, and CRI finds an imported sandbox image locally, so
//! nothing is ever pulled (see docs/design/lab.md).

use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

use crate::{require_bin, run};

/// The name of the pause image (the CRI plugin's `sandbox_image`).
pub const PAUSE_IMAGE: &str = "registry.ferro.test/pause:1";
/// The name of the busybox image.
pub const BUSYBOX_IMAGE: &str = "registry.ferro.test/busybox:1";
/// The name of the demo operator's image (deploy/demo-operator/operator.yaml names it).
pub const DEMO_OPERATOR_IMAGE: &str = "registry.ferro.test/demo-operator:1";
/// The user the demo operator's image runs as (a non-root uid with no name).
pub const DEMO_OPERATOR_USER: &str = "65532";

/// Every applet `busybox` offers (`busybox --list`).
fn applets(busybox: &Path) -> Result<Vec<String>> {
    let out = run(Command::new(busybox).arg("--list"))?;
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::trim)
        .filter(|a| !a.is_empty() && *a != "busybox" && !a.contains('/'))
        .map(str::to_string)
        .collect())
}

/// The workspace root (this crate is `crates/lab`).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The host's Rust target triple, from `rustc -vV`.
fn host_triple(cargo: &str) -> Result<String> {
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| {
        Path::new(cargo)
            .parent()
            .map(|d| d.join("rustc"))
            .filter(|p| p.is_file())
            .map(|p| p.display().to_string())
            .unwrap_or_else(|| "rustc".into())
    });
    let out = run(Command::new(rustc).arg("-vV"))?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("host: "))
        .map(str::to_string)
        .context("rustc -vV printed no host triple")
}

/// Where the lab's static builds go: `lab-static` under cargo's target directory
/// (`CARGO_TARGET_DIR` when set, as for the build running the tests, relative paths taken from
/// the workspace root; else `<workspace>/target`). Its own directory, because the RUSTFLAGS
/// and `--target` of a static build would otherwise invalidate the workspace's artifacts.
pub fn static_target_dir() -> PathBuf {
    let root = workspace_root();
    std::env::var_os("CARGO_TARGET_DIR")
        .filter(|d| !d.is_empty())
        .map(|d| root.join(d))
        .unwrap_or_else(|| root.join("target"))
        .join("lab-static")
}

/// Builds binary `bin` of `package` statically linked (`RUSTFLAGS=-C
/// target-feature=+crt-static`, with an explicit `--target <host triple>` so build scripts and
/// proc macros stay dynamic) into [`static_target_dir`], in `profile` (`release` or `dev`),
/// with `extra_rustflags` added, and checks with `file` that the result really is static.
/// Returns the binary's path.
fn build_static(package: &str, bin: &str, profile: &str, extra_rustflags: &str) -> Result<PathBuf> {
    require_bin("file", "file")?;
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let triple = host_triple(&cargo)?;
    let root = workspace_root();
    let target_dir = static_target_dir();
    run(Command::new(&cargo)
        .current_dir(&root)
        .env("RUSTFLAGS", format!("-C target-feature=+crt-static {extra_rustflags}"))
        .args(["build", "--profile", profile, "-p", package, "--bin", bin, "--target", &triple])
        .arg("--target-dir")
        .arg(&target_dir))?;
    let dir = if profile == "dev" { "debug" } else { profile };
    let path = target_dir.join(&triple).join(dir).join(bin);
    check_static(&path)?;
    Ok(path)
}

/// Builds ferro's `pause` (crate `ferro-pause`) statically linked, in release (see
/// [`build_static`]). Returns the binary's path.
pub fn build_static_pause() -> Result<PathBuf> {
    build_static("ferro-pause", "pause", "release", "")
}

/// Builds the demo operator (crate `ferro-demo-operator`, a kube-rs program) statically linked
/// (see [`build_static`]) in the dev profile: the workspace's dev profile optimises
/// dependencies (opt-level 1), and a release build of the kube-rs stack costs minutes more on
/// two cores; debug info is stripped (the binary shrinks from ~85 MB to a fraction, which
/// umoci compresses into the layer on every image build). Cargo's incremental build in
/// [`static_target_dir`] is the cache: only a change of the operator or its dependencies
/// rebuilds it. Returns the binary's path.
pub fn build_static_demo_operator() -> Result<PathBuf> {
    build_static("ferro-demo-operator", "ferro-demo-operator", "dev", "-C strip=debuginfo")
}

/// The demo operator's image under `work` from its static binary `bin`: only
/// `/ferro-demo-operator` (entrypoint), run as [`DEMO_OPERATOR_USER`], named
/// [`DEMO_OPERATOR_IMAGE`]. Returns the docker-archive tar.
pub fn demo_operator_image(work: &Path, bin: &Path) -> Result<PathBuf> {
    let root = work.join("demo-operator-rootfs");
    std::fs::create_dir_all(&root)?;
    std::fs::copy(bin, root.join("ferro-demo-operator"))?;
    image_as(
        work,
        "demo-operator",
        &root,
        &["/ferro-demo-operator"],
        &[],
        DEMO_OPERATOR_IMAGE,
        Some(DEMO_OPERATOR_USER),
    )
}

/// Fails unless `file` calls `bin` statically linked.
pub fn check_static(bin: &Path) -> Result<()> {
    let out = run(Command::new("file").arg("-L").arg(bin))?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !text.contains("statically linked") && !text.contains("static-pie linked") {
        bail!("{} is not static: {text}", bin.display());
    }
    Ok(())
}

/// The docker-archive tars of the two test images.
#[derive(Debug, Clone)]
pub struct ImageTars {
    pub pause: PathBuf,
    pub busybox: PathBuf,
}

impl ImageTars {
    /// The two tars [`build_images`] (or `ferro-lab images --out DIR`) wrote to `dir` earlier:
    /// `pause.tar` and `busybox.tar`; an error names the one missing.
    pub fn prebuilt(dir: &Path) -> Result<ImageTars> {
        let (pause, busybox) = (dir.join("pause.tar"), dir.join("busybox.tar"));
        for t in [&pause, &busybox] {
            if !t.is_file() {
                bail!("{} is missing: make the images with `ferro-lab images --out {}`", t.display(), dir.display());
            }
        }
        Ok(ImageTars { pause, busybox })
    }
}

/// Builds both images under `work` from `pause_bin` and Debian's /bin/busybox.
pub fn build_images(work: &Path, pause_bin: &Path) -> Result<ImageTars> {
    require_bin("umoci", "umoci")?;
    require_bin("skopeo", "skopeo")?;
    let busybox = Path::new("/bin/busybox");
    if !busybox.is_file() {
        bail!("/bin/busybox is missing: apt-get install -y busybox-static");
    }
    check_static(busybox).context("the busybox image needs Debian's busybox-static")?;

    let pause_root = work.join("pause-rootfs");
    std::fs::create_dir_all(&pause_root)?;
    std::fs::copy(pause_bin, pause_root.join("pause"))?;
    let pause = image(work, "pause", &pause_root, &["/pause"], &[], PAUSE_IMAGE)?;

    let bb_root = work.join("busybox-rootfs");
    let bin = bb_root.join("bin");
    std::fs::create_dir_all(&bin)?;
    for d in ["tmp", "etc", "proc", "sys", "dev", "www"] {
        std::fs::create_dir_all(bb_root.join(d))?;
    }
    std::fs::copy(busybox, bin.join("busybox"))?;
    // As the busybox image users know: every applet, no entrypoint, Cmd ["sh"].
    for a in applets(busybox)? {
        symlink("busybox", bin.join(a))?;
    }
    std::fs::write(bb_root.join("etc/passwd"), "root:x:0:0:root:/:/bin/sh\n")?;
    std::fs::write(bb_root.join("etc/group"), "root:x:0:\n")?;
    let busybox = image(work, "busybox", &bb_root, &[], &["sh"], BUSYBOX_IMAGE)?;
    Ok(ImageTars { pause, busybox })
}

/// One image: OCI layout `<work>/<name>-oci:<name>` with `rootfs` as its only layer,
/// `entrypoint` and `cmd` (each left unset when empty), then `skopeo copy` to
/// `<work>/<name>.tar` named `reference`. Public so that a test can make an image of its own
/// (e.g. one that no container uses).
pub fn image(
    work: &Path,
    name: &str,
    rootfs: &Path,
    entrypoint: &[&str],
    cmd: &[&str],
    reference: &str,
) -> Result<PathBuf> {
    image_as(work, name, rootfs, entrypoint, cmd, reference, None)
}

/// As [`image`], with the image config's `User` set to `user` (e.g. `1000`) when given.
pub fn image_as(
    work: &Path,
    name: &str,
    rootfs: &Path,
    entrypoint: &[&str],
    cmd: &[&str],
    reference: &str,
    user: Option<&str>,
) -> Result<PathBuf> {
    let layout = work.join(format!("{name}-oci"));
    let img = format!("{}:{name}", layout.display());
    run(Command::new("umoci")
        .args(["init", "--layout"])
        .arg(&layout))?;
    run(Command::new("umoci").args(["new", "--image", &img]))?;
    run(Command::new("umoci")
        .args(["insert", "--image", &img])
        .arg(rootfs)
        .arg("/"))?;
    let mut config = Command::new("umoci");
    config.args(["config", "--image", &img]);
    for e in entrypoint {
        config.arg(format!("--config.entrypoint={e}"));
    }
    for c in cmd {
        config.arg(format!("--config.cmd={c}"));
    }
    if let Some(u) = user {
        config.arg(format!("--config.user={u}"));
    }
    run(&mut config)?;
    let tar = work.join(format!("{name}.tar"));
    run(Command::new("skopeo")
        .args(["copy", "--quiet"])
        .arg(format!("oci:{img}"))
        .arg(format!("docker-archive:{}:{reference}", tar.display())))?;
    Ok(tar)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn prebuilt_images_need_both_tars() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("pause.tar"), b"x").unwrap();
        let err = ImageTars::prebuilt(d.path()).unwrap_err().to_string();
        assert!(err.contains("busybox.tar is missing"), "{err}");
        std::fs::write(d.path().join("busybox.tar"), b"x").unwrap();
        let tars = ImageTars::prebuilt(d.path()).unwrap();
        assert_eq!(tars.pause, d.path().join("pause.tar"));
        assert_eq!(tars.busybox, d.path().join("busybox.tar"));
    }
}
