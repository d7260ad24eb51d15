use std::collections::HashMap;

use super::*;
use crate::proto::volume_capability::{AccessMode, BlockVolume, MountVolume};
use crate::volume::names::volume_id;

fn cap(mode: Mode, access: Option<AccessType>) -> VolumeCapability {
    VolumeCapability {
        access_type: access,
        access_mode: Some(AccessMode { mode: mode as i32 }),
    }
}

fn mount_cap(fs: &str) -> VolumeCapability {
    cap(
        Mode::SingleNodeWriter,
        Some(AccessType::Mount(MountVolume {
            fs_type: fs.into(),
            ..Default::default()
        })),
    )
}

fn block_cap() -> VolumeCapability {
    cap(
        Mode::SingleNodeWriter,
        Some(AccessType::Block(BlockVolume {})),
    )
}

fn range(required: i64, limit: i64) -> CapacityRange {
    CapacityRange {
        required_bytes: required,
        limit_bytes: limit,
    }
}

fn rec(access: AccessKind) -> VolumeRecord {
    VolumeRecord {
        id: volume_id("pvc-a"),
        name: "pvc-a".into(),
        size: 64 * MIB,
        provisioning: Provisioning::Thin,
        access,
        state: State::Ready,
        source: None,
        created: "2026-11-26T00:00:00Z".into(),
        formatted: None,
        grow_pending: false,
        staged: None,
        published: Vec::new(),
        parameters: BTreeMap::new(),
        ephemeral: false,
    }
}

fn mount_entry(source: &str, target: &str, mm: &str, opts: &str) -> MountEntry {
    MountEntry {
        major_minor: mm.into(),
        root: "/".into(),
        target: target.into(),
        options: opts.into(),
        fstype: "ext4".into(),
        source: source.into(),
    }
}

#[test]
fn sizes_round_up_to_mib_respect_minimums_and_limits() {
    assert_eq!(size_for(None, MIB), Ok(DEFAULT_SIZE));
    assert_eq!(size_for(Some(&range(0, 0)), MIB), Ok(DEFAULT_SIZE));
    assert_eq!(size_for(Some(&range(1, 0)), MIB), Ok(MIB));
    assert_eq!(size_for(Some(&range(MIB as i64 + 1, 0)), MIB), Ok(2 * MIB));
    assert_eq!(
        size_for(Some(&range(0, 10 * MIB as i64)), MIB),
        Ok(MIB),
        "limit only: smallest"
    );
    assert_eq!(
        size_for(Some(&range(MIB as i64, 0)), 300 * MIB),
        Ok(300 * MIB)
    );
    for bad in [range(-1, 0), range(0, -5), range(10, 5), range(1, 1000)] {
        assert!(
            matches!(size_for(Some(&bad), MIB), Err(PlanError::OutOfRange(_))),
            "{bad:?}"
        );
    }
    assert!(matches!(
        size_for(Some(&range(MIB as i64, 100 * MIB as i64)), min_size(AccessKind::Mount, Some(FsType::Xfs))),
        Err(PlanError::OutOfRange(m)) if m.contains("314572800")
    ));
}

#[test]
fn parameters_known_ignored_and_refused() {
    let p = |pairs: &[(&str, &str)]| {
        Params::parse(
            &pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<HashMap<_, _>>(),
        )
    };
    assert_eq!(p(&[]), Ok(Params::default()));
    assert_eq!(
        p(&[("provisioning", "thick")]).map(|p| p.provisioning),
        Ok(Provisioning::Thick)
    );
    assert_eq!(
        p(&[
            ("csi.storage.k8s.io/pvc/name", "data"),
            ("provisioning", "thin")
        ])
        .map(|p| p.provisioning),
        Ok(Provisioning::Thin)
    );
    assert!(
        matches!(p(&[("provisioning", "fat")]), Err(PlanError::InvalidArgument(m)) if m.contains("fat"))
    );
    assert!(
        matches!(p(&[("replicas", "3")]), Err(PlanError::InvalidArgument(m)) if m.contains("replicas"))
    );
}

