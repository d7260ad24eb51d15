//! Impersonation as upstream's filter does it: `Impersonate-User`, `Impersonate-Group`
//! (repeated), `Impersonate-Uid` and `Impersonate-Extra-<key>` headers make a request act as
//! another user when the requester may `impersonate` each of them (`users`, `groups`,
//! `serviceaccounts` for a `system:serviceaccount:<ns>:<name>` user, `uids` and
//! `userextras/<key>` in authentication.k8s.io). `kubectl --as` and `--as-group` send them.
//!
//! Parsing and the impersonated user are pure; [`impersonate`] takes the authorizer as a
//! function so the server passes its chain in.

use http::HeaderMap;

use crate::auth::{Attributes, User};
use crate::error::ApiError;

pub const USER: &str = "impersonate-user";
pub const GROUP: &str = "impersonate-group";
pub const UID: &str = "impersonate-uid";
pub const EXTRA_PREFIX: &str = "impersonate-extra-";

/// One thing a request asks to act as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    User(String),
    ServiceAccount { namespace: String, name: String },
    Group(String),
    Uid(String),
    Extra { key: String, value: String },
}

impl Target {
    /// What the requester must be allowed: `impersonate` on (group, resource, subresource,
    /// namespace, name).
    pub fn attributes(&self) -> Attributes<'_> {
        let a = |group, resource, subresource, namespace, name| Attributes { verb: "impersonate", group, resource, subresource, namespace, name };
        match self {
            Target::User(n) => a("", "users", "", "", n),
            Target::ServiceAccount { namespace, name } => a("", "serviceaccounts", "", namespace, name),
            Target::Group(n) => a("", "groups", "", "", n),
            Target::Uid(u) => a("authentication.k8s.io", "uids", "", "", u),
            Target::Extra { key, value } => a("authentication.k8s.io", "userextras", key, "", value),
        }
    }

    /// Go's `%v` of the ObjectReference upstream builds for it (for the one error message
    /// that prints them).
    fn go_form(&self) -> String {
        let (kind, ns, name, api_version, field) = match self {
            Target::User(n) => ("User", "", n.as_str(), "", ""),
            Target::ServiceAccount { namespace, name } => ("ServiceAccount", namespace.as_str(), name.as_str(), "", ""),
            Target::Group(n) => ("Group", "", n.as_str(), "", ""),
            Target::Uid(u) => ("UID", "", u.as_str(), "authentication.k8s.io/v1", ""),
            Target::Extra { key, value } => ("UserExtra", "", value.as_str(), "authentication.k8s.io/v1", key.as_str()),
        };
        format!("{{{kind} {ns} {name}  {api_version}  {field}}}")
    }
}

/// Upstream's serviceaccount.SplitUsername: (namespace, name) of a well-formed
/// `system:serviceaccount:<namespace>:<name>`.
pub fn split_service_account(user: &str) -> Option<(String, String)> {
    let rest = user.strip_prefix("system:serviceaccount:")?;
    let (ns, name) = rest.split_once(':')?;
    if name.contains(':') || !crate::validation::dns1123_label(ns).is_empty() || !crate::validation::dns1123_subdomain(name).is_empty() {
        return None;
    }
    Some((ns.to_string(), name.to_string()))
}

/// The targets the headers ask for, in upstream's order (user, groups, extras, uid); Err with
/// upstream's message when groups, extras or a uid come without a user.
pub fn parse(headers: &HeaderMap) -> Result<Vec<Target>, String> {
    let value = |v: &http::HeaderValue| String::from_utf8_lossy(v.as_bytes()).into_owned();
    let mut out = Vec::new();
    let user = headers.get(USER).map(value).filter(|u| !u.is_empty());
    if let Some(u) = &user {
        out.push(match split_service_account(u) {
            Some((namespace, name)) => Target::ServiceAccount { namespace, name },
            None => Target::User(u.clone()),
        });
    }
    for g in headers.get_all(GROUP) {
        out.push(Target::Group(value(g)));
    }
    let mut extras: Vec<(String, String)> = Vec::new();
    for (name, v) in headers {
        if let Some(key) = name.as_str().strip_prefix(EXTRA_PREFIX) {
            let key = form_urlencoded::parse(format!("k={key}").as_bytes()).next().map(|(_, k)| k.into_owned()).unwrap_or_default();
            extras.push((key.to_lowercase(), value(v)));
        }
    }
    out.extend(extras.into_iter().map(|(key, value)| Target::Extra { key, value }));
    if let Some(uid) = headers.get(UID).map(value).filter(|u| !u.is_empty()) {
        out.push(Target::Uid(uid));
    }
    if user.is_none() && !out.is_empty() {
        let listed: Vec<String> = out.iter().map(Target::go_form).collect();
        return Err(format!("requested [{}] without impersonating a user", listed.join(" ")));
    }
    Ok(out)
}

/// The user the targets make: the user (or service account, with its groups unless groups
/// are given), the groups asked for, and `system:authenticated` unless that or
/// `system:unauthenticated` is among them (or the user is `system:anonymous`).
pub fn impersonated_user(targets: &[Target]) -> Option<User> {
    let mut name = None;
    let mut groups: Vec<String> = Vec::new();
    let groups_given = targets.iter().any(|t| matches!(t, Target::Group(_)));
    for t in targets {
        match t {
            Target::User(u) => name = Some(u.clone()),
            Target::ServiceAccount { namespace, name: sa } => {
                name = Some(super::index::service_account_user(namespace, sa));
                if !groups_given {
                    groups.push("system:serviceaccounts".into());
                    groups.push(format!("system:serviceaccounts:{namespace}"));
                }
            }
            Target::Group(g) => groups.push(g.clone()),
            Target::Uid(_) | Target::Extra { .. } => {}
        }
    }
    let name = name?;
    if name != "system:anonymous" && !groups.iter().any(|g| g == "system:authenticated" || g == "system:unauthenticated") {
        groups.push("system:authenticated".into());
    }
    Some(User { name, groups })
}

