//! The engine against the recording host: idempotency, never formatting twice, recovery from
//! every crash point of create and delete, snapshots made frozen, growth.

use std::collections::HashMap;
use std::sync::Arc;

use super::controller::{page, CreateRequest};
use super::engine::{Engine, EngineConfig, EngineError};
use super::fake::RecordingHost;
use super::host::{Content, Host};
use super::names::{snapshot_id, volume_id};
use super::plan::{PlanError, GIB, MIB};
use super::record::{FsType, Provisioning, Source, State, VolumeRecord};
use crate::proto::volume_capability::access_mode::Mode;
use crate::proto::volume_capability::{AccessMode, AccessType, BlockVolume, MountVolume};
use crate::proto::{CapacityRange, VolumeCapability};

struct World {
    _dir: tempfile::TempDir,
    host: Arc<RecordingHost>,
    engine: Engine<RecordingHost>,
}

fn world(pool: u64) -> World {
    let dir = tempfile::tempdir().expect("tempdir");
    let host = Arc::new(RecordingHost::new(100 * GIB));
    let engine = Engine::new(
        Arc::clone(&host),
        EngineConfig {
            node_id: "node-a".into(),
            data_dir: dir.path().to_path_buf(),
            pool_size: pool,
            allowed_roots: vec!["/stage".into(), "/pods".into()],
        },
    );
    World {
        _dir: dir,
        host,
        engine,
    }
}

impl World {
    /// The same host and data dir under a fresh engine: ferro-csi restarted.
    fn restart(&mut self) {
        self.engine = Engine::new(Arc::clone(&self.host), self.engine.config().clone());
    }
}

fn mount_cap(fs: &str) -> VolumeCapability {
    VolumeCapability {
        access_type: Some(AccessType::Mount(MountVolume {
            fs_type: fs.into(),
            ..Default::default()
        })),
        access_mode: Some(AccessMode {
            mode: Mode::SingleNodeWriter as i32,
        }),
    }
}

fn block_cap() -> VolumeCapability {
    VolumeCapability {
        access_type: Some(AccessType::Block(BlockVolume {})),
        access_mode: Some(AccessMode {
            mode: Mode::SingleNodeWriter as i32,
        }),
    }
}

fn create(
    w: &World,
    name: &str,
    bytes: u64,
    cap: VolumeCapability,
    source: Option<Source>,
) -> Result<VolumeRecord, EngineError> {
    let range = CapacityRange {
        required_bytes: bytes as i64,
        limit_bytes: 0,
    };
    w.engine.create_volume(CreateRequest {
        name,
        range: Some(&range),
        capabilities: &[cap],
        parameters: &HashMap::new(),
        source,
    })
}

fn plan_err(r: Result<impl std::fmt::Debug, EngineError>) -> PlanError {
    match r {
        Err(EngineError::Plan(p)) => p,
        other => panic!("expected a plan error, got {other:?}"),
    }
}

#[test]
fn create_is_idempotent_by_name_and_a_conflict_creates_nothing() {
    let w = world(10 * GIB);
    let rec = create(&w, "pvc-1", 64 * MIB, mount_cap("ext4"), None).expect("create");
    assert_eq!((rec.size, rec.state), (64 * MIB, State::Ready));
    let disk = w.engine.layout().volume_disk(&rec.id);
    assert_eq!(w.host.files(), vec![disk.clone()]);
    w.host.clear_calls();
    assert_eq!(
        create(&w, "pvc-1", 64 * MIB, mount_cap("ext4"), None).expect("again"),
        rec
    );
    assert!(
        w.host.calls().is_empty(),
        "a retry touched the host: {:?}",
        w.host.calls()
    );
    assert!(matches!(
        plan_err(create(&w, "pvc-1", 128 * MIB, mount_cap("ext4"), None)),
        PlanError::AlreadyExists(_)
    ));
    assert!(matches!(
        plan_err(create(&w, "pvc-1", 64 * MIB, block_cap(), None)),
        PlanError::AlreadyExists(_)
    ));
    assert_eq!(w.host.files(), vec![disk]);
}