#[test]
fn capabilities_a_node_local_volume_can_and_cannot_honour() {
    assert_eq!(
        capabilities(&[mount_cap("xfs")]).map(|u| u.fs),
        Ok(Some(FsType::Xfs))
    );
    assert_eq!(
        capabilities(&[mount_cap("")]).map(|u| u.fs_or_default()),
        Ok(FsType::Ext4)
    );
    assert_eq!(
        capabilities(&[block_cap()]).map(|u| u.access),
        Ok(AccessKind::Block)
    );
    let ro = cap(
        Mode::SingleNodeReaderOnly,
        Some(AccessType::Block(BlockVolume {})),
    );
    assert_eq!(capability(&ro).map(|u| u.reader_only), Ok(true));
    for (what, caps) in [
        ("none", vec![]),
        ("ntfs", vec![mount_cap("ntfs")]),
        (
            "rwx",
            vec![cap(
                Mode::MultiNodeMultiWriter,
                Some(AccessType::Block(BlockVolume {})),
            )],
        ),
        (
            "rox",
            vec![cap(
                Mode::MultiNodeReaderOnly,
                Some(AccessType::Block(BlockVolume {})),
            )],
        ),
        (
            "unknown mode",
            vec![cap(Mode::Unknown, Some(AccessType::Block(BlockVolume {})))],
        ),
        ("no type", vec![cap(Mode::SingleNodeWriter, None)]),
        (
            "no mode",
            vec![VolumeCapability {
                access_type: Some(AccessType::Block(BlockVolume {})),
                access_mode: None,
            }],
        ),
        ("mixed", vec![block_cap(), mount_cap("ext4")]),
        ("two fs", vec![mount_cap("ext4"), mount_cap("xfs")]),
    ] {
        assert!(
            matches!(capabilities(&caps), Err(PlanError::InvalidArgument(_))),
            "{what}"
        );
    }
}

fn want(size: u64) -> CreateWant {
    CreateWant {
        id: volume_id("pvc-a"),
        name: "pvc-a".into(),
        size,
        params: Params::default(),
        access: AccessKind::Mount,
        source: None,
        ephemeral: false,
    }
}

#[test]
fn create_is_new_a_retry_a_resumption_or_a_conflict() {
    let r = rec(AccessKind::Mount);
    assert_eq!(decide_create(None, &want(r.size)), Ok(CreateDecision::Make));
    assert_eq!(
        decide_create(Some(&r), &want(r.size)),
        Ok(CreateDecision::Exists(r.clone()))
    );
    let mut half = r.clone();
    half.state = State::Creating;
    assert_eq!(
        decide_create(Some(&half), &want(r.size)),
        Ok(CreateDecision::Finish(half.clone()))
    );
    assert!(
        matches!(decide_create(Some(&r), &want(2 * r.size)), Err(PlanError::AlreadyExists(m)) if m.contains("size"))
    );
    let mut other = want(r.size);
    other.access = AccessKind::Block;
    assert!(matches!(
        decide_create(Some(&r), &other),
        Err(PlanError::AlreadyExists(_))
    ));
    let mut from = want(r.size);
    from.source = Some(Source::Snapshot("snap-x".into()));
    assert!(matches!(
        decide_create(Some(&r), &from),
        Err(PlanError::AlreadyExists(_))
    ));
    let mut inline = want(r.size);
    inline.ephemeral = true;
    assert!(
        matches!(decide_create(Some(&r), &inline), Err(PlanError::AlreadyExists(m)) if m.contains("ephemeral"))
    );
    let mut going = r.clone();
    going.state = State::Deleting;
    assert!(matches!(
        decide_create(Some(&going), &want(r.size)),
        Err(PlanError::Aborted(_))
    ));
}

#[test]
fn capacity_counts_promises_and_what_thin_volumes_may_still_allocate() {
    let pool = Pool {
        size: 10 * GIB,
        fs_available: 100 * GIB,
    };
    assert_eq!(available(pool, &[], &[]), 10 * GIB);
    let mut thin = rec(AccessKind::Mount);
    thin.size = 4 * GIB;
    let vols = vec![(
        thin.clone(),
        Some(FileInfo {
            size: 4 * GIB,
            allocated: GIB,
        }),
    )];
    assert_eq!(available(pool, &vols, &[]), 6 * GIB);
    // The disk is the tighter bound: 5 GiB free, 3 GiB of it owed to the thin volume.
    let small = Pool {
        size: 10 * GIB,
        fs_available: 5 * GIB,
    };
    assert_eq!(available(small, &vols, &[]), 2 * GIB);
    let full = Pool {
        size: GIB,
        fs_available: 100 * GIB,
    };
    assert_eq!(available(full, &vols, &[]), 0);
}

