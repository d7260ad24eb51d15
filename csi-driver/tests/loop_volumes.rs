//! ferro-csi against the real host: each RPC over the unix socket with real loop devices,
//! mkfs, mounts and statvfs in a scratch dir (removed with everything in it, also on failure).
//! Privileged: run by the README's test command (`--include-ignored`).

use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferro_csi::proto::controller_client::ControllerClient;
use ferro_csi::proto::node_client::NodeClient;
use ferro_csi::proto::volume_capability::access_mode::Mode as AccessModeKind;
use ferro_csi::proto::volume_capability::{AccessMode, AccessType, BlockVolume, MountVolume};
use ferro_csi::proto::volume_content_source::{SnapshotSource, Type as SourceType};
use ferro_csi::proto::*;
use ferro_csi::service::{serve, Mode};
use ferro_csi::volume::engine::{Engine, EngineConfig};
use ferro_csi::volume::real::RealHost;
use ferro_lab::storage::Scratch;
use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint, Uri};
use tonic::Code;

const MIB: i64 = 1 << 20;

struct Driver {
    scratch: Scratch,
    socket: PathBuf,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<anyhow::Result<()>>>,
    ctl: ControllerClient<Channel>,
    node: NodeClient<Channel>,
}

async fn channel(socket: &Path) -> anyhow::Result<Channel> {
    let path = socket.to_path_buf();
    Ok(Endpoint::try_from("http://[::]:50051")?
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move { Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(path).await?)) }
        }))
        .await?)
}

impl Driver {
    async fn start(prefix: &str, pool: u64) -> Driver {
        let scratch = Scratch::new(prefix).expect("scratch dir (needs root)");
        Driver::start_in(scratch, pool).await
    }

    async fn start_in(scratch: Scratch, pool: u64) -> Driver {
        let socket = scratch.path().join("csi.sock");
        let engine = Arc::new(Engine::new(
            Arc::new(RealHost::default()),
            EngineConfig {
                node_id: "node-a".into(),
                data_dir: scratch.path().join("data"),
                pool_size: pool,
                allowed_roots: vec![scratch.path().join("kubelet")],
            },
        ));
        let recovered = Arc::clone(&engine);
        tokio::task::spawn_blocking(move || recovered.recover())
            .await
            .expect("join")
            .expect("recover");
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let sock = socket.clone();
        let task = tokio::spawn(async move {
            serve(engine, Mode::All, &sock, async {
                let _ = rx.await;
            })
            .await
        });
        // Wait for the socket to answer, not for a time.
        let deadline = Instant::now() + Duration::from_secs(30);
        let ch = loop {
            if let Ok(ch) = channel(&socket).await {
                break ch;
            }
            assert!(
                Instant::now() < deadline,
                "ferro-csi never answered on {}",
                socket.display()
            );
            tokio::task::yield_now().await;
        };
        Driver {
            scratch,
            socket,
            stop: Some(tx),
            task: Some(task),
            ctl: ControllerClient::new(ch.clone()),
            node: NodeClient::new(ch),
        }
    }

    /// Stops the server (as a restart would) and hands back the scratch dir.
    async fn stop(mut self) -> Scratch {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.task.take() {
            t.await.expect("join").expect("serve");
        }
        let _ = std::fs::remove_file(&self.socket);
        self.scratch
    }

    fn kubelet(&self, rel: &str) -> String {
        self.scratch
            .path()
            .join("kubelet")
            .join(rel)
            .to_string_lossy()
            .into_owned()
    }

    fn data(&self) -> PathBuf {
        self.scratch.path().join("data")
    }

    async fn create(
        &mut self,
        name: &str,
        bytes: i64,
        cap: VolumeCapability,
    ) -> Result<Volume, tonic::Status> {
        self.create_from(name, bytes, cap, None).await
    }

    async fn create_from(
        &mut self,
        name: &str,
        bytes: i64,
        cap: VolumeCapability,
        source: Option<VolumeContentSource>,
    ) -> Result<Volume, tonic::Status> {
        let r = self
            .ctl
            .create_volume(CreateVolumeRequest {
                name: name.into(),
                capacity_range: Some(CapacityRange {
                    required_bytes: bytes,
                    limit_bytes: 0,
                }),
                volume_capabilities: vec![cap],
                volume_content_source: source,
                ..Default::default()
            })
            .await?;
        Ok(r.into_inner().volume.expect("volume"))
    }

