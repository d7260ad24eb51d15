use k8s_openapi::api::core::v1::{
    PersistentVolumeClaimSpec, PersistentVolumeStatus, TypedLocalObjectReference,
    VolumeResourceRequirements,
};

use super::*;

fn class(wffc: bool) -> StorageClass {
    StorageClass {
        metadata: ObjectMeta {
            name: Some("loop".into()),
            ..Default::default()
        },
        provisioner: DRIVER_NAME.into(),
        volume_binding_mode: Some(
            if wffc {
                "WaitForFirstConsumer"
            } else {
                "Immediate"
            }
            .into(),
        ),
        parameters: Some(BTreeMap::from([
            ("provisioning".to_string(), "thick".to_string()),
            (PARAM_FSTYPE.to_string(), "xfs".to_string()),
        ])),
        ..Default::default()
    }
}

fn claim(size: &str, selected: Option<&str>) -> PersistentVolumeClaim {
    let mut ann = BTreeMap::from([(ANN_STORAGE_PROVISIONER.to_string(), DRIVER_NAME.to_string())]);
    if let Some(n) = selected {
        ann.insert(ANN_SELECTED_NODE.into(), n.into());
    }
    PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some("data".into()),
            namespace: Some("default".into()),
            uid: Some("u-1".into()),
            annotations: Some(ann),
            ..Default::default()
        },
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: Some(vec!["ReadWriteOnce".into()]),
            resources: Some(VolumeResourceRequirements {
                requests: Some(BTreeMap::from([(
                    "storage".to_string(),
                    Quantity(size.into()),
                )])),
                ..Default::default()
            }),
            storage_class_name: Some("loop".into()),
            ..Default::default()
        }),
        status: None,
    }
}

fn no_snapshot(name: &str) -> Result<super::snapshot::SnapshotSource, String> {
    Err(format!("data source VolumeSnapshot {name:?} not found"))
}

fn no_source(_: &str) -> Option<String> {
    None
}

fn provision(d: ClaimDecision) -> VolumeRequest {
    match d {
        ClaimDecision::Provision(r) => *r,
        other => panic!("expected Provision, got {other:?}"),
    }
}

#[test]
fn a_claim_selected_for_this_node_is_provisioned_as_asked() {
    let r = provision(decide_claim(
        &claim("1Gi", Some("n1")),
        Some(&class(true)),
        "n1",
        false,
        &no_source, &no_snapshot,
    ));
    assert_eq!(r.name, "pvc-u-1");
    assert_eq!((r.required_bytes, r.limit_bytes), (1 << 30, 0));
    assert_eq!(
        r.parameters,
        HashMap::from([("provisioning".to_string(), "thick".to_string())]),
        "csi.storage.k8s.io/ keys stripped"
    );
    match r.capability.access_type {
        Some(AccessType::Mount(m)) => assert_eq!(m.fs_type, "xfs"),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        r.capability.access_mode.map(|m| m.mode),
        Some(Mode::SingleNodeWriter as i32)
    );
}

#[test]
fn claims_of_other_nodes_provisioners_or_states_are_ignored() {
    let c = claim("1Gi", Some("n2"));
    assert_eq!(
        decide_claim(&c, Some(&class(true)), "n1", false, &no_source, &no_snapshot),
        ClaimDecision::Ignore,
        "another node"
    );
    let c = claim("1Gi", None);
    assert_eq!(
        decide_claim(&c, Some(&class(true)), "n1", false, &no_source, &no_snapshot),
        ClaimDecision::Ignore,
        "WFFC, no node yet"
    );
    let c = claim("1Gi", Some("n1"));
    assert_eq!(
        decide_claim(&c, Some(&class(true)), "n1", true, &no_source, &no_snapshot),
        ClaimDecision::Ignore,
        "PV exists"
    );
    let mut other = class(true);
    other.provisioner = "example.com/nfs".into();
    assert_eq!(
        decide_claim(&c, Some(&other), "n1", false, &no_source, &no_snapshot),
        ClaimDecision::Ignore
    );
    assert_eq!(
        decide_claim(&c, None, "n1", false, &no_source, &no_snapshot),
        ClaimDecision::Ignore
    );
    let mut bound = c.clone();
    bound.spec.as_mut().expect("spec").volume_name = Some("pv-x".into());
    assert_eq!(
        decide_claim(&bound, Some(&class(true)), "n1", false, &no_source, &no_snapshot),
        ClaimDecision::Ignore
    );
    let mut unhanded = c.clone();
    unhanded
        .metadata
        .annotations
        .as_mut()
        .expect("ann")
        .remove(ANN_STORAGE_PROVISIONER);
    assert_eq!(
        decide_claim(&unhanded, Some(&class(true)), "n1", false, &no_source, &no_snapshot),
        ClaimDecision::Ignore
    );
}

