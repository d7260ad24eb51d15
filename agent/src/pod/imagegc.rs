//! Image garbage collection by disk thresholds, as upstream's image manager
//! (pkg/kubelet/images/image_gc_manager.go) does it.
//!
//! Pure part: [`Records`] keeps, across rounds, when each image id was first detected and last
//! seen in use; [`plan`] turns the image filesystem's capacity and free space, the thresholds
//! and the images into the ids to remove. Executor: [`image_gc_loop`] (CRI ImageFsInfo +
//! statvfs, ListImages, ListContainers, the sandbox image from the runtime's Status, then
//! RemoveImage for each planned id).
//!
//! The rules, as upstream:
//! - usage% = 100 - available * 100 / capacity (integer division, so it rounds up); nothing
//!   happens while usage% < high;
//! - otherwise free `capacity * (100 - low) / 100 - available` bytes: candidates are the images
//!   not in use (by any container, running or not; the sandbox image always counts as in use),
//!   not pinned, first detected at least `min_age` ago; least recently used first (never used
//!   before everything else), ties broken by first detection; stop once the sizes removed
//!   reach the amount.
//! - high = 100 disables GC (upstream stubs the manager out).
//! - imageMaximumGCAge (`max_age`, 0 = off), before the disk check and whatever the usage: an
//!   image not in use, not pinned and unused for longer than `max_age` is removed (never used
//!   since the agent started counts as unused since then); nothing goes before the agent has
//!   run `max_age` itself, so a restart does not take images whose use it could not see.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::cri::{self, api, CriError};

/// The image GC policy and period.
#[derive(Debug, Clone, PartialEq)]
pub struct ImageGcConfig {
    /// imageGCHighThresholdPercent: GC runs when usage reaches it (100 disables GC).
    pub high_threshold_percent: u8,
    /// imageGCLowThresholdPercent: GC frees down to it.
    pub low_threshold_percent: u8,
    /// imageMinimumGCAge: an image detected more recently is never removed.
    pub min_age: Duration,
    /// imageMaximumGCAge: unused for longer, an image is removed (zero: off).
    pub max_age: Duration,
    /// How often a round runs (upstream's ImageGCPeriod is 5 minutes).
    pub period: Duration,
}

impl ImageGcConfig {
    /// Upstream stubs image GC out when the high threshold is 100.
    pub fn disabled(&self) -> bool {
        self.high_threshold_percent >= 100
    }
}

/// The image filesystem's size and free space (statvfs of its mountpoint), in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FsUsage {
    pub capacity_bytes: u64,
    /// Bytes available to unprivileged users (f_bavail), as cadvisor reports them.
    pub available_bytes: u64,
}

impl FsUsage {
    /// Percent used, as upstream computes it: `100 - available*100/capacity`.
    pub fn usage_percent(&self) -> u64 {
        let available = self.available_bytes.min(self.capacity_bytes);
        100 - u64::try_from(u128::from(available) * 100 / u128::from(self.capacity_bytes.max(1))).unwrap_or(100)
    }

    /// Bytes to free to get back to `low` percent.
    pub fn to_free(&self, low: u8) -> u64 {
        let target_free = u128::from(self.capacity_bytes) * u128::from(100 - low.min(100)) / 100;
        u64::try_from(target_free.saturating_sub(u128::from(self.available_bytes.min(self.capacity_bytes))))
            .unwrap_or(u64::MAX)
    }
}

/// One image as the planner sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct ImageInfo {
    pub id: String,
    pub size: u64,
    pub repo_tags: Vec<String>,
    pub first_detected: Instant,
    /// When it was last seen in use (None: never since the agent started).
    pub last_used: Option<Instant>,
    pub in_use: bool,
    pub pinned: bool,
}

/// Why a round removes nothing, or what it removes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plan {
    /// Capacity is 0: upstream's `invalid capacity 0 on image filesystem`.
    InvalidCapacity,
    /// Usage is below the high threshold.
    BelowThreshold { usage_percent: u64 },
    /// Over the threshold: remove `remove` (in order) to free `to_free` bytes; `freed` is what
    /// they add up to (less than `to_free` when not enough images are eligible).
    Free { usage_percent: u64, to_free: u64, freed: u64, remove: Vec<String> },
}