    async fn stage(
        &mut self,
        id: &str,
        staging: &str,
        cap: &VolumeCapability,
    ) -> Result<(), tonic::Status> {
        self.node
            .node_stage_volume(NodeStageVolumeRequest {
                volume_id: id.into(),
                staging_target_path: staging.into(),
                volume_capability: Some(cap.clone()),
                ..Default::default()
            })
            .await
            .map(drop)
    }

    async fn unstage(&mut self, id: &str, staging: &str) -> Result<(), tonic::Status> {
        self.node
            .node_unstage_volume(NodeUnstageVolumeRequest {
                volume_id: id.into(),
                staging_target_path: staging.into(),
            })
            .await
            .map(drop)
    }

    async fn publish(
        &mut self,
        id: &str,
        staging: &str,
        target: &str,
        cap: &VolumeCapability,
        readonly: bool,
    ) -> Result<(), tonic::Status> {
        self.node
            .node_publish_volume(NodePublishVolumeRequest {
                volume_id: id.into(),
                staging_target_path: staging.into(),
                target_path: target.into(),
                volume_capability: Some(cap.clone()),
                readonly,
                ..Default::default()
            })
            .await
            .map(drop)
    }

    async fn unpublish(&mut self, id: &str, target: &str) -> Result<(), tonic::Status> {
        self.node
            .node_unpublish_volume(NodeUnpublishVolumeRequest {
                volume_id: id.into(),
                target_path: target.into(),
            })
            .await
            .map(drop)
    }

    async fn delete(&mut self, id: &str) -> Result<(), tonic::Status> {
        self.ctl
            .delete_volume(DeleteVolumeRequest {
                volume_id: id.into(),
                ..Default::default()
            })
            .await
            .map(drop)
    }
}

fn mount_cap(fs: &str) -> VolumeCapability {
    VolumeCapability {
        access_type: Some(AccessType::Mount(MountVolume {
            fs_type: fs.into(),
            ..Default::default()
        })),
        access_mode: Some(AccessMode {
            mode: AccessModeKind::SingleNodeWriter as i32,
        }),
    }
}

fn block_cap() -> VolumeCapability {
    VolumeCapability {
        access_type: Some(AccessType::Block(BlockVolume {})),
        access_mode: Some(AccessMode {
            mode: AccessModeKind::SingleNodeWriter as i32,
        }),
    }
}

fn code<T: std::fmt::Debug>(r: Result<T, tonic::Status>) -> Code {
    match r {
        Ok(v) => panic!("expected an error, got {v:?}"),
        Err(s) => s.code(),
    }
}

fn mounted(path: &str) -> Option<String> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    text.lines().find_map(|l| {
        let f: Vec<&str> = l.split(' ').collect();
        let sep = f.iter().position(|x| *x == "-")?;
        (f[4] == path).then(|| format!("{} {} {}", f[sep + 1], f[sep + 2], f[5]))
    })
}

/// Waits for a condition the kernel settles asynchronously, with a deadline.
fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn backing(driver: &Driver, id: &str) -> PathBuf {
    driver.data().join("volumes").join(id).join("disk.img")
}

fn loops_of(file: &Path) -> Vec<String> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/sys/block").expect("sys").flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if let Ok(b) = std::fs::read_to_string(e.path().join("loop/backing_file")) {
            if name.starts_with("loop") && Path::new(b.trim_end()) == file {
                out.push(format!("/dev/{name}"));
            }
        }
    }
    out
}