/// Acts on the impersonation headers of a request by `user`: Ok(None) without them, the
/// impersonated user when every target is allowed; a 403 in upstream's words for the first
/// that is not (`authorize` returns the forbidden text), a 500 for a malformed request.
pub fn impersonate(user: &User, headers: &HeaderMap, authorize: &dyn Fn(&Attributes<'_>) -> Result<(), String>) -> Result<Option<User>, ApiError> {
    let targets = parse(headers).map_err(ApiError::internal)?;
    if targets.is_empty() {
        return Ok(None);
    }
    for t in &targets {
        let a = t.attributes();
        if let Err(why) = authorize(&a) {
            let gr = if a.group.is_empty() { a.resource.to_string() } else { format!("{}.{}", a.resource, a.group) };
            return Err(ApiError::forbidden(&gr, a.name, why));
        }
    }
    tracing::debug!(user = %user.name, "impersonating");
    Ok(impersonated_user(&targets))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(http::HeaderName::from_bytes(k.as_bytes()).unwrap(), http::HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn headers_become_targets() {
        assert!(parse(&headers(&[])).unwrap().is_empty());
        let t = parse(&headers(&[("Impersonate-User", "bob"), ("Impersonate-Group", "dev"), ("Impersonate-Group", "ops"), ("Impersonate-Uid", "42"),
            ("Impersonate-Extra-Scopes", "view"), ("Impersonate-Extra-acme.com%2Fproject", "x")]))
        .unwrap();
        assert_eq!(
            t,
            [
                Target::User("bob".into()),
                Target::Group("dev".into()),
                Target::Group("ops".into()),
                Target::Extra { key: "scopes".into(), value: "view".into() },
                Target::Extra { key: "acme.com/project".into(), value: "x".into() },
                Target::Uid("42".into()),
            ]
        );
        let sa = parse(&headers(&[("Impersonate-User", "system:serviceaccount:team:ci")])).unwrap();
        assert_eq!(sa, [Target::ServiceAccount { namespace: "team".into(), name: "ci".into() }]);
        // not a well-formed service account name: a plain user
        for odd in ["system:serviceaccount:team", "system:serviceaccount:a:b:c", "system:serviceaccount:Team:ci"] {
            assert_eq!(parse(&headers(&[("Impersonate-User", odd)])).unwrap(), [Target::User(odd.into())]);
        }
        let e = parse(&headers(&[("Impersonate-Group", "dev")])).unwrap_err();
        assert_eq!(e, "requested [{Group  dev    }] without impersonating a user");
    }

    #[test]
    fn what_must_be_allowed() {
        let a = Target::ServiceAccount { namespace: "team".into(), name: "ci".into() };
        let at = a.attributes();
        assert_eq!((at.verb, at.group, at.resource, at.namespace, at.name), ("impersonate", "", "serviceaccounts", "team", "ci"));
        let e = Target::Extra { key: "scopes".into(), value: "view".into() };
        let at = e.attributes();
        assert_eq!((at.group, at.resource, at.subresource, at.name), ("authentication.k8s.io", "userextras", "scopes", "view"));
    }

    #[test]
    fn the_impersonated_user() {
        let u = impersonated_user(&[Target::User("bob".into())]).unwrap();
        assert_eq!(u.groups, ["system:authenticated"]);
        let u = impersonated_user(&[Target::User("bob".into()), Target::Group("dev".into())]).unwrap();
        assert_eq!(u.groups, ["dev", "system:authenticated"]);
        let u = impersonated_user(&[Target::ServiceAccount { namespace: "team".into(), name: "ci".into() }]).unwrap();
        assert_eq!(u.name, "system:serviceaccount:team:ci");
        assert_eq!(u.groups, ["system:serviceaccounts", "system:serviceaccounts:team", "system:authenticated"]);
        let u = impersonated_user(&[Target::User("system:anonymous".into()), Target::Group("system:unauthenticated".into())]).unwrap();
        assert_eq!(u.groups, ["system:unauthenticated"]);
    }

    #[test]
    fn every_target_is_authorized() {
        let jane = User { name: "jane".into(), groups: vec![] };
        let h = headers(&[("Impersonate-User", "bob"), ("Impersonate-Group", "admins")]);
        let only_users = |a: &Attributes<'_>| if a.resource == "users" { Ok(()) } else { Err(format!("User \"jane\" cannot impersonate resource \"{}\"", a.resource)) };
        let e = impersonate(&jane, &h, &only_users).unwrap_err();
        assert_eq!((e.code, e.message.as_str()), (403, "groups \"admins\" is forbidden: User \"jane\" cannot impersonate resource \"groups\""));
        let all = |_: &Attributes<'_>| Ok(());
        assert_eq!(impersonate(&jane, &h, &all).unwrap().unwrap().groups, ["admins", "system:authenticated"]);
        assert_eq!(impersonate(&jane, &headers(&[]), &all).unwrap(), None);
        assert_eq!(impersonate(&jane, &headers(&[("Impersonate-Uid", "1")]), &all).unwrap_err().code, 500);
    }
}