#[test]
fn an_immediate_claim_is_taken_first() {
    assert_eq!(
        decide_claim(
            &claim("1Gi", None),
            Some(&class(false)),
            "n1",
            false,
            &no_source, &no_snapshot
        ),
        ClaimDecision::Take
    );
    assert!(matches!(
        decide_claim(
            &claim("1Gi", Some("n1")),
            Some(&class(false)),
            "n1",
            false,
            &no_source, &no_snapshot
        ),
        ClaimDecision::Provision(_)
    ));
}

#[test]
fn claims_that_cannot_be_provisioned_say_why() {
    let refuse = |c: &PersistentVolumeClaim| match decide_claim(
        c,
        Some(&class(true)),
        "n1",
        false,
        &no_source, &no_snapshot,
    ) {
        ClaimDecision::Refuse(why) => why,
        other => panic!("expected Refuse, got {other:?}"),
    };
    assert!(refuse(&claim("0", Some("n1"))).contains("no storage"));
    assert!(refuse(&claim("lots", Some("n1"))).contains("lots"));
    let mut none = claim("1Gi", Some("n1"));
    none.spec.as_mut().expect("spec").resources = None;
    assert!(refuse(&none).contains("no storage"));
    let mut two = claim("1Gi", Some("n1"));
    two.spec.as_mut().expect("spec").access_modes =
        Some(vec!["ReadWriteOnce".into(), "ReadOnlyMany".into()]);
    assert!(refuse(&two).contains("access modes"));
    let mut snap = claim("1Gi", Some("n1"));
    snap.spec.as_mut().expect("spec").data_source = Some(TypedLocalObjectReference {
        api_group: Some("snapshot.storage.k8s.io".into()),
        kind: "VolumeSnapshot".into(),
        name: "s".into(),
    });
    assert!(refuse(&snap).contains("VolumeSnapshot"));
    // ReadWriteMany goes to the driver, which answers InvalidArgument (an event says so).
    let mut rwx = claim("1Gi", Some("n1"));
    rwx.spec.as_mut().expect("spec").access_modes = Some(vec!["ReadWriteMany".into()]);
    let r = provision(decide_claim(
        &rwx,
        Some(&class(true)),
        "n1",
        false,
        &no_source, &no_snapshot,
    ));
    assert_eq!(
        r.capability.access_mode.map(|m| m.mode),
        Some(Mode::MultiNodeMultiWriter as i32)
    );
}

#[test]
fn a_claim_cloned_from_a_claim_names_the_source_volume() {
    let mut c = claim("2Gi", Some("n1"));
    c.spec.as_mut().expect("spec").data_source = Some(TypedLocalObjectReference {
        api_group: None,
        kind: "PersistentVolumeClaim".into(),
        name: "src".into(),
    });
    let lookup = |name: &str| (name == "src").then(|| "loop-abc".to_string());
    let r = provision(decide_claim(&c, Some(&class(true)), "n1", false, &lookup, &no_snapshot));
    assert_eq!(r.source, Some(Source::Volume("loop-abc".into())));
    c.spec
        .as_mut()
        .expect("spec")
        .data_source
        .as_mut()
        .expect("ds")
        .name = "other".into();
    assert!(matches!(
        decide_claim(&c, Some(&class(true)), "n1", false, &lookup, &no_snapshot),
        ClaimDecision::Refuse(_)
    ));
}