async fn filesystem_lifecycle(fs: &str, bytes: i64) {
    let mut d = Driver::start(&format!("ferro-csi-{fs}-"), 4 << 30).await;
    let cap = mount_cap(fs);
    let vol = d
        .create("pvc-life", bytes, cap.clone())
        .await
        .expect("create");
    assert_eq!(
        d.create("pvc-life", bytes, cap.clone())
            .await
            .expect("create twice")
            .volume_id,
        vol.volume_id
    );
    assert_eq!(
        code(d.create("pvc-life", bytes * 2, cap.clone()).await),
        Code::AlreadyExists
    );
    let id = vol.volume_id.clone();
    let disk = backing(&d, &id);
    assert_eq!(
        std::fs::metadata(&disk).expect("backing file").len(),
        vol.capacity_bytes as u64
    );
    let (staging, target) = (
        d.kubelet("plugins/globalmount"),
        d.kubelet("pods/u1/volumes/mount"),
    );
    for _ in 0..2 {
        d.stage(&id, &staging, &cap)
            .await
            .expect("stage (twice: idempotent)");
    }
    let m = mounted(&staging).expect("staging mounted");
    assert!(m.starts_with(&format!("{fs} /dev/loop")), "{m}");
    for _ in 0..2 {
        d.publish(&id, &staging, &target, &cap, false)
            .await
            .expect("publish (twice)");
    }
    std::fs::write(Path::new(&target).join("data.txt"), b"survives")
        .expect("write through the target");

    let stats = d
        .node
        .node_get_volume_stats(NodeGetVolumeStatsRequest {
            volume_id: id.clone(),
            volume_path: target.clone(),
            ..Default::default()
        })
        .await
        .expect("stats")
        .into_inner();
    let bytes_usage = stats
        .usage
        .iter()
        .find(|u| u.unit == volume_usage::Unit::Bytes as i32)
        .expect("bytes");
    assert!(
        bytes_usage.total > 0 && bytes_usage.total <= vol.capacity_bytes,
        "{bytes_usage:?}"
    );
    assert!(stats
        .usage
        .iter()
        .any(|u| u.unit == volume_usage::Unit::Inodes as i32 && u.used > 0));
    assert_eq!(stats.volume_condition.map(|c| c.abnormal), Some(false));

    assert_eq!(
        code(d.delete(&id).await),
        Code::FailedPrecondition,
        "deleting a staged volume"
    );
    for _ in 0..2 {
        d.unpublish(&id, &target).await.expect("unpublish (twice)");
    }
    assert!(!Path::new(&target).exists(), "the target path is removed");
    for _ in 0..2 {
        d.unstage(&id, &staging).await.expect("unstage (twice)");
    }
    assert!(mounted(&staging).is_none());
    // Detached at unstage; a parallel test's losetup scanning devices may hold it open a
    // moment longer, and the kernel then lets it go at the last close.
    wait_until("the loop device detached at unstage", || loops_of(&disk).is_empty());
    // Staged again: the filesystem is found, not made again, and the data is there.
    d.stage(&id, &staging, &cap).await.expect("stage again");
    d.publish(&id, &staging, &target, &cap, true)
        .await
        .expect("publish read-only");
    assert_eq!(
        std::fs::read(Path::new(&target).join("data.txt")).expect("read"),
        b"survives"
    );
    let ro = std::fs::write(Path::new(&target).join("x"), b"no");
    assert_eq!(
        ro.map_err(|e| e.raw_os_error()),
        Err(Some(nix::libc::EROFS)),
        "read-only publish"
    );
    d.unpublish(&id, &target).await.expect("unpublish");
    d.unstage(&id, &staging).await.expect("unstage");
    for _ in 0..2 {
        d.delete(&id).await.expect("delete (twice)");
    }
    assert!(!disk.exists());
    wait_until("no loop device on the deleted volume", || loops_of(&disk).is_empty());
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "privileged: loop devices, mkfs and mounts"]
async fn ext4_volume_lifecycle_every_rpc_twice() {
    filesystem_lifecycle("ext4", 64 * MIB).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "privileged: loop devices, mkfs and mounts"]
async fn xfs_volume_lifecycle_every_rpc_twice() {
    filesystem_lifecycle("xfs", 300 * MIB).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "privileged: loop devices, mkfs and mounts"]