fn seen_attached(content: Content) -> Seen {
    Seen {
        backing: Some(FileInfo {
            size: 64 * MIB,
            allocated: 0,
        }),
        backing_path: "/d/disk.img".into(),
        device: Some("/dev/loop7".into()),
        content: Some(content),
        path: Some(PathKind::Dir),
        ..Default::default()
    }
}

#[test]
fn staging_attaches_formats_only_blank_devices_then_mounts() {
    let r = rec(AccessKind::Mount);
    let u = capability(&mount_cap("ext4")).expect("cap");
    let staging = Path::new("/k/globalmount");
    let mut seen = seen_attached(Content::Blank);
    seen.device = None;
    assert_eq!(
        stage_step(&r, &u, staging, &seen),
        Ok(Step::Do(Op::Attach {
            file: "/d/disk.img".into()
        }))
    );
    let seen = seen_attached(Content::Blank);
    assert_eq!(
        stage_step(&r, &u, staging, &seen),
        Ok(Step::Do(Op::Format {
            device: "/dev/loop7".into(),
            fs: FsType::Ext4
        }))
    );
    let seen = seen_attached(Content::Fs(FsType::Ext4));
    assert!(matches!(
        stage_step(&r, &u, staging, &seen),
        Ok(Step::Do(Op::Mount(MountSpec::Fs { .. })))
    ));
    let mut seen = seen_attached(Content::Fs(FsType::Ext4));
    seen.mount = Some(mount_entry("/dev/loop7", "/k/globalmount", "7:7", "rw"));
    assert_eq!(stage_step(&r, &u, staging, &seen), Ok(Step::Done));
}

#[test]
fn an_ext4_smaller_than_its_device_is_grown_before_it_is_mounted() {
    let r = rec(AccessKind::Mount);
    let u = capability(&mount_cap("ext4")).expect("cap");
    let mut seen = seen_attached(Content::Fs(FsType::Ext4));
    seen.fs_bytes = Some(64 * MIB);
    seen.device_bytes = Some(128 * MIB);
    assert_eq!(
        stage_step(&r, &u, Path::new("/k"), &seen),
        Ok(Step::Do(Op::GrowOffline {
            device: "/dev/loop7".into(),
            fs: FsType::Ext4
        }))
    );
    // resize2fs may leave a too-small last group out: that counts as grown.
    seen.fs_bytes = Some(128 * MIB - 3 * MIB);
    assert!(matches!(
        stage_step(&r, &u, Path::new("/k"), &seen),
        Ok(Step::Do(Op::Mount(_)))
    ));
}

#[test]
fn staging_never_formats_what_holds_data() {
    let u = capability(&mount_cap("ext4")).expect("cap");
    let staging = Path::new("/k/globalmount");
    let mut formatted = rec(AccessKind::Mount);
    formatted.formatted = Some(FsType::Ext4);
    for (r, content) in [
        (formatted, Content::Blank),
        (rec(AccessKind::Mount), Content::Fs(FsType::Xfs)),
        (rec(AccessKind::Mount), Content::Other("LUKS".into())),
        (rec(AccessKind::Mount), Content::Unknown),
    ] {
        let got = stage_step(&r, &u, staging, &seen_attached(content.clone()));
        assert!(
            matches!(got, Err(PlanError::FailedPrecondition(_))),
            "{content:?}: {got:?}"
        );
    }
    let mut seen = seen_attached(Content::Fs(FsType::Ext4));
    seen.mount = Some(mount_entry("/dev/loop2", "/k/globalmount", "7:2", "rw"));
    assert!(matches!(
        stage_step(&rec(AccessKind::Mount), &u, staging, &seen),
        Err(PlanError::AlreadyExists(_))
    ));
    let mut gone = seen_attached(Content::Blank);
    gone.backing = None;
    assert!(matches!(
        stage_step(&rec(AccessKind::Mount), &u, staging, &gone),
        Err(PlanError::FailedPrecondition(_))
    ));
}