#[test]
fn bad_requests_create_nothing() {
    let w = world(GIB);
    assert!(matches!(
        plan_err(create(&w, "", MIB, mount_cap(""), None)),
        PlanError::InvalidArgument(_)
    ));
    assert!(matches!(
        plan_err(create(&w, "big", 2 * GIB, mount_cap(""), None)),
        PlanError::ResourceExhausted(_)
    ));
    assert!(matches!(
        plan_err(create(&w, "fs", MIB, mount_cap("btrfs"), None)),
        PlanError::InvalidArgument(_)
    ));
    let params = HashMap::from([("replicas".to_string(), "2".to_string())]);
    let r = w.engine.create_volume(CreateRequest {
        name: "p",
        range: None,
        capabilities: &[mount_cap("")],
        parameters: &params,
        source: None,
    });
    assert!(matches!(plan_err(r), PlanError::InvalidArgument(_)));
    let missing = Some(Source::Snapshot(snapshot_id("nope")));
    assert!(matches!(
        plan_err(create(&w, "s", MIB, mount_cap(""), missing)),
        PlanError::NotFound(_)
    ));
    let foreign = Some(Source::Volume("../../etc".into()));
    assert!(matches!(
        plan_err(create(&w, "v", MIB, mount_cap(""), foreign)),
        PlanError::NotFound(_)
    ));
    assert!(w.host.files().is_empty());
    assert!(w.engine.journal().volumes().expect("list").is_empty());
}

#[test]
fn pool_accounting_counts_thin_volumes_at_their_size() {
    let w = world(GIB);
    create(&w, "a", 600 * MIB, mount_cap(""), None).expect("a");
    assert_eq!(w.engine.available().expect("available"), 424 * MIB);
    assert!(matches!(
        plan_err(create(&w, "b", 500 * MIB, mount_cap(""), None)),
        PlanError::ResourceExhausted(_)
    ));
    create(&w, "c", 424 * MIB, mount_cap(""), None).expect("exactly what is left");
    assert_eq!(w.engine.available().expect("available"), 0);
}

#[test]
fn a_failed_create_leaves_nothing_and_a_retry_makes_the_volume() {
    let w = world(GIB);
    w.host.fail_next("create_file");
    assert!(matches!(
        create(&w, "pvc-x", 32 * MIB, mount_cap(""), None),
        Err(EngineError::Host(_))
    ));
    assert!(w.host.files().is_empty());
    assert!(w.engine.journal().volumes().expect("list").is_empty());
    create(&w, "pvc-x", 32 * MIB, mount_cap(""), None).expect("retry");
    assert_eq!(w.host.files().len(), 1);
}

#[test]
fn recovery_rolls_back_creates_finishes_deletes_and_removes_strays() {
    let mut w = world(10 * GIB);
    let layout = w.engine.layout().clone();
    // A create that crashed after its record and file.
    let half = create(&w, "half", 32 * MIB, mount_cap(""), None).expect("create");
    let mut creating = half.clone();
    creating.state = State::Creating;
    w.engine.journal().put_volume(&creating).expect("put");
    // A delete that crashed after detaching nothing yet.
    let going = create(&w, "going", 32 * MIB, block_cap(), None).expect("create");
    w.engine
        .stage(&going.id, "/stage/going", Some(&block_cap()))
        .expect("stage");
    let mut deleting = w
        .engine
        .journal()
        .volume(&going.id)
        .expect("read")
        .expect("record");
    deleting.state = State::Deleting;
    w.engine.journal().put_volume(&deleting).expect("put");
    // A create that crashed before its first record.
    std::fs::create_dir_all(layout.volume_dir(&volume_id("stray"))).expect("mkdir");
    // A snapshot cut off mid-copy.
    let kept = create(&w, "kept", 32 * MIB, mount_cap(""), None).expect("create");
    w.host.fail_next("copy_file");
    assert!(w.engine.create_snapshot(&kept.id, "snap").is_err());

    w.restart();
    let report = w.engine.recover().expect("recover");
    assert_eq!(report.rolled_back, vec![half.id.clone()]);
    assert_eq!(report.deleted, vec![going.id.clone()]);
    assert_eq!(report.strays_removed, vec![volume_id("stray")]);
    assert!(
        w.host.loops().is_empty(),
        "loops left: {:?}",
        w.host.loops()
    );
    assert_eq!(w.host.files(), vec![layout.volume_disk(&kept.id)]);
    let left: Vec<String> = w
        .engine
        .journal()
        .volumes()
        .expect("list")
        .into_iter()
        .map(|r| r.id)
        .collect();
    assert_eq!(left, vec![kept.id.clone()]);
    assert!(w.engine.journal().snapshots().expect("list").is_empty());
    assert_eq!(
        w.engine.recover().expect("again"),
        Default::default(),
        "recovery is idempotent"
    );
}