async fn a_loop_device_detached_by_hand_comes_back_with_its_data() {
    let mut d = Driver::start("ferro-csi-reattach-", 1 << 30).await;
    let cap = mount_cap("ext4");
    let id = d
        .create("pvc-re", 32 * MIB, cap.clone())
        .await
        .expect("create")
        .volume_id;
    let staging = d.kubelet("plugins/re/globalmount");
    d.stage(&id, &staging, &cap).await.expect("stage");
    std::fs::write(Path::new(&staging).join("keep"), b"data").expect("write");
    let disk = backing(&d, &id);
    // A reboot, by hand: the mount and the loop device go, the journal still says staged.
    nix::mount::umount2(Path::new(&staging), nix::mount::MntFlags::empty())
        .expect("umount by hand");
    for dev in loops_of(&disk) {
        ferro_lab::run(std::process::Command::new("losetup").args(["--detach", &dev]))
            .expect("losetup -d");
    }
    // Another process (a parallel test's losetup scanning devices) may hold the device open a
    // moment longer: the kernel then detaches it at the last close.
    wait_until("the loop device is gone", || loops_of(&disk).is_empty());
    // ferro-csi restarts: recovery re-attaches the staged volume's backing file.
    let scratch = d.stop().await;
    let mut d = Driver::start_in(scratch, 1 << 30).await;
    assert_eq!(loops_of(&disk).len(), 1, "re-attached at start-up");
    d.stage(&id, &staging, &cap)
        .await
        .expect("stage after the reboot");
    assert_eq!(
        std::fs::read(Path::new(&staging).join("keep")).expect("read"),
        b"data",
        "not formatted again"
    );
    // Detached again while unstaged, then staged: NodeStage attaches it itself.
    d.unstage(&id, &staging).await.expect("unstage");
    d.stage(&id, &staging, &cap).await.expect("stage");
    assert_eq!(
        std::fs::read(Path::new(&staging).join("keep")).expect("read"),
        b"data"
    );
    d.unstage(&id, &staging).await.expect("unstage");
    d.delete(&id).await.expect("delete");
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "privileged: loop devices, mkfs and mounts"]
async fn a_volume_holds_no_more_than_its_size() {
    let mut d = Driver::start("ferro-csi-enospc-", 1 << 30).await;
    let cap = mount_cap("ext4");
    let id = d
        .create("pvc-small", 16 * MIB, cap.clone())
        .await
        .expect("create")
        .volume_id;
    let staging = d.kubelet("plugins/small/globalmount");
    d.stage(&id, &staging, &cap).await.expect("stage");
    let mut f = std::fs::File::create(Path::new(&staging).join("fill")).expect("create");
    let chunk = vec![0xabu8; 1 << 20];
    let err = (0..64)
        .find_map(|_| f.write_all(&chunk).and_then(|_| f.sync_data()).err())
        .expect("a write past 16 MiB fails");
    assert_eq!(err.raw_os_error(), Some(nix::libc::ENOSPC), "{err}");
    drop(f);
    d.unstage(&id, &staging).await.expect("unstage");
    d.delete(&id).await.expect("delete");
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "privileged: loop devices, mkfs and mounts"]
async fn online_expansion_while_a_process_writes() {
    // XFS: growing a mounted ext4 needs CAP_SYS_RESOURCE, which this test machine's root
    // lacks (ferro-csi then answers FailedPrecondition saying so; ext4 grows offline at the
    // next stage, tested below).
    let mut d = Driver::start("ferro-csi-grow-", 1 << 30).await;
    let cap = mount_cap("xfs");
    let id = d
        .create("pvc-grow", 300 * MIB, cap.clone())
        .await
        .expect("create")
        .volume_id;
    let (staging, target) = (
        d.kubelet("plugins/grow/globalmount"),
        d.kubelet("pods/u/volumes/grow"),
    );
    d.stage(&id, &staging, &cap).await.expect("stage");
    d.publish(&id, &staging, &target, &cap, false)
        .await
        .expect("publish");
    let total = |p: &str| {
        nix::sys::statvfs::statvfs(Path::new(p))
            .map(|s| s.blocks() * s.fragment_size())
            .expect("statvfs")
    };
    let before = total(&target);
    // A writer that keeps writing through the expansion; it must never see an error.
    let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
    let file = Path::new(&target).join("stream");
    let writer = std::thread::spawn(move || -> std::io::Result<usize> {
        let mut f = std::fs::File::create(&file)?;
        let chunk = vec![7u8; 64 << 10];
        let mut written = 0;
        while stop_rx.try_recv().is_err() && written < (40 << 20) {
            f.write_all(&chunk)?;
            f.sync_data()?;
            written += chunk.len();
        }
        Ok(written)
    });
    let r = d
        .ctl
        .controller_expand_volume(ControllerExpandVolumeRequest {
            volume_id: id.clone(),
            capacity_range: Some(CapacityRange {
                required_bytes: 512 * MIB,
                limit_bytes: 0,
            }),
            ..Default::default()
        })
        .await
        .expect("controller expand")
        .into_inner();
    assert_eq!(
        (r.capacity_bytes, r.node_expansion_required),
        (512 * MIB, true)
    );
    let n = d
        .node
        .node_expand_volume(NodeExpandVolumeRequest {
            volume_id: id.clone(),
            volume_path: target.clone(),
            ..Default::default()
        })
        .await
        .expect("node expand")
        .into_inner();
    assert_eq!(n.capacity_bytes, 512 * MIB);
    let _ = stop_tx.send(());
    let written = writer
        .join()
        .expect("writer thread")
        .expect("the writer saw no error");
    assert!(written > 0);
    let after = total(&target);
    assert!(
        after > before + (150 << 20),
        "filesystem grew from {before} to {after}"
    );
    d.unpublish(&id, &target).await.expect("unpublish");
    d.unstage(&id, &staging).await.expect("unstage");
    d.delete(&id).await.expect("delete");
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "privileged: loop devices, mkfs and mounts"]
async fn an_ext4_volume_grown_while_unstaged_is_grown_at_the_next_stage() {
    let mut d = Driver::start("ferro-csi-grow4-", 1 << 30).await;
    let cap = mount_cap("ext4");
    let id = d
        .create("pvc-grow4", 64 * MIB, cap.clone())
        .await
        .expect("create")
        .volume_id;
    let staging = d.kubelet("plugins/grow4/globalmount");
    d.stage(&id, &staging, &cap).await.expect("stage");
    std::fs::write(Path::new(&staging).join("kept"), b"yes").expect("write");
    d.unstage(&id, &staging).await.expect("unstage");
    let r = d
        .ctl
        .controller_expand_volume(ControllerExpandVolumeRequest {
            volume_id: id.clone(),
            capacity_range: Some(CapacityRange {
                required_bytes: 256 * MIB,
                limit_bytes: 0,
            }),
            ..Default::default()
        })
        .await
        .expect("controller expand")
        .into_inner();
    assert_eq!(r.capacity_bytes, 256 * MIB);
    d.stage(&id, &staging, &cap).await.expect("stage");
    let total = nix::sys::statvfs::statvfs(Path::new(&staging))
        .map(|s| s.blocks() * s.fragment_size())
        .expect("statvfs");
    assert!(
        total > 200 << 20,
        "grown offline before mounting: {total} bytes"
    );
    assert_eq!(
        std::fs::read(Path::new(&staging).join("kept")).expect("read"),
        b"yes"
    );
    d.unstage(&id, &staging).await.expect("unstage");
    d.delete(&id).await.expect("delete");
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "privileged: loop devices and bind mounts"]
async fn a_raw_block_volume_is_a_block_device_in_the_pod() {
    let mut d = Driver::start("ferro-csi-block-", 1 << 30).await;
    let cap = block_cap();
    let id = d
        .create("pvc-raw", 8 * MIB, cap.clone())
        .await
        .expect("create")
        .volume_id;
    let (staging, target) = (
        d.kubelet("plugins/raw/staging"),
        d.kubelet("pods/u/volumeDevices/raw"),
    );
    d.stage(&id, &staging, &cap).await.expect("stage");
    d.publish(&id, &staging, &target, &cap, false)
        .await
        .expect("publish");
    d.publish(&id, &staging, &target, &cap, false)
        .await
        .expect("publish twice");
    let meta = std::fs::metadata(&target).expect("target");
    assert!(meta.file_type().is_block_device(), "{:?}", meta.file_type());
    {
        let mut dev = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&target)
            .expect("open device");
        dev.write_all(b"raw bytes").expect("write");
        dev.sync_all().expect("sync");
    }
    let mut head = [0u8; 9];
    std::fs::File::open(backing(&d, &id))
        .expect("backing")
        .read_exact(&mut head)
        .expect("read");
    assert_eq!(
        &head, b"raw bytes",
        "written through the device node into the backing file"
    );
    // Not a filesystem, and never made into one.
    d.unpublish(&id, &target).await.expect("unpublish");
    d.unstage(&id, &staging).await.expect("unstage");
    d.stage(&id, &staging, &cap).await.expect("stage again");
    d.unstage(&id, &staging).await.expect("unstage");
    std::fs::File::open(backing(&d, &id))
        .expect("backing")
        .read_exact(&mut head)
        .expect("read");
    assert_eq!(&head, b"raw bytes");
    d.delete(&id).await.expect("delete");
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "privileged: loop devices, mkfs, mounts and fsfreeze"]
async fn snapshot_of_a_mounted_volume_restores_into_a_larger_one() {
    let mut d = Driver::start("ferro-csi-snap-", 2 << 30).await;
    let cap = mount_cap("ext4");
    let id = d
        .create("pvc-src", 64 * MIB, cap.clone())
        .await
        .expect("create")
        .volume_id;
    let staging = d.kubelet("plugins/src/globalmount");
    d.stage(&id, &staging, &cap).await.expect("stage");
    std::fs::write(Path::new(&staging).join("snapshotted"), b"v1").expect("write");
    let snap = d
        .ctl
        .create_snapshot(CreateSnapshotRequest {
            source_volume_id: id.clone(),
            name: "snap-1".into(),
            ..Default::default()
        })
        .await
        .expect("snapshot")
        .into_inner()
        .snapshot
        .expect("snapshot");
    assert!(snap.ready_to_use && snap.source_volume_id == id);
    std::fs::write(Path::new(&staging).join("snapshotted"), b"v2")
        .expect("write after: the source is thawed");
    let listed = d
        .ctl
        .list_snapshots(ListSnapshotsRequest {
            source_volume_id: id.clone(),
            ..Default::default()
        })
        .await
        .expect("list")
        .into_inner();
    assert_eq!(listed.entries.len(), 1);

    let source = VolumeContentSource {
        r#type: Some(SourceType::Snapshot(SnapshotSource {
            snapshot_id: snap.snapshot_id.clone(),
        })),
    };
    assert_eq!(
        code(
            d.create_from("pvc-tiny", 32 * MIB, cap.clone(), Some(source.clone()))
                .await
        ),
        Code::OutOfRange
    );
    let restored = d
        .create_from("pvc-restored", 128 * MIB, cap.clone(), Some(source))
        .await
        .expect("restore")
        .volume_id;
    let staging2 = d.kubelet("plugins/restored/globalmount");
    d.stage(&restored, &staging2, &cap)
        .await
        .expect("stage restored");
    assert_eq!(
        std::fs::read(Path::new(&staging2).join("snapshotted")).expect("read"),
        b"v1"
    );
    let total = nix::sys::statvfs::statvfs(Path::new(&staging2))
        .map(|s| s.blocks() * s.fragment_size())
        .expect("statvfs");
    assert!(
        total > 100 << 20,
        "the restored filesystem grew to its volume ({total} bytes)"
    );
    for (vol, st) in [(&restored, &staging2), (&id, &staging)] {
        d.unstage(vol, st).await.expect("unstage");
        d.delete(vol).await.expect("delete");
    }
    d.ctl
        .delete_snapshot(DeleteSnapshotRequest {
            snapshot_id: snap.snapshot_id.clone(),
            ..Default::default()
        })
        .await
        .expect("delete snapshot");
    assert!(std::fs::read_dir(d.data().join("snapshots"))
        .expect("dir")
        .next()
        .is_none());
    d.stop().await;
}

