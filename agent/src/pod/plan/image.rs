//! Image decisions of a container start, as upstream's imageManager.EnsureImageExists: the
//! pull policy (defaulted from the tag when unset) and, from whether the image is on the node,
//! what to do.

use k8s_openapi::api::core::v1::Container;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PullPolicy {
    Always,
    IfNotPresent,
    Never,
}

/// The container's pull policy; unset: Always for `:latest` or no tag, else IfNotPresent (the
/// API server's defaulting, for objects that skipped it).
pub fn pull_policy(c: &Container) -> PullPolicy {
    let image = c.image.as_deref().unwrap_or("");
    match c.image_pull_policy.as_deref() {
        Some("Always") => PullPolicy::Always,
        Some("Never") => PullPolicy::Never,
        Some("IfNotPresent") => PullPolicy::IfNotPresent,
        _ => {
            // The tag is after the last ':' of the last path component (a registry port is not a
            // tag); a digest pins the image.
            let last = image.rsplit('/').next().unwrap_or("");
            if image.contains('@') || (last.contains(':') && !image.ends_with(":latest")) {
                PullPolicy::IfNotPresent
            } else {
                PullPolicy::Always
            }
        }
    }
}

/// What a start does about the image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ImageStep {
    /// Pull it (a failed pull falls back to the present copy, if any).
    Pull,
    /// Use the image on the node.
    UsePresent,
    /// Wait: ErrImageNeverPull with this message.
    NeverPullAbsent(String),
    /// Wait: InvalidImageName with this message.
    Invalid(String),
}

/// The step for `image` under `policy`, the image being `present` on the node or not.
pub fn image_step(image: &str, policy: PullPolicy, present: bool) -> ImageStep {
    if image.is_empty() {
        return ImageStep::Invalid(format!("Failed to apply default image tag {image:?}: couldn't parse image name"));
    }
    match (policy, present) {
        (PullPolicy::Always, _) | (PullPolicy::IfNotPresent, false) => ImageStep::Pull,
        (PullPolicy::IfNotPresent, true) | (PullPolicy::Never, true) => ImageStep::UsePresent,
        (PullPolicy::Never, false) => {
            ImageStep::NeverPullAbsent(format!("Container image {image:?} is not present with pull policy of Never"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(image: &str, policy: Option<&str>) -> Container {
        Container {
            name: "c".into(),
            image: Some(image.into()),
            image_pull_policy: policy.map(Into::into),
            ..Default::default()
        }
    }

    #[test]
    fn default_policy_follows_the_tag() {
        for (image, want) in [
            ("busybox", PullPolicy::Always),
            ("busybox:latest", PullPolicy::Always),
            ("busybox:1.36", PullPolicy::IfNotPresent),
            ("registry.local:5000/busybox", PullPolicy::Always),
            ("registry.local:5000/busybox:1.36", PullPolicy::IfNotPresent),
            ("busybox@sha256:0123", PullPolicy::IfNotPresent),
        ] {
            assert_eq!(pull_policy(&c(image, None)), want, "{image}");
        }
        assert_eq!(pull_policy(&c("busybox:1.36", Some("Always"))), PullPolicy::Always);
        assert_eq!(pull_policy(&c("busybox", Some("Never"))), PullPolicy::Never);
        assert_eq!(pull_policy(&c("busybox", Some("IfNotPresent"))), PullPolicy::IfNotPresent);
    }

    #[test]
    fn steps() {
        use ImageStep::*;
        assert_eq!(image_step("a:1", PullPolicy::Always, true), Pull);
        assert_eq!(image_step("a:1", PullPolicy::Always, false), Pull);
        assert_eq!(image_step("a:1", PullPolicy::IfNotPresent, false), Pull);
        assert_eq!(image_step("a:1", PullPolicy::IfNotPresent, true), UsePresent);
        assert_eq!(image_step("a:1", PullPolicy::Never, true), UsePresent);
        assert_eq!(
            image_step("a:1", PullPolicy::Never, false),
            NeverPullAbsent("Container image \"a:1\" is not present with pull policy of Never".into())
        );
        assert!(matches!(image_step("", PullPolicy::Always, false), Invalid(m) if m.contains("couldn't parse image name")));
    }
}