#[test]
fn staging_formats_once_and_never_again() {
    let w = world(GIB);
    let xfs = create(&w, "pvc-f", 64 * MIB, mount_cap("xfs"), None).expect("xfs");
    assert_eq!(xfs.size, 300 * MIB, "mkfs.xfs's minimum");
    let rec = create(&w, "pvc-e", 64 * MIB, mount_cap("ext4"), None).expect("create");
    let cap = mount_cap("ext4");
    w.host.clear_calls();
    w.engine
        .stage(&rec.id, "/stage/e", Some(&cap))
        .expect("stage");
    let calls = w.host.calls();
    let disk = w.engine.layout().volume_disk(&rec.id);
    assert_eq!(
        calls,
        vec![
            format!("attach {}", disk.display()),
            "make_dir /stage/e".to_string(),
            "format /dev/loop0 ext4".to_string(),
            "mount /dev/loop0 /stage/e ext4".to_string(),
        ]
    );
    assert_eq!(
        w.engine
            .journal()
            .volume(&rec.id)
            .expect("read")
            .expect("rec")
            .formatted,
        Some(FsType::Ext4)
    );
    w.host.clear_calls();
    w.engine
        .stage(&rec.id, "/stage/e", Some(&cap))
        .expect("stage twice");
    assert!(w.host.calls().is_empty(), "{:?}", w.host.calls());
    w.engine.unstage(&rec.id, "/stage/e").expect("unstage");
    assert_eq!(
        w.host.calls(),
        vec![
            "unmount /stage/e".to_string(),
            "detach /dev/loop0".to_string()
        ]
    );
    w.engine
        .unstage(&rec.id, "/stage/e")
        .expect("unstage twice");
    w.host.clear_calls();
    w.engine
        .stage(&rec.id, "/stage/e", Some(&cap))
        .expect("stage again");
    assert!(
        !w.host.calls().iter().any(|c| c.starts_with("format")),
        "formatted again: {:?}",
        w.host.calls()
    );
    // The superblock is wiped behind ferro's back: it refuses rather than format.
    w.engine.unstage(&rec.id, "/stage/e").expect("unstage");
    w.host.set_content(&disk, Content::Blank);
    assert!(matches!(
        plan_err(w.engine.stage(&rec.id, "/stage/e", Some(&cap))),
        PlanError::FailedPrecondition(_)
    ));
    assert!(!w.host.calls().iter().any(|c| c.starts_with("format")));
    // An xfs capability on an ext4 volume is refused, not reformatted.
    w.host.set_content(&disk, Content::Fs(FsType::Ext4));
    assert!(matches!(
        plan_err(w.engine.stage(&rec.id, "/stage/e", Some(&mount_cap("xfs")))),
        PlanError::FailedPrecondition(_)
    ));
}

#[test]
fn a_staged_volume_that_lost_its_loop_device_is_reattached_at_start_up() {
    let mut w = world(GIB);
    let rec = create(&w, "pvc-r", 64 * MIB, mount_cap(""), None).expect("create");
    w.engine
        .stage(&rec.id, "/stage/r", Some(&mount_cap("")))
        .expect("stage");
    // A reboot: loop devices and mounts are gone, the files and the journal stay.
    w.host.lose_loops();
    w.host
        .unmount(std::path::Path::new("/stage/r"))
        .expect("drop mount");
    w.restart();
    let report = w.engine.recover().expect("recover");
    assert_eq!(report.reattached, vec![rec.id.clone()]);
    assert_eq!(w.host.loops().len(), 1);
    w.host.clear_calls();
    w.engine
        .stage(&rec.id, "/stage/r", Some(&mount_cap("")))
        .expect("stage after reboot");
    assert_eq!(
        w.host.calls(),
        vec!["mount /dev/loop1 /stage/r ext4".to_string()],
        "no format, no second attach"
    );
}

