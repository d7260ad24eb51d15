//! Inline volumes against the recording host: publish makes, stages and binds; a second
//! publish changes nothing; unpublish takes everything away; every crash point of both is
//! finished by the next call or by start-up recovery; bad requests create nothing.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::proto::volume_capability::access_mode::Mode;
use crate::proto::volume_capability::{AccessMode, AccessType, MountVolume};
use crate::proto::VolumeCapability;
use crate::volume::engine::{Engine, EngineConfig, EngineError};
use crate::volume::fake::RecordingHost;
use crate::volume::host::Host;
use crate::volume::names::ephemeral_volume_id;
use crate::volume::plan::ephemeral::CONTEXT_EPHEMERAL;
use crate::volume::plan::{PlanError, GIB, MIB};
use crate::volume::record::{FsType, State};

const HANDLE: &str = "csi-5ab1e";
const TARGET: &str = "/pods/u1/volumes/kubernetes.io~csi/scratch/mount";

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
            allowed_roots: vec!["/pods".into(), "/stage".into()],
        },
    );
    World {
        _dir: dir,
        host,
        engine,
    }
}

impl World {
    fn restart(&mut self) {
        self.engine = Engine::new(Arc::clone(&self.host), self.engine.config().clone());
    }

    fn id(&self) -> String {
        ephemeral_volume_id(HANDLE)
    }

    fn disk(&self) -> PathBuf {
        self.engine.layout().volume_disk(&self.id())
    }

    fn staging(&self) -> PathBuf {
        self.engine.layout().staging_dir(&self.id())
    }

    fn publish(&self, attrs: &[(&str, &str)]) -> Result<(), EngineError> {
        self.publish_fs(attrs, "", false)
    }

    fn publish_fs(
        &self,
        attrs: &[(&str, &str)],
        fs: &str,
        readonly: bool,
    ) -> Result<(), EngineError> {
        self.engine.node_publish(
            HANDLE,
            "",
            TARGET,
            Some(&mount_cap(fs)),
            readonly,
            &context(attrs),
        )
    }

    fn unpublish(&self) -> Result<(), EngineError> {
        self.engine.unpublish(HANDLE, TARGET)
    }