/// The images that may be removed, in the order they go: not in use, not pinned, detected at
/// least `min_age` ago; least recently used first (never used sorts first), ties by first
/// detection, then id so that the order is total. Pure.
pub fn candidates(images: &[ImageInfo], min_age: Duration, now: Instant) -> Vec<&ImageInfo> {
    let mut candidates: Vec<&ImageInfo> = images
        .iter()
        .filter(|i| !i.in_use && !i.pinned)
        // Upstream: an image used at `now` is in use.
        .filter(|i| i.last_used.is_none_or(|u| u < now))
        .filter(|i| now.saturating_duration_since(i.first_detected) >= min_age)
        .collect();
    candidates.sort_by(|a, b| {
        a.last_used
            .cmp(&b.last_used)
            .then(a.first_detected.cmp(&b.first_detected))
            .then(a.id.cmp(&b.id))
    });
    candidates
}

/// Decides which images to remove. Pure.
pub fn plan(fs: FsUsage, high: u8, low: u8, min_age: Duration, images: &[ImageInfo], now: Instant) -> Plan {
    if fs.capacity_bytes == 0 {
        return Plan::InvalidCapacity;
    }
    let usage_percent = fs.usage_percent();
    if usage_percent < u64::from(high) {
        return Plan::BelowThreshold { usage_percent };
    }
    let to_free = fs.to_free(low);
    let mut freed = 0u64;
    let mut remove = Vec::new();
    for c in candidates(images, min_age, now) {
        if freed >= to_free {
            break;
        }
        freed = freed.saturating_add(c.size);
        remove.push(c.id.clone());
    }
    Plan::Free { usage_percent, to_free, freed, remove }
}

/// What is known of one image id across rounds.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Record {
    first_detected: Instant,
    last_used: Option<Instant>,
}

/// First detection and last use of each image id, kept in memory across rounds (upstream's
/// imageRecords; like upstream's, it starts empty after a restart).
#[derive(Debug, Default, Clone)]
pub struct Records {
    by_id: HashMap<String, Record>,
}

/// One image as the runtime lists it.
#[derive(Debug, Clone, PartialEq)]
pub struct ListedImage {
    pub id: String,
    pub size: u64,
    pub repo_tags: Vec<String>,
    pub repo_digests: Vec<String>,
    pub pinned: bool,
}

impl Records {
    /// Records the images listed now: new ids are detected `now`, ids in `in_use` (image ids,
    /// or names/digests of the image) are used `now`, ids no longer listed are forgotten.
    /// Returns the planner's view. Pure.
    pub fn observe(&mut self, images: &[ListedImage], in_use: &BTreeSet<String>, now: Instant) -> Vec<ImageInfo> {
        self.by_id.retain(|id, _| images.iter().any(|i| &i.id == id));
        images
            .iter()
            .map(|i| {
                let used = in_use.contains(&i.id)
                    || i.repo_tags.iter().chain(&i.repo_digests).any(|n| in_use.contains(n));
                let r = self
                    .by_id
                    .entry(i.id.clone())
                    .or_insert(Record { first_detected: now, last_used: None });
                if used {
                    r.last_used = Some(now);
                }
                ImageInfo {
                    id: i.id.clone(),
                    size: i.size,
                    repo_tags: i.repo_tags.clone(),
                    first_detected: r.first_detected,
                    last_used: r.last_used,
                    in_use: used,
                    pinned: i.pinned,
                }
            })
            .collect()
    }

    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_id.is_empty()
    }
}

/// The image references the containers hold (all of them, whatever their state): image ref,
/// image id and the image of the spec.
pub fn images_in_use(containers: &[api::Container]) -> BTreeSet<String> {
    let mut set = BTreeSet::new();
    for c in containers {
        for s in [&c.image_ref, &c.image_id] {
            if !s.is_empty() {
                set.insert(s.clone());
            }
        }
        if let Some(spec) = &c.image {
            if !spec.image.is_empty() {
                set.insert(spec.image.clone());
            }
        }
    }
    set
}

/// The sandbox (pause) image containerd is configured with: `sandboxImage` of the CRI config
/// JSON it puts in the verbose Status info under `config`. Pure.
pub fn sandbox_image_from_info(info: &HashMap<String, String>) -> Option<String> {
    let config: serde_json::Value = serde_json::from_str(info.get("config")?).ok()?;
    config
        .get("sandboxImage")
        .and_then(|v| v.as_str())
        .filter(|s| !s.is_empty())
        .map(str::to_string)
}

