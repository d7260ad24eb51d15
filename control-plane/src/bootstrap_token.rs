//! Bootstrap tokens (upstream's bootstrap token authenticator, kubeadm's join tokens): a bearer
//! token `<id>.<secret>` (6 and 16 characters of [a-z0-9]) is checked against the Secret
//! `kube-system/bootstrap-token-<id>` of type `bootstrap.kubernetes.io/token`; a valid one
//! authenticates as `system:bootstrap:<id>` in `system:bootstrappers` and the Secret's
//! `auth-extra-groups`. What such a user may do is RBAC's: ferro binds its default token group
//! to creating node CSRs only (rbac/bootstrap/policy.yaml).

use base64::Engine as _;
use serde_json::{json, Value};

use crate::auth::User;

pub const SECRET_TYPE: &str = "bootstrap.kubernetes.io/token";
pub const NAME_PREFIX: &str = "bootstrap-token-";
pub const NAMESPACE: &str = "kube-system";
/// Every bootstrap token user is in this group.
pub const GROUP: &str = "system:bootstrappers";
/// The group ferro's `token create` puts its tokens in (kubeadm's is
/// `system:bootstrappers:kubeadm:default-node-token`).
pub const DEFAULT_GROUP: &str = "system:bootstrappers:ferro:default-node-token";

/// Splits `<id>.<secret>` when it has the bootstrap token's shape.
pub fn split(token: &str) -> Option<(&str, &str)> {
    k8s_semantics::bootstrap::split_token(token)
}

fn data<'a>(secret: &'a Value, key: &str) -> Option<String> {
    let v: &'a Value = secret.pointer(&format!("/data/{key}"))?;
    let bytes = base64::engine::general_purpose::STANDARD.decode(v.as_str()?).ok()?;
    String::from_utf8(bytes).ok()
}

fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Whether an extra group is one a bootstrap token may carry (upstream's regexp
/// `^system:bootstrappers:[a-z0-9:-]{0,255}[a-z0-9]$`).
pub fn valid_group(g: &str) -> bool {
    let Some(rest) = g.strip_prefix("system:bootstrappers:") else { return false };
    !rest.is_empty()
        && rest.len() <= 256
        && rest.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b':' || b == b'-')
        && rest.bytes().last().is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
}

/// The user a token's Secret names, or why the token is refused (logged, never told to the
/// client: a refused token is a plain 401).
pub fn user_of(secret: &Value, id: &str, token_secret: &str, now: jiff::Timestamp) -> Result<User, String> {
    if secret.get("type").and_then(Value::as_str) != Some(SECRET_TYPE) {
        return Err(format!("secret is not of type {SECRET_TYPE}"));
    }
    if secret.pointer("/metadata/deletionTimestamp").is_some_and(|t| !t.is_null()) {
        return Err("token is being deleted".into());
    }
    if data(secret, "token-id").as_deref() != Some(id) {
        return Err("token id does not match its secret".into());
    }
    if !same(data(secret, "token-secret").unwrap_or_default().as_bytes(), token_secret.as_bytes()) {
        return Err("token secret does not match".into());
    }
    if let Some(exp) = data(secret, "expiration") {
        let at: jiff::Timestamp = exp.parse().map_err(|_| format!("expiration {exp:?} is not RFC 3339"))?;
        if now >= at {
            return Err(format!("token expired at {exp}"));
        }
    }
    if data(secret, "usage-bootstrap-authentication").as_deref() != Some("true") {
        return Err("token is not for authentication (usage-bootstrap-authentication)".into());
    }
    let mut groups = vec![GROUP.to_string()];
    for g in data(secret, "auth-extra-groups").unwrap_or_default().split(',').map(str::trim).filter(|g| !g.is_empty()) {
        if !valid_group(g) {
            return Err(format!("auth-extra-groups has {g:?}, not a system:bootstrappers: group"));
        }
        if !groups.iter().any(|x| x == g) {
            groups.push(g.to_string());
        }
    }
    groups.push("system:authenticated".into());
    Ok(User { name: format!("system:bootstrap:{id}"), groups })
}

/// A new token: 6 + 16 random characters of [a-z0-9].
pub fn generate() -> String {
    use rand::Rng as _;
    const CHARS: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut rng = rand::rng();
    let mut pick = |n: usize| -> String { (0..n).map(|_| CHARS[rng.random_range(0..CHARS.len())] as char).collect() };
    let id = pick(6);
    format!("{id}.{}", pick(16))
}