#[test]
fn block_volumes_stage_by_attaching_and_publish_the_device_node() {
    let r = rec(AccessKind::Block);
    let u = capability(&block_cap()).expect("cap");
    assert_eq!(
        stage_step(&r, &u, Path::new("/s"), &seen_attached(Content::Unknown)),
        Ok(Step::Done)
    );
    let target = Path::new("/pods/u/dev/pv");
    let mut seen = seen_attached(Content::Unknown);
    seen.path = None;
    assert_eq!(
        publish_step(&r, &u, false, target, &seen),
        Ok(Step::Do(Op::MakeFile {
            path: target.into()
        }))
    );
    seen.path = Some(PathKind::File);
    assert_eq!(
        publish_step(&r, &u, false, target, &seen),
        Ok(Step::Do(Op::Mount(MountSpec::Bind {
            source: "/dev/loop7".into(),
            target: target.into(),
            readonly: false
        })))
    );
    seen.mount = Some(MountEntry {
        root: "/loop7".into(),
        fstype: "devtmpfs".into(),
        ..mount_entry("udev", "/pods/u/dev/pv", "0:5", "rw")
    });
    assert_eq!(publish_step(&r, &u, false, target, &seen), Ok(Step::Done));
    assert!(matches!(
        publish_step(&r, &u, true, target, &seen),
        Err(PlanError::AlreadyExists(_))
    ));
    let mount_use = capability(&mount_cap("")).expect("cap");
    assert!(matches!(
        publish_step(&r, &mount_use, false, target, &seen),
        Err(PlanError::InvalidArgument(_))
    ));
}

#[test]
fn publishing_a_filesystem_binds_the_staging_mount() {
    let r = rec(AccessKind::Mount);
    let u = capability(&mount_cap("ext4")).expect("cap");
    let target = Path::new("/pods/u/mount");
    let mut seen = seen_attached(Content::Fs(FsType::Ext4));
    seen.path = Some(PathKind::Dir);
    assert!(
        matches!(
            publish_step(&r, &u, false, target, &seen),
            Err(PlanError::FailedPrecondition(_))
        ),
        "not staged"
    );
    seen.staging_mount = Some(mount_entry("/dev/loop7", "/k/globalmount", "7:7", "rw"));
    assert_eq!(
        publish_step(&r, &u, true, target, &seen),
        Ok(Step::Do(Op::Mount(MountSpec::Bind {
            source: "/k/globalmount".into(),
            target: target.into(),
            readonly: true
        })))
    );
    seen.mount = Some(mount_entry(
        "/dev/loop7",
        "/pods/u/mount",
        "7:7",
        "ro,relatime",
    ));
    assert_eq!(publish_step(&r, &u, true, target, &seen), Ok(Step::Done));
    assert!(
        matches!(
            publish_step(&r, &u, false, target, &seen),
            Err(PlanError::AlreadyExists(_))
        ),
        "rw asked, ro there"
    );
    seen.mount = Some(mount_entry("/dev/loop1", "/pods/u/mount", "7:1", "ro"));
    assert!(
        matches!(
            publish_step(&r, &u, true, target, &seen),
            Err(PlanError::AlreadyExists(_))
        ),
        "another volume there"
    );
}

#[test]
fn unstaging_and_unpublishing_undo_in_order() {
    let staging = Path::new("/k/globalmount");
    let mut seen = seen_attached(Content::Fs(FsType::Ext4));
    seen.mount = Some(mount_entry("/dev/loop7", "/k/globalmount", "7:7", "rw"));
    assert_eq!(
        unstage_step(staging, &seen),
        Ok(Step::Do(Op::Unmount {
            target: staging.into()
        }))
    );
    seen.mount = None;
    seen.device_users = vec!["/pods/u/mount".into()];
    assert!(
        matches!(unstage_step(staging, &seen), Err(PlanError::FailedPrecondition(m)) if m.contains("/pods/u/mount"))
    );
    seen.device_users.clear();
    assert_eq!(
        unstage_step(staging, &seen),
        Ok(Step::Do(Op::Detach {
            device: "/dev/loop7".into()
        }))
    );
    seen.device = None;
    assert_eq!(unstage_step(staging, &seen), Ok(Step::Done));

    let target = Path::new("/pods/u/mount");
    let mut seen = Seen {
        path: Some(PathKind::Dir),
        mount: Some(mount_entry("/dev/loop7", "/pods/u/mount", "7:7", "rw")),
        ..Default::default()
    };
    assert_eq!(
        unpublish_step(target, &seen),
        Step::Do(Op::Unmount {
            target: target.into()
        })
    );
    seen.mount = None;
    assert_eq!(
        unpublish_step(target, &seen),
        Step::Do(Op::RemovePath {
            path: target.into()
        })
    );
    seen.path = None;
    assert_eq!(unpublish_step(target, &seen), Step::Done);
}