#[derive(Debug, thiserror::Error)]
pub enum ImageGcError {
    #[error(transparent)]
    Cri(#[from] CriError),
    #[error("the runtime reported no image filesystem")]
    NoImageFs,
    #[error("statvfs of the image filesystem {path}")]
    Statvfs {
        path: PathBuf,
        #[source]
        source: nix::Error,
    },
    #[error("the runtime did not say which sandbox image it uses (no sandboxImage in its Status info)")]
    NoSandboxImage,
    #[error("invalid capacity 0 on image filesystem")]
    InvalidCapacity,
    /// Upstream's words (they are the FreeDiskSpaceFailed and ImageGCFailed events' message).
    #[error(
        "Failed to garbage collect required amount of images. Attempted to free {to_free} bytes, but only found {freed} bytes eligible to free."
    )]
    NotEnoughFreed { to_free: u64, freed: u64 },
}

/// Warning events about the node, as upstream's image manager and kubelet write them
/// (namespace `default`, involved object the Node with its name as uid).
pub struct NodeEvents {
    recorder: ferro_runtime::events::Recorder,
    node: k8s_openapi::api::core::v1::Node,
}

impl NodeEvents {
    pub fn new(recorder: ferro_runtime::events::Recorder, node_name: &str) -> NodeEvents {
        let node = k8s_openapi::api::core::v1::Node {
            metadata: kube::api::ObjectMeta {
                name: Some(node_name.to_string()),
                uid: Some(node_name.to_string()),
                ..Default::default()
            },
            ..Default::default()
        };
        NodeEvents { recorder, node }
    }

    fn warn(&self, reason: &str, message: String) {
        self.recorder.record(&self.node, "Warning", reason, message);
    }
}


/// statvfs of `path`: capacity and bytes available to unprivileged users.
pub fn fs_usage(path: &Path) -> Result<FsUsage, ImageGcError> {
    let st = nix::sys::statvfs::statvfs(path)
        .map_err(|source| ImageGcError::Statvfs { path: path.to_path_buf(), source })?;
    #[allow(clippy::useless_conversion)]
    let frag = u64::from(st.fragment_size());
    #[allow(clippy::useless_conversion)]
    let (blocks, avail) = (u64::from(st.blocks()), u64::from(st.blocks_available()));
    Ok(FsUsage { capacity_bytes: blocks.saturating_mul(frag), available_bytes: avail.saturating_mul(frag) })
}

