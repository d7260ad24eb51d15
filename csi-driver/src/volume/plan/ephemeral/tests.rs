use std::collections::{BTreeMap, HashMap};

use super::*;
use crate::proto::volume_capability::access_mode::Mode;
use crate::proto::volume_capability::{AccessMode, AccessType, BlockVolume, MountVolume};
use crate::volume::plan::{GIB, MIB};
use crate::volume::record::{FsType, Provisioning};

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

fn ctx(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// What kubelet sends with podInfoOnMount for an inline volume, plus `attrs`.
fn kubelet_ctx(attrs: &[(&str, &str)]) -> HashMap<String, String> {
    let mut c = ctx(&[
        ("csi.storage.k8s.io/pod.name", "app"),
        ("csi.storage.k8s.io/pod.namespace", "default"),
        ("csi.storage.k8s.io/pod.uid", "u-1"),
        ("csi.storage.k8s.io/serviceAccount.name", "default"),
        (CONTEXT_EPHEMERAL, "true"),
    ]);
    c.extend(ctx(attrs));
    c
}

fn invalid(r: Result<EphemeralWant, PlanError>) -> String {
    match r {
        Err(PlanError::InvalidArgument(m)) => m,
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
}

#[test]
fn the_volume_context_says_whether_a_publish_is_inline() {
    assert_eq!(
        is_ephemeral(&ctx(&[])),
        Ok(false),
        "no pod info: persistent"
    );
    assert_eq!(
        is_ephemeral(&ctx(&[(CONTEXT_EPHEMERAL, "false")])),
        Ok(false)
    );
    assert_eq!(is_ephemeral(&kubelet_ctx(&[])), Ok(true));
    assert!(matches!(
        is_ephemeral(&ctx(&[(CONTEXT_EPHEMERAL, "yes")])),
        Err(PlanError::InvalidArgument(_))
    ));
}

#[test]
fn size_and_provisioning_come_from_the_attributes_with_kubernetes_quantities() {
    let w = ephemeral_want(
        "csi-abc",
        &kubelet_ctx(&[("size", "64Mi")]),
        &mount_cap(""),
        false,
    )
    .expect("want");
    assert_eq!(w.handle, "csi-abc");
    assert_eq!(w.create.name, "csi-abc");
    assert_eq!(w.create.id, ephemeral_volume_id("csi-abc"));
    assert_eq!(w.create.size, 64 * MIB);
    assert!(w.create.ephemeral);
    assert_eq!(w.create.params.provisioning, Provisioning::Thin);
    assert_eq!(
        w.wanted.fs_or_default(),
        FsType::Ext4,
        "ext4 when fsType is empty"
    );
    // Decimal suffixes and fractions as Kubernetes reads them; sizes round up to whole MiB.
    let w = ephemeral_want(
        "h",
        &kubelet_ctx(&[("size", "100M")]),
        &mount_cap("ext4"),
        false,
    )
    .expect("want");
    assert_eq!(w.create.size, 96 * MIB, "100M = 95.37 MiB, rounded up");
    let w = ephemeral_want(
        "h",
        &kubelet_ctx(&[("size", "0.5Gi")]),
        &mount_cap(""),
        false,
    )
    .expect("want");
    assert_eq!(w.create.size, 512 * MIB);
    // No size: the documented default; below a filesystem's minimum: the minimum.
    let w = ephemeral_want("h", &kubelet_ctx(&[]), &mount_cap(""), false).expect("want");
    assert_eq!(w.create.size, DEFAULT_EPHEMERAL_SIZE);
    assert_eq!(DEFAULT_EPHEMERAL_SIZE, GIB);
    let w = ephemeral_want(
        "h",
        &kubelet_ctx(&[("size", "1Mi")]),
        &mount_cap("xfs"),
        false,
    )
    .expect("want");
    assert_eq!(w.create.size, 300 * MIB);
    let w = ephemeral_want(
        "h",
        &kubelet_ctx(&[("provisioning", "thick")]),
        &mount_cap(""),
        true,
    )
    .expect("want");
    assert_eq!(w.create.params.provisioning, Provisioning::Thick);
    assert!(w.readonly);
}

#[test]
fn bad_attributes_and_capabilities_are_invalid_arguments() {
    let m = invalid(ephemeral_want(
        "h",
        &kubelet_ctx(&[("sise", "1Gi")]),
        &mount_cap(""),
        false,
    ));
    assert!(m.contains("\"sise\"") && m.contains("size"), "{m}");
    for bad in ["lots", "-1Gi", "0", "1e40"] {
        let m = invalid(ephemeral_want(
            "h",
            &kubelet_ctx(&[("size", bad)]),
            &mount_cap(""),
            false,
        ));
        assert!(m.contains("size"), "{bad}: {m}");
    }
    invalid(ephemeral_want(
        "h",
        &kubelet_ctx(&[("provisioning", "fat")]),
        &mount_cap(""),
        false,
    ));
    invalid(ephemeral_want(
        "h",
        &kubelet_ctx(&[]),
        &mount_cap("btrfs"),
        false,
    ));
    invalid(ephemeral_want("", &kubelet_ctx(&[]), &mount_cap(""), false));
    let block = VolumeCapability {
        access_type: Some(AccessType::Block(BlockVolume {})),
        access_mode: Some(AccessMode {
            mode: Mode::SingleNodeWriter as i32,
        }),
    };
    let m = invalid(ephemeral_want("h", &kubelet_ctx(&[]), &block, false));
    assert!(m.contains("block"), "{m}");
}

fn record(want: &EphemeralWant) -> VolumeRecord {
    VolumeRecord {
        id: want.create.id.clone(),
        name: want.handle.clone(),
        size: want.create.size,
        provisioning: Provisioning::Thin,
        access: AccessKind::Mount,
        state: State::Ready,
        source: None,
        created: "2026-11-26T00:00:00Z".into(),
        formatted: Some(FsType::Ext4),
        grow_pending: false,
        staged: None,
        published: Vec::new(),
        parameters: BTreeMap::new(),
        ephemeral: true,
    }
}

#[test]
fn a_second_publish_reuses_the_volume_and_a_different_one_conflicts() {
    let want = ephemeral_want(
        "csi-a",
        &kubelet_ctx(&[("size", "64Mi")]),
        &mount_cap(""),
        false,
    )
    .expect("want");
    assert_eq!(
        decide_ephemeral(None, &want),
        Ok(EphemeralDecision::Create(CreateDecision::Make))
    );
    let rec = record(&want);
    assert_eq!(
        decide_ephemeral(Some(&rec), &want),
        Ok(EphemeralDecision::Create(CreateDecision::Exists(
            rec.clone()
        )))
    );
    let bigger = ephemeral_want(
        "csi-a",
        &kubelet_ctx(&[("size", "128Mi")]),
        &mount_cap(""),
        false,
    )
    .expect("want");
    assert!(
        matches!(decide_ephemeral(Some(&rec), &bigger), Err(PlanError::AlreadyExists(m)) if m.contains("size"))
    );
    let xfs = ephemeral_want(
        "csi-a",
        &kubelet_ctx(&[("size", "300Mi")]),
        &mount_cap("xfs"),
        false,
    )
    .expect("want");
    let mut big = rec.clone();
    big.size = 300 * MIB;
    assert!(
        matches!(decide_ephemeral(Some(&big), &xfs), Err(PlanError::AlreadyExists(m)) if m.contains("fsType"))
    );
    let mut half = rec.clone();
    half.state = State::Creating;
    assert_eq!(
        decide_ephemeral(Some(&half), &want),
        Ok(EphemeralDecision::Create(CreateDecision::Finish(
            half.clone()
        )))
    );
    let mut going = rec.clone();
    going.state = State::Deleting;
    assert_eq!(
        decide_ephemeral(Some(&going), &want),
        Ok(EphemeralDecision::RemoveFirst(going.clone())),
        "an unpublish cut short is finished, then the volume is made anew"
    );
    // A persistent record under the same ID (a CreateVolume named "ephemeral:csi-a").
    let mut persistent = rec.clone();
    persistent.ephemeral = false;
    persistent.name = "ephemeral:csi-a".into();
    assert!(matches!(
        decide_ephemeral(Some(&persistent), &want),
        Err(PlanError::AlreadyExists(_))
    ));
}

#[test]
fn unpublish_removes_the_volume_unless_another_target_still_holds_it() {
    let want = ephemeral_want("csi-a", &kubelet_ctx(&[]), &mount_cap(""), false).expect("want");
    let mut rec = record(&want);
    let (t1, t2) = (
        PathBuf::from("/pods/1/mount"),
        PathBuf::from("/pods/2/mount"),
    );
    rec.published = vec![t1.clone(), t2.clone()];
    assert!(!unpublish_removes(&rec, &t1, &[t1.clone(), t2.clone()]));
    assert!(
        unpublish_removes(&rec, &t1, std::slice::from_ref(&t1)),
        "t2 is gone already"
    );
    assert!(unpublish_removes(&rec, &t1, &[]));
    rec.state = State::Deleting;
    assert!(unpublish_removes(&rec, &t1, &[t1.clone(), t2.clone()]));
    assert_eq!(unpublish_gone("csi-x", &t1, false), Ok(()));
    assert!(matches!(
        unpublish_gone("csi-x", &t1, true),
        Err(PlanError::NotFound(_))
    ));
}

fn seen_path(path: &str, kind: Option<PathKind>, mounted: bool) -> PathSeen {
    PathSeen {
        path: path.into(),
        kind,
        mounted,
    }
}

#[test]
fn removal_undoes_in_order_and_resumes_anywhere() {
    let disk = Path::new("/data/volumes/v/disk.img");
    let dev = PathBuf::from("/dev/loop3");
    let mut seen = RemovalSeen {
        backing: true,
        device: Some(dev.clone()),
        device_users: vec!["/data/staging/v".into(), "/pods/1/mount".into()],
        targets: vec![seen_path("/pods/1/mount", Some(PathKind::Dir), true)],
        staging: seen_path("/data/staging/v", Some(PathKind::Dir), true),
    };
    let step = |s: &RemovalSeen| removal_step(disk, s).expect("step");
    assert_eq!(
        step(&seen),
        Step::Do(Op::Unmount {
            target: "/pods/1/mount".into()
        })
    );
    seen.targets[0].mounted = false;
    seen.device_users.pop();
    assert_eq!(
        step(&seen),
        Step::Do(Op::RemovePath {
            path: "/pods/1/mount".into()
        })
    );
    seen.targets[0].kind = None;
    assert_eq!(
        step(&seen),
        Step::Do(Op::Unmount {
            target: "/data/staging/v".into()
        })
    );
    seen.staging.mounted = false;
    seen.device_users.clear();
    assert_eq!(
        step(&seen),
        Step::Do(Op::Detach {
            device: dev.clone()
        })
    );
    seen.device = None;
    assert_eq!(
        step(&seen),
        Step::Do(Op::RemovePath {
            path: "/data/staging/v".into()
        })
    );
    seen.staging.kind = None;
    assert_eq!(
        step(&seen),
        Step::Do(Op::RemoveFile {
            path: disk.to_path_buf()
        })
    );
    seen.backing = false;
    assert_eq!(step(&seen), Step::Done);
}

#[test]
fn removal_never_detaches_a_device_someone_else_mounts() {
    let seen = RemovalSeen {
        backing: true,
        device: Some("/dev/loop3".into()),
        device_users: vec!["/mnt/by-hand".into()],
        targets: vec![seen_path("/pods/1/mount", None, false)],
        staging: seen_path("/data/staging/v", Some(PathKind::Dir), false),
    };
    assert!(
        matches!(removal_step(Path::new("/d"), &seen), Err(PlanError::FailedPrecondition(m)) if m.contains("/mnt/by-hand"))
    );
}