/// The volume context kubelet sends with an inline volume of a podInfoOnMount driver.
fn inline_context(attrs: &[(&str, &str)]) -> HashMap<String, String> {
    let mut c: HashMap<String, String> = [
        ("csi.storage.k8s.io/pod.name", "app"),
        ("csi.storage.k8s.io/pod.namespace", "default"),
        ("csi.storage.k8s.io/pod.uid", "u1"),
        ("csi.storage.k8s.io/serviceAccount.name", "default"),
        ("csi.storage.k8s.io/ephemeral", "true"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    c.extend(attrs.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    c
}

impl Driver {
    /// NodePublishVolume of an inline volume, as kubelet calls it (no staging path).
    async fn publish_inline(
        &mut self,
        handle: &str,
        target: &str,
        fs: &str,
        attrs: &[(&str, &str)],
    ) -> Result<(), tonic::Status> {
        self.node
            .node_publish_volume(NodePublishVolumeRequest {
                volume_id: handle.into(),
                target_path: target.into(),
                volume_capability: Some(mount_cap(fs)),
                volume_context: inline_context(attrs),
                ..Default::default()
            })
            .await
            .map(drop)
    }

    /// Entries of a directory under the data dir (none when it does not exist).
    fn data_entries(&self, dir: &str) -> Vec<String> {
        std::fs::read_dir(self.data().join(dir))
            .map(|d| {
                d.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "privileged: loop devices, mkfs and mounts"]
async fn an_inline_volume_lives_from_publish_to_unpublish() {
    use ferro_csi::volume::names::ephemeral_volume_id;
    use ferro_csi::volume::names::Layout;
    use ferro_csi::volume::record::{Journal, State};

    let mut d = Driver::start("ferro-csi-inline-", 512 << 20).await;
    let handle = "csi-5ab1e0c0ffee";
    let target = d.kubelet("pods/u1/volumes/kubernetes.io~csi/scratch/mount");
    let size = [("size", "64Mi")];
    for _ in 0..2 {
        d.publish_inline(handle, &target, "", &size)
            .await
            .expect("publish (twice: idempotent)");
    }
    let m = mounted(&target).expect("the target is mounted");
    assert!(m.starts_with("ext4 /dev/loop"), "{m}");
    std::fs::write(Path::new(&target).join("f"), b"scratch").expect("write through the target");
    let id = ephemeral_volume_id(handle);
    let disk = backing(&d, &id);
    assert_eq!(std::fs::metadata(&disk).expect("backing file").len(), 64 << 20);
    assert_eq!(loops_of(&disk).len(), 1);
    let stats = d
        .node
        .node_get_volume_stats(NodeGetVolumeStatsRequest {
            volume_id: handle.into(),
            volume_path: target.clone(),
            ..Default::default()
        })
        .await
        .expect("stats by the CO's volume id")
        .into_inner();
    let bytes = stats
        .usage
        .iter()
        .find(|u| u.unit == volume_usage::Unit::Bytes as i32)
        .expect("bytes");
    assert!(bytes.total > 32 * MIB && bytes.total <= 64 * MIB && bytes.used > 0, "{bytes:?}");
    assert_eq!(stats.volume_condition.map(|c| c.abnormal), Some(false));

    // Conflicts and bad requests: the spec's codes, nothing made, the volume untouched.
    assert_eq!(
        code(d.publish_inline(handle, &target, "", &[("size", "128Mi")]).await),
        Code::AlreadyExists
    );
    let other = d.kubelet("pods/u2/volumes/kubernetes.io~csi/x/mount");
    assert_eq!(
        code(d.publish_inline("csi-other", &other, "", &[("colour", "blue")]).await),
        Code::InvalidArgument
    );
    assert_eq!(
        code(d.publish_inline("csi-other", &other, "", &[("size", "1Gi")]).await),
        Code::ResourceExhausted,
        "beyond the pool"
    );
    assert!(!Path::new(&other).exists(), "nothing created for a refused publish");
    assert_eq!(d.data_entries("volumes"), vec![id.clone()]);
    let vols = d
        .ctl
        .list_volumes(ListVolumesRequest::default())
        .await
        .expect("list")
        .into_inner();
    assert!(vols.entries.is_empty(), "an inline volume is not the Controller's");

    // Unpublish takes everything away; a second one answers OK.
    for _ in 0..2 {
        d.unpublish(handle, &target).await.expect("unpublish (twice)");
    }
    assert!(mounted(&target).is_none());
    assert!(!Path::new(&target).exists(), "the target path is removed");
    assert!(!disk.exists(), "the backing file is removed");
    wait_until("the inline volume's loop device detached", || {
        loops_of(&disk).is_empty()
    });
    assert!(d.data_entries("volumes").is_empty(), "{:?}", d.data_entries("volumes"));
    assert!(d.data_entries("staging").is_empty(), "{:?}", d.data_entries("staging"));
    assert!(d.scratch.mounts().is_empty(), "{:?}", d.scratch.mounts());

    // A crash in the middle of an unpublish (its intent recorded, nothing undone yet): the
    // restarted driver's recovery finishes it.
    d.publish_inline(handle, &target, "xfs", &[("size", "300Mi")])
        .await
        .expect("publish an xfs one");
    assert!(mounted(&target).expect("mounted").starts_with("xfs /dev/loop"));
    let scratch = d.stop().await;
    let journal = Journal::new(Layout::new(scratch.path().join("data")));
    let mut rec = journal.volume(&id).expect("read").expect("record");
    assert!(rec.ephemeral && rec.state == State::Ready, "{rec:?}");
    rec.state = State::Deleting;
    journal.put_volume(&rec).expect("put");
    let d = Driver::start_in(scratch, 1 << 30).await;
    assert!(mounted(&target).is_none(), "recovery unmounted the target");
    assert!(!disk.exists());
    wait_until("no loop device left", || loops_of(&disk).is_empty());
    assert!(d.data_entries("volumes").is_empty() && d.data_entries("staging").is_empty());
    assert!(d.scratch.mounts().is_empty(), "{:?}", d.scratch.mounts());
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "privileged: loop devices and mounts"]
async fn bad_input_gets_the_spec_code_and_creates_nothing() {
    let mut d = Driver::start("ferro-csi-bad-", 256 << 20).await;
    let rwx = VolumeCapability {
        access_type: Some(AccessType::Mount(MountVolume::default())),
        access_mode: Some(AccessMode {
            mode: AccessModeKind::MultiNodeMultiWriter as i32,
        }),
    };
    assert_eq!(
        code(d.create("rwx", 16 * MIB, rwx).await),
        Code::InvalidArgument
    );
    assert_eq!(
        code(d.create("ntfs", 16 * MIB, mount_cap("ntfs")).await),
        Code::InvalidArgument
    );
    assert_eq!(
        code(d.create("huge", 1 << 30, mount_cap("ext4")).await),
        Code::ResourceExhausted
    );
    assert_eq!(
        code(d.create("neg", -1, mount_cap("ext4")).await),
        Code::OutOfRange
    );
    let params = HashMap::from([("replication".to_string(), "3".to_string())]);
    let r = d
        .ctl
        .create_volume(CreateVolumeRequest {
            name: "params".into(),
            volume_capabilities: vec![mount_cap("")],
            parameters: params,
            ..Default::default()
        })
        .await;
    assert_eq!(code(r), Code::InvalidArgument);
    let r = d
        .ctl
        .create_volume(CreateVolumeRequest {
            name: "nocaps".into(),
            ..Default::default()
        })
        .await;
    assert_eq!(code(r), Code::InvalidArgument);
    let missing = "loop-00000000000000000000000000000000";
    let staging = d.kubelet("plugins/x/globalmount");
    assert_eq!(
        code(d.stage(missing, &staging, &mount_cap("")).await),
        Code::NotFound
    );
    assert_eq!(
        code(d.stage("../../../etc", &staging, &mount_cap("")).await),
        Code::NotFound
    );
    assert_eq!(
        code(d.unpublish(missing, &d.kubelet("pods/x")).await),
        Code::NotFound
    );
    d.delete(missing)
        .await
        .expect("deleting what does not exist is success");
    let id = d
        .create("ok", 16 * MIB, mount_cap("ext4"))
        .await
        .expect("create")
        .volume_id;
    for outside in [
        "/etc/ferro-csi-test",
        "relative",
        &format!("{}/../../etc", d.kubelet("a")),
    ] {
        assert_eq!(
            code(d.stage(&id, outside, &mount_cap("")).await),
            Code::InvalidArgument,
            "{outside}"
        );
    }
    assert!(!Path::new("/etc/ferro-csi-test").exists());
    assert_eq!(
        code(
            d.publish(&id, &staging, &d.kubelet("pods/p/t"), &mount_cap(""), false)
                .await
        ),
        Code::FailedPrecondition,
        "publish before stage"
    );
    assert!(
        !Path::new(&d.kubelet("pods/p/t")).exists(),
        "nothing created for a refused publish"
    );
    let r = d
        .ctl
        .controller_expand_volume(ControllerExpandVolumeRequest {
            volume_id: missing.into(),
            capacity_range: Some(CapacityRange {
                required_bytes: MIB,
                limit_bytes: 0,
            }),
            ..Default::default()
        })
        .await;
    assert_eq!(code(r), Code::NotFound);
    let r = d
        .ctl
        .list_volumes(ListVolumesRequest {
            starting_token: "bogus".into(),
            ..Default::default()
        })
        .await;
    assert_eq!(code(r), Code::Aborted);
    let vols = d
        .ctl
        .list_volumes(ListVolumesRequest::default())
        .await
        .expect("list")
        .into_inner();
    assert_eq!(vols.entries.len(), 1, "only the good volume exists");
    let files: Vec<_> = std::fs::read_dir(d.data().join("volumes"))
        .expect("dir")
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    d.delete(&id).await.expect("delete");
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "privileged: a unix socket in a scratch dir"]
async fn identity_and_node_info() {
    let d = Driver::start("ferro-csi-id-", 1 << 30).await;
    let ch = channel(&d.socket).await.expect("channel");
    let mut id = ferro_csi::proto::identity_client::IdentityClient::new(ch);
    let info = id
        .get_plugin_info(GetPluginInfoRequest {})
        .await
        .expect("info")
        .into_inner();
    assert_eq!(info.name, "loop.csi.ferro.dev");
    assert_eq!(
        id.probe(ProbeRequest {})
            .await
            .expect("probe")
            .into_inner()
            .ready,
        Some(true)
    );
    let mut node = d.node.clone();
    let ni = node
        .node_get_info(NodeGetInfoRequest {})
        .await
        .expect("node info")
        .into_inner();
    assert_eq!(ni.node_id, "node-a");
    assert_eq!(
        ni.accessible_topology.map(|t| t.segments),
        Some(HashMap::from([(
            "topology.loop.csi.ferro.dev/node".to_string(),
            "node-a".to_string()
        )]))
    );
    let mut ctl = d.ctl.clone();
    let cap = ctl
        .get_capacity(GetCapacityRequest::default())
        .await
        .expect("capacity")
        .into_inner();
    assert_eq!(cap.available_capacity, 1 << 30);
    d.stop().await;
}