#[test]
fn delete_refuses_a_volume_in_use_and_is_idempotent() {
    let w = world(GIB);
    let rec = create(&w, "pvc-d", 64 * MIB, mount_cap(""), None).expect("create");
    w.engine
        .stage(&rec.id, "/stage/d", Some(&mount_cap("")))
        .expect("stage");
    w.engine
        .publish(
            &rec.id,
            "/stage/d",
            "/pods/u/vol",
            Some(&mount_cap("")),
            false,
        )
        .expect("publish");
    assert!(matches!(
        plan_err(w.engine.delete_volume(&rec.id)),
        PlanError::FailedPrecondition(_)
    ));
    assert!(
        matches!(plan_err(w.engine.unstage(&rec.id, "/stage/d")), PlanError::FailedPrecondition(m) if m.contains("/pods/u/vol"))
    );
    w.engine
        .unpublish(&rec.id, "/pods/u/vol")
        .expect("unpublish");
    w.engine
        .unpublish(&rec.id, "/pods/u/vol")
        .expect("unpublish twice");
    w.engine.unstage(&rec.id, "/stage/d").expect("unstage");
    w.engine.delete_volume(&rec.id).expect("delete");
    assert!(
        w.host.files().is_empty() && w.host.loops().is_empty() && w.host.mount_points().is_empty()
    );
    w.engine.delete_volume(&rec.id).expect("delete twice");
    w.engine
        .delete_volume("not-a-volume")
        .expect("unknown ids are deleted already");
    assert!(matches!(
        plan_err(w.engine.delete_volume("")),
        PlanError::InvalidArgument(_)
    ));
}

#[test]
fn node_calls_on_unknown_volumes_and_missing_fields() {
    let w = world(GIB);
    let unknown = volume_id("never");
    assert!(matches!(
        plan_err(w.engine.stage(&unknown, "/stage/x", Some(&mount_cap("")))),
        PlanError::NotFound(_)
    ));
    assert!(matches!(
        plan_err(w.engine.stage("../../x", "/stage/x", Some(&mount_cap("")))),
        PlanError::NotFound(_)
    ));
    assert!(matches!(
        plan_err(w.engine.stage(&unknown, "", Some(&mount_cap("")))),
        PlanError::InvalidArgument(_)
    ));
    assert!(matches!(
        plan_err(w.engine.stage(&unknown, "/stage/x", None)),
        PlanError::InvalidArgument(_)
    ));
    assert!(matches!(
        plan_err(w.engine.unpublish(&unknown, "/pods/t")),
        PlanError::NotFound(_)
    ));
    assert!(matches!(
        plan_err(
            w.engine
                .publish("", "/stage/x", "/pods/t", Some(&mount_cap("")), false)
        ),
        PlanError::InvalidArgument(_)
    ));
    let rec = create(&w, "pvc-n", 64 * MIB, mount_cap(""), None).expect("create");
    for outside in [
        "/etc",
        "/stage",
        "relative/path",
        "/stage/../etc",
        "/stagey/x",
    ] {
        assert!(
            matches!(
                plan_err(w.engine.stage(&rec.id, outside, Some(&mount_cap("")))),
                PlanError::InvalidArgument(_)
            ),
            "{outside} taken as a staging path"
        );
        assert!(
            matches!(
                plan_err(w.engine.publish(
                    &rec.id,
                    "/stage/x",
                    outside,
                    Some(&mount_cap("")),
                    false
                )),
                PlanError::InvalidArgument(_)
            ),
            "{outside} taken as a target path"
        );
    }
    assert!(
        matches!(
            plan_err(
                w.engine
                    .publish(&rec.id, "/stage/x", "/pods/t", Some(&mount_cap("")), false)
            ),
            PlanError::FailedPrecondition(_)
        ),
        "not staged"
    );
    assert!(matches!(
        plan_err(w.engine.stage(&rec.id, "/stage/x", Some(&block_cap()))),
        PlanError::InvalidArgument(_)
    ));
    assert!(w.host.mount_points().is_empty());
}