#[test]
fn the_volume_object_is_prebound_pinned_and_finalized() {
    let c = claim("1Gi", Some("n1"));
    let cls = class(true);
    let r = provision(decide_claim(&c, Some(&cls), "n1", false, &no_source, &no_snapshot));
    let pv = volume_object(&c, &cls, &r, "loop-1", 1 << 30, &HashMap::new(), "n1");
    assert_eq!(pv.metadata.name.as_deref(), Some("pvc-u-1"));
    assert_eq!(pv.metadata.finalizers, Some(vec![PV_FINALIZER.to_string()]));
    let spec = pv.spec.as_ref().expect("spec");
    assert_eq!(
        spec.claim_ref.as_ref().and_then(|r| r.uid.as_deref()),
        Some("u-1")
    );
    assert_eq!(
        spec.csi.as_ref().map(|c| c.volume_handle.as_str()),
        Some("loop-1")
    );
    assert_eq!(
        spec.csi.as_ref().and_then(|c| c.fs_type.as_deref()),
        Some("xfs")
    );
    assert_eq!(
        spec.persistent_volume_reclaim_policy.as_deref(),
        Some("Delete")
    );
    assert_eq!(
        spec.capacity
            .as_ref()
            .and_then(|c| c.get("storage"))
            .map(|q| q.0.as_str()),
        Some("1073741824")
    );
    assert_eq!(volume_node(&pv), Some("n1"));
}

#[test]
fn only_released_deletable_volumes_of_this_node_are_deleted() {
    let c = claim("1Gi", Some("n1"));
    let cls = class(true);
    let r = provision(decide_claim(&c, Some(&cls), "n1", false, &no_source, &no_snapshot));
    let mut pv = volume_object(&c, &cls, &r, "loop-1", 1 << 30, &HashMap::new(), "n1");
    assert_eq!(
        decide_volume(&pv, "n1"),
        VolumeDecision::Ignore,
        "not released"
    );
    pv.status = Some(PersistentVolumeStatus {
        phase: Some("Released".into()),
        ..Default::default()
    });
    assert_eq!(
        decide_volume(&pv, "n1"),
        VolumeDecision::Delete {
            volume_id: "loop-1".into()
        }
    );
    assert_eq!(
        decide_volume(&pv, "n2"),
        VolumeDecision::Ignore,
        "another node's"
    );
    pv.spec
        .as_mut()
        .expect("spec")
        .persistent_volume_reclaim_policy = Some("Retain".into());
    assert_eq!(decide_volume(&pv, "n1"), VolumeDecision::Ignore, "Retain");
}

#[test]
fn a_bound_claim_asking_for_more_is_resized_on_its_node() {
    let c = claim("1Gi", Some("n1"));
    let cls = class(true);
    let r = provision(decide_claim(&c, Some(&cls), "n1", false, &no_source, &no_snapshot));
    let pv = volume_object(&c, &cls, &r, "loop-1", 1 << 30, &HashMap::new(), "n1");
    let mut bound = claim("1Gi", Some("n1"));
    bound.spec.as_mut().expect("spec").volume_name = Some("pvc-u-1".into());
    assert_eq!(decide_resize(&bound, &pv, "n1"), None, "same size");
    bound
        .spec
        .as_mut()
        .expect("spec")
        .resources
        .as_mut()
        .expect("res")
        .requests = Some(BTreeMap::from([(
        "storage".to_string(),
        Quantity("2Gi".into()),
    )]));
    assert_eq!(
        decide_resize(&bound, &pv, "n1"),
        Some(Resize {
            volume_id: "loop-1".into(),
            bytes: 2 << 30
        })
    );
    assert_eq!(
        decide_resize(&bound, &pv, "n2"),
        None,
        "another node's volume"
    );
    let mut unbound = bound.clone();
    unbound.spec.as_mut().expect("spec").volume_name = Some("other".into());
    assert_eq!(decide_resize(&unbound, &pv, "n1"), None);
}

#[test]
fn the_driver_object_says_there_is_no_attach_step() {
    let d = driver_object();
    assert_eq!(d.metadata.name.as_deref(), Some(DRIVER_NAME));
    assert_eq!(d.spec.attach_required, Some(false));
    assert_eq!(d.spec.fs_group_policy.as_deref(), Some("ReadWriteOnceWithFSType"));
    assert_eq!(
        d.spec.volume_lifecycle_modes,
        Some(vec!["Persistent".to_string(), "Ephemeral".to_string()])
    );
    assert_eq!(d.spec.pod_info_on_mount, Some(true), "inline volumes are told apart by it");
}