    /// Nothing of any volume left: no file, loop device, mount, directory or record.
    fn assert_nothing_left(&self) {
        assert!(
            self.host.files().is_empty(),
            "files: {:?}",
            self.host.files()
        );
        assert!(
            self.host.loops().is_empty(),
            "loops: {:?}",
            self.host.loops()
        );
        assert!(
            self.host.mount_points().is_empty(),
            "mounts: {:?}",
            self.host.mount_points()
        );
        assert!(self.host.dirs().is_empty(), "dirs: {:?}", self.host.dirs());
        let records = self.engine.journal().volumes().expect("list");
        assert!(records.is_empty(), "records: {records:?}");
        assert!(
            !self.engine.layout().volume_dir(&self.id()).exists(),
            "the volume dir is left"
        );
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

/// The volume context kubelet sends for an inline volume of a podInfoOnMount driver.
fn context(attrs: &[(&str, &str)]) -> HashMap<String, String> {
    let mut c: HashMap<String, String> = [
        ("csi.storage.k8s.io/pod.name", "app"),
        ("csi.storage.k8s.io/pod.namespace", "default"),
        ("csi.storage.k8s.io/pod.uid", "u1"),
        ("csi.storage.k8s.io/serviceAccount.name", "default"),
        (CONTEXT_EPHEMERAL, "true"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    c.extend(attrs.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    c
}

fn plan_err(r: Result<impl std::fmt::Debug, EngineError>) -> PlanError {
    match r {
        Err(EngineError::Plan(p)) => p,
        other => panic!("expected a plan error, got {other:?}"),
    }
}

#[test]
fn publish_makes_stages_and_binds_and_a_second_publish_changes_nothing() {
    let w = world(GIB);
    w.publish(&[("size", "64Mi")]).expect("publish");
    let (disk, staging) = (w.disk(), w.staging());
    assert_eq!(
        w.host.calls(),
        vec![
            format!("create_file {}", disk.display()),
            format!("attach {}", disk.display()),
            format!("make_dir {}", staging.display()),
            "format /dev/loop0 ext4".to_string(),
            format!("mount /dev/loop0 {} ext4", staging.display()),
            format!("make_dir {TARGET}"),
            format!("mount bind {} {TARGET} ro=false", staging.display()),
        ]
    );
    let rec = w
        .engine
        .journal()
        .volume(&w.id())
        .expect("read")
        .expect("record");
    assert!(rec.ephemeral);
    assert_eq!(rec.name, HANDLE);
    assert_eq!((rec.size, rec.state), (64 * MIB, State::Ready));
    assert_eq!(rec.formatted, Some(FsType::Ext4));
    assert_eq!(rec.staged, Some(staging.clone()));
    assert_eq!(rec.published, vec![PathBuf::from(TARGET)]);
    assert_eq!(
        w.engine.available().expect("available"),
        GIB - 64 * MIB,
        "counted in the pool"
    );
    assert!(
        w.engine.volumes().expect("list").is_empty(),
        "not the Controller's"
    );

    w.host.clear_calls();
    w.publish(&[("size", "64Mi")]).expect("publish twice");
    assert!(w.host.calls().is_empty(), "{:?}", w.host.calls());
    assert!(
        matches!(plan_err(w.publish(&[("size", "128Mi")])), PlanError::AlreadyExists(m) if m.contains("size"))
    );
    assert!(matches!(
        plan_err(w.publish_fs(&[("size", "64Mi")], "", true)),
        PlanError::AlreadyExists(_)
    ));
    assert!(
        w.host.calls().is_empty(),
        "a conflict touched the host: {:?}",
        w.host.calls()
    );

    // NodeGetVolumeStats by the CO's ID and the target path.
    let (usage, condition) = w.engine.stats(HANDLE, TARGET).expect("stats");
    assert!(
        matches!(usage, crate::volume::node::Usage::Fs(_)),
        "{usage:?}"
    );
    assert!(!condition.abnormal, "{condition:?}");
}

#[test]
fn unpublish_takes_everything_away_and_is_idempotent() {
    let w = world(GIB);
    w.publish(&[("size", "64Mi")]).expect("publish");
    w.host.clear_calls();
    w.unpublish().expect("unpublish");
    let (disk, staging) = (w.disk(), w.staging());
    assert_eq!(
        w.host.calls(),
        vec![
            format!("unmount {TARGET}"),
            format!("remove_path {TARGET}"),
            format!("unmount {}", staging.display()),
            "detach /dev/loop0".to_string(),
            format!("remove_path {}", staging.display()),
            format!("remove_file {}", disk.display()),
        ]
    );
    w.assert_nothing_left();
    assert_eq!(w.engine.available().expect("available"), GIB);
    w.host.clear_calls();
    w.unpublish().expect("unpublish twice");
    assert!(w.host.calls().is_empty(), "{:?}", w.host.calls());
    // The ID names nothing now; NodeGetVolumeStats says so.
    assert!(matches!(
        plan_err(w.engine.stats(HANDLE, TARGET)),
        PlanError::NotFound(_)
    ));
    // A volume made again under the same ID is a new, blank one.
    w.publish(&[("size", "64Mi")]).expect("publish again");
    assert!(w.host.calls().iter().any(|c| c.starts_with("format")));
}

#[test]
fn bad_requests_create_nothing() {
    let w = world(GIB);
    for (attrs, what) in [
        (vec![("colour", "blue")], "unknown attribute"),
        (vec![("size", "lots")], "size not a quantity"),
        (vec![("size", "-5Mi")], "negative size"),
        (vec![("provisioning", "fat")], "provisioning"),
    ] {
        assert!(
            matches!(plan_err(w.publish(&attrs)), PlanError::InvalidArgument(_)),
            "{what}"
        );
    }
    assert!(matches!(
        plan_err(w.publish_fs(&[], "btrfs", false)),
        PlanError::InvalidArgument(_)
    ));
    assert!(matches!(
        plan_err(w.engine.node_publish(
            HANDLE,
            "",
            "/etc/x",
            Some(&mount_cap("")),
            false,
            &context(&[])
        )),
        PlanError::InvalidArgument(_)
    ));
    assert!(matches!(
        plan_err(
            w.engine
                .node_publish(HANDLE, "", TARGET, None, false, &context(&[]))
        ),
        PlanError::InvalidArgument(_)
    ));
    assert!(matches!(
        plan_err(w.publish(&[("size", "2Gi")])),
        PlanError::ResourceExhausted(_)
    ));
    assert!(w.host.calls().is_empty(), "{:?}", w.host.calls());
    w.assert_nothing_left();
}

#[test]
fn a_failed_first_publish_leaves_nothing_behind() {
    // Every host step of a first publish failing in turn (the bind mount is the second
    // "mount": its failure is injected once the staging mount is there).
    for op in ["create_file", "attach", "make_dir", "format", "mount"] {
        let w = world(GIB);
        w.host.fail_next(op);
        assert!(w.publish(&[("size", "64Mi")]).is_err(), "{op}");
        w.assert_nothing_left();
        w.publish(&[("size", "64Mi")]).expect("a retry works");
    }
    // The bind failing: a volume staged by a first publish whose bind never happened.
    let w = world(GIB);
    w.publish(&[("size", "64Mi")]).expect("publish");
    let rec = w
        .engine
        .journal()
        .volume(&w.id())
        .expect("read")
        .expect("record");
    w.host.unmount(Path::new(TARGET)).expect("unbind");
    w.host.remove_path(Path::new(TARGET)).expect("rm target");
    let mut unpublished = rec.clone();
    unpublished.published.clear();
    w.engine.journal().put_volume(&unpublished).expect("put");
    w.host.fail_next("mount");
    assert!(w.publish(&[("size", "64Mi")]).is_err());
    w.assert_nothing_left();
}

#[test]
fn a_failed_publish_of_a_published_volume_keeps_it() {
    let w = world(GIB);
    w.publish(&[("size", "64Mi")]).expect("publish");
    // The target's bind went away (someone unmounted it); publishing again fails at the
    // bind: the pod's data must stay.
    w.host.unmount(Path::new(TARGET)).expect("unbind");
    w.host.fail_next("mount");
    assert!(w.publish(&[("size", "64Mi")]).is_err());
    assert_eq!(w.host.files(), vec![w.disk()]);
    assert_eq!(w.host.loops().len(), 1);
    w.publish(&[("size", "64Mi")])
        .expect("the retry binds it again");
    assert!(w.host.mount_points().contains(&PathBuf::from(TARGET)));
}

#[test]
fn an_unpublish_cut_short_anywhere_is_finished_by_the_next_call_or_at_start_up() {
    for op in ["unmount", "remove_path", "detach", "remove_file"] {
        for finish in ["unpublish", "publish", "recovery"] {
            let mut w = world(GIB);
            w.publish(&[("size", "64Mi")]).expect("publish");
            w.host.fail_next(op);
            assert!(w.unpublish().is_err(), "{op}");
            let rec = w
                .engine
                .journal()
                .volume(&w.id())
                .expect("read")
                .expect("record");
            assert_eq!(
                rec.state,
                State::Deleting,
                "{op}: the intent is recorded first"
            );
            match finish {
                "unpublish" => w.unpublish().expect("the next unpublish finishes"),
                "publish" => {
                    // The CO publishes the ID again: the removal is finished, a new volume made.
                    w.publish(&[("size", "64Mi")])
                        .expect("publish after a cut-short unpublish");
                    let rec = w
                        .engine
                        .journal()
                        .volume(&w.id())
                        .expect("read")
                        .expect("record");
                    assert_eq!(rec.state, State::Ready);
                    w.unpublish().expect("unpublish");
                }
                _ => {
                    w.restart();
                    let report = w.engine.recover().expect("recover");
                    assert_eq!(report.deleted, vec![w.id()], "{op}");
                    w.unpublish()
                        .expect("an unpublish after recovery answers OK");
                }
            }
            w.assert_nothing_left();
        }
    }
}

#[test]
fn a_publish_cut_short_is_rolled_back_or_finished_after_a_restart() {
    // Crash after the Creating record: recovery rolls it back.
    let mut w = world(GIB);
    w.host.fail_next("create_file");
    let _ = w.publish(&[("size", "64Mi")]);
    w.assert_nothing_left();
    let want = crate::volume::plan::ephemeral::ephemeral_want(
        HANDLE,
        &context(&[("size", "64Mi")]),
        &mount_cap(""),
        false,
    )
    .expect("want");
    let rec = crate::volume::record::VolumeRecord {
        id: want.create.id.clone(),
        name: HANDLE.into(),
        size: want.create.size,
        provisioning: Default::default(),
        access: crate::volume::record::AccessKind::Mount,
        state: State::Creating,
        source: None,
        created: "2026-11-26T00:00:00Z".into(),
        formatted: None,
        grow_pending: false,
        staged: None,
        published: Vec::new(),
        parameters: Default::default(),
        ephemeral: true,
    };
    w.engine.journal().put_volume(&rec).expect("put");
    w.host
        .create_file(&w.disk(), rec.size, false)
        .expect("half a file");
    w.restart();
    let report = w.engine.recover().expect("recover");
    assert_eq!(report.rolled_back, vec![w.id()]);
    w.assert_nothing_left();

    // A reboot while published: the loop device comes back at start-up, the CO's publish
    // mounts the filesystem again without formatting it.
    w.publish(&[("size", "64Mi")]).expect("publish");
    w.host.lose_loops();
    for m in w.host.mount_points().into_iter().rev() {
        w.host.unmount(&m).expect("reboot drops mounts");
    }
    w.restart();
    let report = w.engine.recover().expect("recover");
    assert_eq!(report.reattached, vec![w.id()]);
    w.host.clear_calls();
    w.publish(&[("size", "64Mi")])
        .expect("publish after the reboot");
    assert!(
        !w.host
            .calls()
            .iter()
            .any(|c| c.starts_with("format") || c.starts_with("create_file")),
        "{:?}",
        w.host.calls()
    );
    assert_eq!(w.host.mount_points().len(), 2, "staging and target");
    w.unpublish().expect("unpublish");
    w.assert_nothing_left();
}

#[test]
fn controller_calls_do_not_see_inline_volumes() {
    let w = world(GIB);
    w.publish(&[("size", "64Mi")]).expect("publish");
    let id = w.id();
    assert!(matches!(
        plan_err(w.engine.delete_volume(&id)),
        PlanError::FailedPrecondition(_)
    ));
    assert!(matches!(
        plan_err(w.engine.create_snapshot(&id, "snap")),
        PlanError::NotFound(_)
    ));
    // Node calls name an inline volume by the CO's ID only.
    assert!(matches!(
        plan_err(w.engine.stage(&id, "/stage/x", Some(&mount_cap("")))),
        PlanError::NotFound(_)
    ));
    assert!(matches!(
        plan_err(w.engine.unpublish(&id, TARGET)),
        PlanError::NotFound(_)
    ));
    assert_eq!(w.host.files(), vec![w.disk()]);
}

#[test]
fn an_unknown_id_is_an_inline_volume_gone_unless_shaped_like_a_created_one() {
    let w = world(GIB);
    w.engine
        .unpublish("csi-never-published", TARGET)
        .expect("an inline volume removed before: OK");
    assert!(matches!(
        plan_err(
            w.engine
                .unpublish(&crate::volume::names::volume_id("never"), TARGET)
        ),
        PlanError::NotFound(_)
    ));
    // Something ferro-csi does not know is mounted at the target: not its to undo.
    w.host.make_dir(Path::new(TARGET)).expect("dir");
    w.host
        .mount(&crate::volume::host::MountSpec::Bind {
            source: "/elsewhere".into(),
            target: TARGET.into(),
            readonly: false,
        })
        .expect("mount");
    assert!(matches!(
        plan_err(w.engine.unpublish("csi-never-published", TARGET)),
        PlanError::NotFound(_)
    ));
}

#[test]
fn a_persistent_publish_with_pod_info_is_unchanged() {
    let w = world(GIB);
    let rec = w
        .engine
        .create_volume(crate::volume::controller::CreateRequest {
            name: "pvc-1",
            range: None,
            capabilities: &[mount_cap("")],
            parameters: &HashMap::new(),
            source: None,
        })
        .expect("create");
    w.engine
        .stage(&rec.id, "/stage/p", Some(&mount_cap("")))
        .expect("stage");
    let mut ctx = context(&[("provisioning", "thin")]);
    ctx.insert(CONTEXT_EPHEMERAL.into(), "false".into());
    w.engine
        .node_publish(
            &rec.id,
            "/stage/p",
            "/pods/u2/mount",
            Some(&mount_cap("")),
            false,
            &ctx,
        )
        .expect("publish");
    assert_eq!(w.host.files(), vec![w.engine.layout().volume_disk(&rec.id)]);
    w.engine
        .unpublish(&rec.id, "/pods/u2/mount")
        .expect("unpublish");
    assert_eq!(w.host.files().len(), 1, "a persistent volume stays");
}