#[test]
fn block_volumes_publish_their_device_node() {
    let w = world(GIB);
    let rec = create(&w, "pvc-b", 8 * MIB, block_cap(), None).expect("create");
    w.engine
        .stage(&rec.id, "/stage/b", Some(&block_cap()))
        .expect("stage");
    w.engine
        .publish(&rec.id, "/stage/b", "/pods/u/dev", Some(&block_cap()), true)
        .expect("publish");
    let calls = w.host.calls();
    assert!(
        calls.contains(&"make_file /pods/u/dev".to_string()),
        "{calls:?}"
    );
    assert!(
        calls.contains(&"mount bind /dev/loop0 /pods/u/dev ro=true".to_string()),
        "{calls:?}"
    );
    assert!(
        !calls.iter().any(|c| c.starts_with("format")),
        "a block volume is never formatted"
    );
    w.engine
        .publish(&rec.id, "/stage/b", "/pods/u/dev", Some(&block_cap()), true)
        .expect("publish twice");
    assert!(matches!(
        plan_err(w.engine.publish(
            &rec.id,
            "/stage/b",
            "/pods/u/dev",
            Some(&block_cap()),
            false
        )),
        PlanError::AlreadyExists(_)
    ));
}

#[test]
fn snapshots_copy_frozen_filesystems_and_restore_into_new_volumes() {
    let w = world(10 * GIB);
    let src = create(&w, "pvc-s", 64 * MIB, mount_cap(""), None).expect("create");
    w.engine
        .stage(&src.id, "/stage/s", Some(&mount_cap("")))
        .expect("stage");
    w.host.clear_calls();
    let snap = w
        .engine
        .create_snapshot(&src.id, "snap-1")
        .expect("snapshot");
    let calls = w.host.calls();
    let copy_at = calls
        .iter()
        .position(|c| c.starts_with("copy_file"))
        .expect("copied");
    assert_eq!(calls[copy_at - 1], "freeze /stage/s");
    assert_eq!(calls[copy_at + 1], "thaw /stage/s");
    assert_eq!(
        w.engine.create_snapshot(&src.id, "snap-1").expect("again"),
        snap
    );
    let other = create(&w, "pvc-o", 64 * MIB, mount_cap(""), None).expect("create");
    assert!(matches!(
        plan_err(w.engine.create_snapshot(&other.id, "snap-1")),
        PlanError::AlreadyExists(_)
    ));
    // A failed copy thaws and leaves no snapshot.
    w.host.fail_next("copy_file");
    assert!(w.engine.create_snapshot(&src.id, "snap-2").is_err());
    assert!(w.host.frozen().is_empty());
    assert_eq!(w.engine.snapshots().expect("list").len(), 1);

    let restored = create(
        &w,
        "pvc-restored",
        128 * MIB,
        mount_cap(""),
        Some(Source::Snapshot(snap.id.clone())),
    )
    .expect("restore");
    let disk = w.engine.layout().volume_disk(&restored.id);
    assert_eq!(
        w.host.content(&disk),
        Some(Content::Fs(FsType::Ext4)),
        "the copy carries the filesystem"
    );
    assert!(matches!(
        plan_err(create(
            &w,
            "pvc-small",
            32 * MIB,
            mount_cap(""),
            Some(Source::Snapshot(snap.id.clone()))
        )),
        PlanError::OutOfRange(_)
    ));
    let clone = create(
        &w,
        "pvc-clone",
        64 * MIB,
        mount_cap(""),
        Some(Source::Volume(src.id.clone())),
    )
    .expect("clone");
    assert_eq!(clone.source, Some(Source::Volume(src.id.clone())));
    w.engine.delete_snapshot(&snap.id).expect("delete");
    w.engine.delete_snapshot(&snap.id).expect("delete twice");
    assert!(w.engine.snapshots().expect("list").is_empty());
}