/// Runs a GC round every `cfg.period` (the first one at once) until the task is dropped.
/// Errors are logged (repeated ones also as ImageGCFailed events) and the next round tries
/// again. The collector is shared with the eviction manager (its node-level reclaim), so both
/// see the same first-detected and last-used records.
pub async fn image_gc_loop(gc: Shared) {
    let cfg = gc.lock().await.cfg.clone();
    if cfg.disabled() {
        tracing::info!("imageGCHighThresholdPercent is 100: image garbage collection disabled");
        return;
    }
    tracing::info!(
        high = cfg.high_threshold_percent,
        low = cfg.low_threshold_percent,
        min_age = ?cfg.min_age,
        max_age = ?cfg.max_age,
        period = ?cfg.period,
        "image garbage collection"
    );
    let mut tick = tokio::time::interval(cfg.period.max(Duration::from_millis(100)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut failed_before = false;
    loop {
        tick.tick().await;
        let mut gc = gc.lock().await;
        match gc.round().await {
            Ok(()) => failed_before = false,
            Err(e) => {
                // As upstream's kubelet: the first failure in a row is only logged (stats may
                // not be ready yet); each further one is also an ImageGCFailed event.
                if failed_before {
                    tracing::warn!(error = %e, "image garbage collection failed multiple times in a row");
                    if let Some(ev) = &gc.events {
                        ev.warn("ImageGCFailed", e.to_string());
                    }
                } else {
                    tracing::warn!(error = %e, "image garbage collection failed");
                }
                failed_before = true;
            }
        }
    }
}

/// The executor's state: the runtime and the records kept across rounds.
/// The images unused for longer than `max_age`, for removal whatever the disk usage; none
/// before the agent (`began`) has itself run for `max_age`, and none when `max_age` is zero.
/// Pure.
pub fn aged_out(images: &[ImageInfo], max_age: Duration, began: Instant, now: Instant) -> Vec<String> {
    if max_age.is_zero() || now.saturating_duration_since(began) <= max_age {
        return Vec::new();
    }
    images
        .iter()
        .filter(|i| !i.in_use && !i.pinned)
        .filter(|i| now.saturating_duration_since(i.last_used.unwrap_or(began)) > max_age)
        .map(|i| i.id.clone())
        .collect()
}

pub struct ImageGc {
    rt: std::sync::Arc<dyn cri::Cri>,
    cfg: ImageGcConfig,
    records: Records,
    /// When the collector was made (imageMaximumGCAge waits that long before removing
    /// anything).
    began: Instant,
    /// Events about the node (none without an API server).
    events: Option<NodeEvents>,
}

/// The collector as the periodic loop and the eviction manager share it.
pub type Shared = std::sync::Arc<tokio::sync::Mutex<ImageGc>>;

/// What one look at the runtime's images found.
struct Inventory {
    mountpoint: PathBuf,
    runtime_used: Option<u64>,
    fs: FsUsage,
    sandbox_name: String,
    sandbox_id: Option<String>,
    images: Vec<ImageInfo>,
    now: Instant,
}

impl ImageGc {
    pub fn new(rt: std::sync::Arc<dyn cri::Cri>, cfg: ImageGcConfig, events: Option<NodeEvents>) -> ImageGc {
        ImageGc { rt, cfg, records: Records::default(), began: tokio::time::Instant::now().into_std(), events }
    }

    pub fn shared(self) -> Shared {
        std::sync::Arc::new(tokio::sync::Mutex::new(self))
    }

    /// The image filesystem, the sandbox image and every image with its records updated.
    async fn inventory(&mut self) -> Result<Inventory, ImageGcError> {
        let fs_list = self.rt.image_fs_info().await?;
        let image_fs = fs_list.first().ok_or(ImageGcError::NoImageFs)?;
        let mountpoint = PathBuf::from(image_fs.fs_id.as_ref().map(|f| f.mountpoint.as_str()).unwrap_or_default());
        let runtime_used = image_fs.used_bytes.as_ref().map(|u| u.value);
        let fs = fs_usage(&mountpoint)?;

        // The sandbox image is always in use (upstream: the pod infra container image); without
        // knowing it nothing is removed.
        let info = self.rt.status_info().await?;
        let sandbox_name = sandbox_image_from_info(&info).ok_or(ImageGcError::NoSandboxImage)?;
        let sandbox_id = self.rt.image_present(&sandbox_name).await?;

        let listed: Vec<ListedImage> = self
            .rt
            .list_images()
            .await?
            .into_iter()
            .map(|i| ListedImage { id: i.id, size: i.size, repo_tags: i.repo_tags, repo_digests: i.repo_digests, pinned: i.pinned })
            .collect();
        let containers = self.rt.list_containers(HashMap::new()).await?;
        let mut in_use = images_in_use(&containers);
        in_use.insert(sandbox_name.clone());
        in_use.extend(sandbox_id.clone());

        let now = tokio::time::Instant::now().into_std();
        let images = self.records.observe(&listed, &in_use, now);
        Ok(Inventory { mountpoint, runtime_used, fs, sandbox_name, sandbox_id, images, now })
    }

    /// Upstream's DeleteUnusedImages, the eviction manager's node-level reclaim: every image
    /// not in use, not pinned and at least imageMinimumGCAge old is removed, whatever the
    /// thresholds (also with periodic GC disabled, as upstream). Returns the bytes removed.
    pub async fn delete_unused(&mut self) -> Result<u64, ImageGcError> {
        let inv = self.inventory().await?;
        let remove: Vec<ImageInfo> = candidates(&inv.images, self.cfg.min_age, inv.now).into_iter().cloned().collect();
        let mut freed = 0u64;
        for img in &remove {
            if self.remove(img, "removed unused image to relieve disk pressure").await == Some(true) {
                freed = freed.saturating_add(img.size);
            }
        }
        Ok(freed)
    }

    /// RemoveImage of `img`, logged with `what`: Some(true) when removed, Some(false) when the
    /// runtime no longer had it, None when removing failed (logged).
    async fn remove(&mut self, img: &ImageInfo, what: &str) -> Option<bool> {
        match self.rt.remove_image(&img.id).await {
            Ok(()) => {
                tracing::info!(image = %img.id, tags = ?img.repo_tags, size = img.size, "{what}");
                Some(true)
            }
            Err(e) if e.is_not_found() => Some(false),
            Err(e) => {
                tracing::warn!(image = %img.id, error = %e, "removing image failed");
                None
            }
        }
    }

    /// One periodic round: images past imageMaximumGCAge, then down to the low threshold
    /// when usage is over the high one.
    pub async fn round(&mut self) -> Result<(), ImageGcError> {
        let Inventory { mountpoint, runtime_used, fs, sandbox_name, sandbox_id, mut images, now } = self.inventory().await?;
        for id in aged_out(&images, self.cfg.max_age, self.began, now) {
            let Some(img) = images.iter().find(|i| i.id == id) else { continue };
            if self.remove(img, "removed image unused for longer than imageMaximumGCAge").await.is_some() {
                images.retain(|i| i.id != id);
            }
        }
        let decision = plan(fs, self.cfg.high_threshold_percent, self.cfg.low_threshold_percent, self.cfg.min_age, &images, now);
        tracing::debug!(
            mountpoint = %mountpoint.display(),
            capacity = fs.capacity_bytes,
            available = fs.available_bytes,
            runtime_used = ?runtime_used,
            images = images.len(),
            in_use = images.iter().filter(|i| i.in_use).count(),
            sandbox_image = %sandbox_name,
            sandbox_image_id = ?sandbox_id,
            ?decision,
            "image gc round"
        );
        let (usage_percent, to_free, remove) = match decision {
            Plan::InvalidCapacity => return Err(ImageGcError::InvalidCapacity),
            Plan::BelowThreshold { .. } => return Ok(()),
            Plan::Free { usage_percent, to_free, remove, .. } => (usage_percent, to_free, remove),
        };
        tracing::info!(
            usage = usage_percent,
            high_threshold = self.cfg.high_threshold_percent,
            low_threshold = self.cfg.low_threshold_percent,
            amount_to_free = to_free,
            "disk usage on image filesystem is over the high threshold, trying to free bytes down to the low threshold"
        );
        let mut freed = 0u64;
        for id in remove {
            let Some(img) = images.iter().find(|i| i.id == id) else { continue };
            if self.remove(img, "removed unused image").await == Some(true) {
                freed = freed.saturating_add(img.size);
            }
        }
        if freed < to_free {
            let e = ImageGcError::NotEnoughFreed { to_free, freed };
            if let Some(ev) = &self.events {
                ev.warn("FreeDiskSpaceFailed", e.to_string());
            }
            return Err(e);
        }
        tracing::info!(freed, "image garbage collection freed enough space");
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const GB: u64 = 1 << 30;
    const MIN2: Duration = Duration::from_secs(120);

    fn fs(capacity: u64, available: u64) -> FsUsage {
        FsUsage { capacity_bytes: capacity, available_bytes: available }
    }

    struct T {
        base: Instant,
    }

    impl T {
        fn new() -> T {
            T { base: Instant::now() }
        }
        fn at(&self, secs: u64) -> Instant {
            self.base + Duration::from_secs(secs)
        }
        /// An unused image detected at `detected`, last used at `used`.
        fn img(&self, id: &str, size: u64, detected: u64, used: Option<u64>) -> ImageInfo {
            ImageInfo {
                id: id.into(),
                size,
                repo_tags: vec![format!("r/{id}:1")],
                first_detected: self.at(detected),
                last_used: used.map(|u| self.at(u)),
                in_use: false,
                pinned: false,
            }
        }
    }

    fn removed(p: &Plan) -> Vec<&str> {
        match p {
            Plan::Free { remove, .. } => remove.iter().map(String::as_str).collect(),
            other => panic!("expected Free, got {other:?}"),
        }
    }

    #[test]
    fn usage_percent_as_upstream() {
        assert_eq!(fs(100, 100).usage_percent(), 0);
        assert_eq!(fs(100, 0).usage_percent(), 100);
        assert_eq!(fs(100, 15).usage_percent(), 85);
        // 100 - floor(15.5) = 85: usage rounds up.
        assert_eq!(fs(1000, 155).usage_percent(), 85);
        assert_eq!(fs(1000, 151).usage_percent(), 85);
        assert_eq!(fs(1000, 150).usage_percent(), 85);
        assert_eq!(fs(1000, 149).usage_percent(), 86);
        // Available above capacity is clamped.
        assert_eq!(fs(100, 200).usage_percent(), 0);
        // Large filesystems do not overflow.
        assert_eq!(fs(u64::MAX, u64::MAX / 2).usage_percent(), 51);
    }

    #[test]
    fn amount_to_free() {
        // 90% used, low 80: free 10% of capacity.
        assert_eq!(fs(100 * GB, 10 * GB).to_free(80), 10 * GB);
        assert_eq!(fs(100 * GB, 10 * GB).to_free(0), 90 * GB);
        assert_eq!(fs(100 * GB, 30 * GB).to_free(80), 0);
        assert_eq!(fs(1000, 0).to_free(100), 0);
    }

    #[test]
    fn below_high_threshold_nothing() {
        let t = T::new();
        let images = vec![t.img("a", GB, 0, None)];
        let p = plan(fs(100 * GB, 16 * GB), 85, 80, MIN2, &images, t.at(3600));
        assert_eq!(p, Plan::BelowThreshold { usage_percent: 84 });
    }

    #[test]
    fn at_high_threshold_runs() {
        let t = T::new();
        let images = vec![t.img("a", 5 * GB, 0, None)];
        let p = plan(fs(100 * GB, 15 * GB), 85, 80, MIN2, &images, t.at(3600));
        assert_eq!(p, Plan::Free { usage_percent: 85, to_free: 5 * GB, freed: 5 * GB, remove: vec!["a".into()] });
    }

    #[test]
    fn zero_capacity_is_invalid() {
        let t = T::new();
        assert_eq!(plan(fs(0, 0), 85, 80, MIN2, &[], t.at(0)), Plan::InvalidCapacity);
    }

    #[test]
    fn frees_only_what_is_needed_lru_first() {
        let t = T::new();
        // Used at 300, 100, 200: removal order b, c, a; 2 GB needed, each is 1 GB.
        let images = vec![
            t.img("a", GB, 0, Some(300)),
            t.img("b", GB, 0, Some(100)),
            t.img("c", GB, 0, Some(200)),
        ];
        let p = plan(fs(100 * GB, 18 * GB), 80, 80, MIN2, &images, t.at(3600));
        assert_eq!(p, Plan::Free { usage_percent: 82, to_free: 2 * GB, freed: 2 * GB, remove: vec!["b".into(), "c".into()] });
    }

    #[test]
    fn never_used_goes_before_used() {
        let t = T::new();
        let images = vec![t.img("used", GB, 0, Some(10)), t.img("never", GB, 50, None)];
        let p = plan(fs(100 * GB, 19 * GB), 80, 80, MIN2, &images, t.at(3600));
        assert_eq!(removed(&p), vec!["never"]);
    }

    #[test]
    fn ties_broken_by_first_detected() {
        let t = T::new();
        let images = vec![
            t.img("late", GB, 30, Some(500)),
            t.img("early", GB, 10, Some(500)),
            t.img("mid", GB, 20, Some(500)),
        ];
        let p = plan(fs(100 * GB, 0), 85, 0, MIN2, &images, t.at(3600));
        assert_eq!(removed(&p), vec!["early", "mid", "late"]);
    }

    #[test]
    fn in_use_and_pinned_are_protected() {
        let t = T::new();
        let mut inuse = t.img("inuse", 10 * GB, 0, Some(3600));
        inuse.in_use = true;
        let mut pinned = t.img("pinned", 10 * GB, 0, None);
        pinned.pinned = true;
        let free = t.img("free", GB, 0, None);
        let p = plan(fs(100 * GB, 0), 85, 0, MIN2, &[inuse, pinned, free], t.at(3600));
        assert_eq!(p, Plan::Free { usage_percent: 100, to_free: 100 * GB, freed: GB, remove: vec!["free".into()] });
    }

    #[test]
    fn used_now_counts_as_in_use() {
        // Upstream skips images whose lastUsed is not before the GC time.
        let t = T::new();
        let images = vec![t.img("now", GB, 0, Some(3600)), t.img("old", GB, 0, Some(10))];
        let p = plan(fs(100 * GB, 0), 85, 0, MIN2, &images, t.at(3600));
        assert_eq!(removed(&p), vec!["old"]);
    }

    #[test]
    fn max_age_removes_only_long_unused_images_after_the_agent_ran_that_long() {
        let t = T::new();
        let max = Duration::from_secs(100);
        let images = vec![
            t.img("old-used", 1, 0, Some(10)),
            t.img("recent", 1, 0, Some(150)),
            t.img("never-used", 1, 0, None),
            ImageInfo { in_use: true, ..t.img("in-use", 1, 0, Some(0)) },
            ImageInfo { pinned: true, ..t.img("pinned", 1, 0, None) },
        ];
        // Off.
        assert!(aged_out(&images, Duration::ZERO, t.at(0), t.at(1000)).is_empty());
        // The agent has not run for max_age yet (exactly max_age is not longer).
        assert!(aged_out(&images, max, t.at(0), t.at(100)).is_empty());
        // At 200 s: unused since 10 s (190 > 100) and never used since the start (200 > 100);
        // used at 150 s (50) stays; in use and pinned stay.
        assert_eq!(aged_out(&images, max, t.at(0), t.at(200)), vec!["old-used", "never-used"]);
        // Unused for exactly max_age is not longer than it.
        assert_eq!(aged_out(&images, max, t.at(0), t.at(250)), vec!["old-used", "never-used"]);
        assert_eq!(aged_out(&images, max, t.at(0), t.at(251)), vec!["old-used", "recent", "never-used"]);
        // Never used counts from the agent's start, not from time zero.
        assert!(aged_out(&[t.img("never-used", 1, 0, None)], max, t.at(50), t.at(151)).len() == 1);
        assert!(aged_out(&[t.img("never-used", 1, 0, None)], max, t.at(50), t.at(150)).is_empty());
    }

    #[test]
    fn younger_than_min_age_is_kept() {
        let t = T::new();
        let images = vec![
            t.img("young", GB, 3600 - 119, None),
            t.img("exact", GB, 3600 - 120, None),
            t.img("old", GB, 0, None),
        ];
        let p = plan(fs(100 * GB, 0), 85, 0, MIN2, &images, t.at(3600));
        assert_eq!(removed(&p), vec!["old", "exact"]);
    }

    #[test]
    fn zero_min_age_allows_fresh_images() {
        let t = T::new();
        let images = vec![t.img("fresh", GB, 100, None)];
        let p = plan(fs(100 * GB, 0), 85, 0, Duration::ZERO, &images, t.at(100));
        assert_eq!(removed(&p), vec!["fresh"]);
    }

    #[test]
    fn not_enough_eligible_reports_shortfall() {
        let t = T::new();
        let images = vec![t.img("a", GB, 0, None), t.img("b", 2 * GB, 0, None)];
        let p = plan(fs(100 * GB, 5 * GB), 90, 50, MIN2, &images, t.at(3600));
        assert_eq!(p, Plan::Free { usage_percent: 95, to_free: 45 * GB, freed: 3 * GB, remove: vec!["a".into(), "b".into()] });
    }

    #[test]
    fn over_threshold_but_nothing_to_free_when_low_is_met() {
        // high 85 reached while usage is already at or below low (only possible when
        // low >= usage, e.g. right at the line): nothing to remove.
        let t = T::new();
        let images = vec![t.img("a", GB, 0, None)];
        let p = plan(fs(100 * GB, 15 * GB), 85, 85, MIN2, &images, t.at(3600));
        assert_eq!(p, Plan::Free { usage_percent: 85, to_free: 0, freed: 0, remove: vec![] });
    }

    #[test]
    fn one_big_image_can_cover_the_amount() {
        let t = T::new();
        let images = vec![t.img("big", 50 * GB, 0, None), t.img("small", GB, 0, Some(5))];
        let p = plan(fs(100 * GB, 10 * GB), 85, 80, MIN2, &images, t.at(3600));
        assert_eq!(removed(&p), vec!["big"]);
    }

    #[test]
    fn zero_sized_images_do_not_stop_early() {
        let t = T::new();
        let images = vec![t.img("empty", 0, 0, None), t.img("real", GB, 1, None)];
        let p = plan(fs(100 * GB, 19 * GB), 80, 80, MIN2, &images, t.at(3600));
        assert_eq!(removed(&p), vec!["empty", "real"]);
    }

    #[test]
    fn records_first_detected_and_last_used() {
        let t = T::new();
        let mut r = Records::default();
        let a = ListedImage { id: "sha256:a".into(), size: 1, repo_tags: vec!["r/a:1".into()], repo_digests: vec![], pinned: false };
        let b = ListedImage { id: "sha256:b".into(), size: 2, repo_tags: vec![], repo_digests: vec!["r/b@sha256:x".into()], pinned: true };
        let in_use: BTreeSet<String> = ["sha256:a".to_string()].into();
        let v = r.observe(std::slice::from_ref(&a), &in_use, t.at(0));
        assert_eq!(v[0].first_detected, t.at(0));
        assert_eq!(v[0].last_used, Some(t.at(0)));
        assert!(v[0].in_use);

        // Later: a no longer in use keeps its first detection and last use; b is new and used
        // by its digest.
        let in_use: BTreeSet<String> = ["r/b@sha256:x".to_string()].into();
        let v = r.observe(&[a.clone(), b.clone()], &in_use, t.at(60));
        assert_eq!((v[0].first_detected, v[0].last_used, v[0].in_use), (t.at(0), Some(t.at(0)), false));
        assert_eq!((v[1].first_detected, v[1].last_used, v[1].in_use), (t.at(60), Some(t.at(60)), true));
        assert!(v[1].pinned);
        assert_eq!(r.len(), 2);

        // a vanished: forgotten; when it comes back it is new again.
        r.observe(std::slice::from_ref(&b), &BTreeSet::new(), t.at(120));
        assert_eq!(r.len(), 1);
        let v = r.observe(&[a, b], &BTreeSet::new(), t.at(180));
        assert_eq!((v[0].first_detected, v[0].last_used), (t.at(180), None));
        assert_eq!((v[1].first_detected, v[1].last_used), (t.at(60), Some(t.at(60))));
    }

    #[test]
    fn in_use_by_tag() {
        let t = T::new();
        let mut r = Records::default();
        let a = ListedImage { id: "sha256:a".into(), size: 1, repo_tags: vec!["r/a:1".into()], repo_digests: vec![], pinned: false };
        let v = r.observe(&[a], &["r/a:1".to_string()].into(), t.at(0));
        assert!(v[0].in_use);
    }

    #[test]
    fn records_then_plan_over_rounds() {
        // Round 1 (t=0): x used by a container, y not. Round 2 (t=200): nothing in use: y was
        // never used so it goes first, then x.
        let t = T::new();
        let mut r = Records::default();
        let img = |id: &str| ListedImage { id: id.into(), size: GB, repo_tags: vec![], repo_digests: vec![], pinned: false };
        let imgs = [img("x"), img("y")];
        let v = r.observe(&imgs, &["x".to_string()].into(), t.at(0));
        let p = plan(fs(100 * GB, 0), 85, 0, MIN2, &v, t.at(0));
        assert_eq!(removed(&p), Vec::<&str>::new(), "y is too young, x in use");
        let v = r.observe(&imgs, &BTreeSet::new(), t.at(200));
        let p = plan(fs(100 * GB, 0), 85, 0, MIN2, &v, t.at(200));
        assert_eq!(removed(&p), vec!["y", "x"]);
    }

    #[test]
    fn containers_in_use() {
        let c = |r: &str, id: &str, spec: &str| api::Container {
            image_ref: r.into(),
            image_id: id.into(),
            image: Some(api::ImageSpec { image: spec.into(), ..Default::default() }),
            ..Default::default()
        };
        let set = images_in_use(&[c("sha256:a", "", "sha256:a"), c("", "sha256:b", "r/b:1"), c("", "", "")]);
        assert_eq!(set, ["r/b:1", "sha256:a", "sha256:b"].into_iter().map(String::from).collect());
    }

    #[test]
    fn sandbox_image_from_status_info() {
        let mut info = HashMap::new();
        assert_eq!(sandbox_image_from_info(&info), None);
        info.insert("config".to_string(), "not json".to_string());
        assert_eq!(sandbox_image_from_info(&info), None);
        info.insert(
            "config".to_string(),
            r#"{"containerd":{"snapshotter":"overlayfs"},"sandboxImage":"registry.k8s.io/pause:3.6","statsCollectPeriod":10}"#
                .to_string(),
        );
        assert_eq!(sandbox_image_from_info(&info).as_deref(), Some("registry.k8s.io/pause:3.6"));
        info.insert("config".to_string(), r#"{"sandboxImage":""}"#.to_string());
        assert_eq!(sandbox_image_from_info(&info), None);
    }

    #[test]
    fn shortfall_in_upstreams_words() {
        let e = ImageGcError::NotEnoughFreed { to_free: 10, freed: 3 };
        assert_eq!(
            e.to_string(),
            "Failed to garbage collect required amount of images. Attempted to free 10 bytes, but only found 3 bytes eligible to free."
        );
    }

    #[test]
    fn high_100_disables() {
        let c = |high| ImageGcConfig { high_threshold_percent: high, low_threshold_percent: 80, min_age: MIN2, max_age: Duration::ZERO, period: MIN2 };
        assert!(c(100).disabled());
        assert!(!c(85).disabled());
    }

    #[test]
    fn statvfs_of_a_real_dir() {
        let dir = tempfile::tempdir().unwrap();
        let u = fs_usage(dir.path()).unwrap();
        assert!(u.capacity_bytes > 0 && u.available_bytes <= u.capacity_bytes, "{u:?}");
        let err = fs_usage(&dir.path().join("missing")).unwrap_err().to_string();
        assert!(err.contains("statvfs of the image filesystem"), "{err}");
    }
}