/// The Secret holding a token (what `kubeadm token create` writes).
pub fn secret_for(token: &str, expiration: Option<jiff::Timestamp>, description: &str, groups: &[String]) -> Option<Value> {
    let (id, secret) = split(token)?;
    let b64 = |s: &str| json!(base64::engine::general_purpose::STANDARD.encode(s));
    let mut data = serde_json::Map::new();
    data.insert("token-id".into(), b64(id));
    data.insert("token-secret".into(), b64(secret));
    data.insert("usage-bootstrap-authentication".into(), b64("true"));
    data.insert("usage-bootstrap-signing".into(), b64("true"));
    if let Some(e) = expiration {
        data.insert("expiration".into(), b64(&e.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()));
    }
    if !description.is_empty() {
        data.insert("description".into(), b64(description));
    }
    if !groups.is_empty() {
        data.insert("auth-extra-groups".into(), b64(&groups.join(",")));
    }
    Some(json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": format!("{NAME_PREFIX}{id}"), "namespace": NAMESPACE},
        "type": SECRET_TYPE,
        "data": data,
    }))
}

/// Authenticates a bearer token that has a bootstrap token's shape; None otherwise or when
/// refused (the reason is logged).
pub async fn authenticate(api: &crate::api::Api, token: &str) -> Option<User> {
    let (id, secret) = split(token)?;
    let res = crate::resources::find("", "v1", "secrets")?;
    let record = api.get(res, Some(NAMESPACE), &format!("{NAME_PREFIX}{id}")).await.ok()?;
    let obj = record.json().ok()?;
    match user_of(&obj, id, secret, jiff::Timestamp::now()) {
        Ok(u) => Some(u),
        Err(why) => {
            tracing::info!(token_id = id, %why, "bootstrap token refused");
            None
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn now() -> jiff::Timestamp {
        "2026-11-27T00:00:00Z".parse().unwrap()
    }

    #[test]
    fn only_the_tokens_shape_is_split() {
        assert_eq!(split("abcdef.0123456789abcdef"), Some(("abcdef", "0123456789abcdef")));
        assert_eq!(split("abcdef.0123456789abcde"), None);
        assert_eq!(split("ABCDEF.0123456789abcdef"), None);
        assert_eq!(split("abcdef0123456789abcdef"), None);
        assert_eq!(split("abc.def.0123456789abcdef"), None);
        let t = generate();
        assert!(split(&t).is_some(), "{t}");
        assert_ne!(generate(), t);
    }

    #[test]
    fn a_valid_token_is_its_bootstrap_user() {
        let exp: jiff::Timestamp = "2026-11-28T00:00:00Z".parse().unwrap();
        let s = secret_for("abcdef.0123456789abcdef", Some(exp), "join", &[DEFAULT_GROUP.into()]).unwrap();
        let u = user_of(&s, "abcdef", "0123456789abcdef", now()).unwrap();
        assert_eq!(u.name, "system:bootstrap:abcdef");
        assert_eq!(u.groups, [GROUP, DEFAULT_GROUP, "system:authenticated"]);
    }

    #[test]
    fn wrong_expired_or_unfit_tokens_are_refused() {
        let exp: jiff::Timestamp = "2026-11-28T00:00:00Z".parse().unwrap();
        let s = secret_for("abcdef.0123456789abcdef", Some(exp), "", &[]).unwrap();
        assert_eq!(user_of(&s, "abcdef", "0123456789abcdeX", now()).unwrap_err(), "token secret does not match");
        assert_eq!(user_of(&s, "abcdeg", "0123456789abcdef", now()).unwrap_err(), "token id does not match its secret");
        let later: jiff::Timestamp = "2026-11-28T00:00:01Z".parse().unwrap();
        assert!(user_of(&s, "abcdef", "0123456789abcdef", later).unwrap_err().starts_with("token expired"));
        let mut opaque = s.clone();
        opaque["type"] = json!("Opaque");
        assert!(user_of(&opaque, "abcdef", "0123456789abcdef", now()).is_err());
        let mut deleting = s.clone();
        deleting["metadata"]["deletionTimestamp"] = json!("2026-11-26T00:00:00Z");
        assert!(user_of(&deleting, "abcdef", "0123456789abcdef", now()).is_err());
        let mut no_auth = s.clone();
        no_auth["data"].as_object_mut().unwrap().remove("usage-bootstrap-authentication");
        assert!(user_of(&no_auth, "abcdef", "0123456789abcdef", now()).is_err());
        let masters = secret_for("abcdef.0123456789abcdef", None, "", &["system:masters".into()]).unwrap();
        assert!(user_of(&masters, "abcdef", "0123456789abcdef", now()).unwrap_err().contains("system:masters"));
    }

    #[test]
    fn extra_groups_must_be_bootstrappers() {
        assert!(valid_group("system:bootstrappers:kubeadm:default-node-token"));
        assert!(valid_group(DEFAULT_GROUP));
        assert!(!valid_group("system:bootstrappers:"));
        assert!(!valid_group("system:bootstrappers:x-"));
        assert!(!valid_group("system:nodes"));
    }
}