#[test]
fn growth_grows_the_file_refreshes_the_device_and_asks_the_node_for_the_filesystem() {
    let w = world(GIB);
    let rec = create(&w, "pvc-g", 64 * MIB, mount_cap(""), None).expect("create");
    w.engine
        .stage(&rec.id, "/stage/g", Some(&mount_cap("")))
        .expect("stage");
    w.host.clear_calls();
    let range = CapacityRange {
        required_bytes: 100 * MIB as i64,
        limit_bytes: 0,
    };
    assert_eq!(
        w.engine
            .expand_volume(&rec.id, Some(&range))
            .expect("expand"),
        (100 * MIB, true)
    );
    let disk = w.engine.layout().volume_disk(&rec.id);
    assert_eq!(
        w.host.calls(),
        vec![
            format!("grow_file {} {}", disk.display(), 100 * MIB),
            "refresh /dev/loop0".to_string()
        ]
    );
    assert_eq!(
        w.engine
            .node_expand(&rec.id, "/stage/g")
            .expect("node expand"),
        100 * MIB
    );
    assert!(w
        .host
        .calls()
        .contains(&"grow_fs ext4 /dev/loop0 /stage/g".to_string()));
    let smaller = CapacityRange {
        required_bytes: MIB as i64,
        limit_bytes: 0,
    };
    assert_eq!(
        w.engine
            .expand_volume(&rec.id, Some(&smaller))
            .expect("no shrink")
            .0,
        100 * MIB
    );
    let huge = CapacityRange {
        required_bytes: 2 * GIB as i64,
        limit_bytes: 0,
    };
    assert!(matches!(
        plan_err(w.engine.expand_volume(&rec.id, Some(&huge))),
        PlanError::OutOfRange(_)
    ));
    assert!(matches!(
        plan_err(w.engine.node_expand(&rec.id, "/pods/nowhere")),
        PlanError::NotFound(_)
    ));
}

#[test]
fn busy_volumes_answer_aborted() {
    let w = world(GIB);
    let rec = create(&w, "pvc-busy", 64 * MIB, mount_cap(""), None).expect("create");
    let held = w.engine.claim(&rec.id).expect("claim");
    assert!(matches!(
        plan_err(w.engine.stage(&rec.id, "/stage/x", Some(&mount_cap("")))),
        PlanError::Aborted(_)
    ));
    assert!(matches!(
        plan_err(w.engine.delete_volume(&rec.id)),
        PlanError::Aborted(_)
    ));
    drop(held);
    w.engine
        .stage(&rec.id, "/stage/x", Some(&mount_cap("")))
        .expect("free again");
}

#[test]
fn thick_volumes_are_allocated_up_front() {
    let w = world(GIB);
    let params = HashMap::from([("provisioning".to_string(), "thick".to_string())]);
    let range = CapacityRange {
        required_bytes: 64 * MIB as i64,
        limit_bytes: 0,
    };
    let rec = w
        .engine
        .create_volume(CreateRequest {
            name: "t",
            range: Some(&range),
            capabilities: &[mount_cap("")],
            parameters: &params,
            source: None,
        })
        .expect("create");
    assert_eq!(rec.provisioning, Provisioning::Thick);
    let info = w
        .host
        .file_info(&w.engine.layout().volume_disk(&rec.id))
        .expect("info")
        .expect("file");
    assert_eq!(info.allocated, 64 * MIB);
}

#[test]
fn listings_page_with_tokens_they_gave_out() {
    let items: Vec<u32> = (0..5).collect();
    assert_eq!(page(&items, 2, ""), Ok((vec![0, 1], "2".to_string())));
    assert_eq!(page(&items, 2, "4"), Ok((vec![4], String::new())));
    assert_eq!(page(&items, 0, ""), Ok((items.clone(), String::new())));
    assert!(matches!(page(&items, 2, "x"), Err(PlanError::Aborted(_))));
    assert!(matches!(page(&items, 2, "9"), Err(PlanError::Aborted(_))));
    assert!(matches!(
        page(&items, -1, ""),
        Err(PlanError::InvalidArgument(_))
    ));
}
