//! API errors and their metav1.Status form.

use serde_json::{json, Value};

use crate::validation::FieldError;

/// An error answered to a client as a metav1.Status with upstream's reason and code.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{message}")]
pub struct ApiError {
    pub code: u16,
    pub reason: &'static str,
    pub message: String,
    pub details: Option<Value>,
}

impl ApiError {
    pub fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        ApiError { code, reason, message: message.into(), details: None }
    }

    pub(crate) fn with_details(mut self, group: &str, kind: &str, name: &str) -> Self {
        let mut d = serde_json::Map::new();
        if !name.is_empty() {
            d.insert("name".into(), json!(name));
        }
        if !group.is_empty() {
            d.insert("group".into(), json!(group));
        }
        d.insert("kind".into(), json!(kind));
        self.details = Some(Value::Object(d));
        self
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        ApiError::new(400, "BadRequest", message)
    }

    pub fn unauthorized() -> Self {
        ApiError::new(401, "Unauthorized", "Unauthorized")
    }

    /// `resource` is upstream's group-qualified resource ("deployments.apps").
    pub fn forbidden(resource: &str, name: &str, why: impl std::fmt::Display) -> Self {
        let message = if name.is_empty() {
            format!("{resource} is forbidden: {why}")
        } else {
            format!("{resource} \"{name}\" is forbidden: {why}")
        };
        let (kind, group) = split_gr(resource);
        ApiError::new(403, "Forbidden", message).with_details(group, kind, name)
    }

    pub fn not_found(resource: &str, name: &str) -> Self {
        let (kind, group) = split_gr(resource);
        ApiError::new(404, "NotFound", format!("{resource} \"{name}\" not found"))
            .with_details(group, kind, name)
    }

    /// A path that serves nothing: upstream answers a bare 404 Status.
    pub fn no_route() -> Self {
        ApiError::new(404, "NotFound", "the server could not find the requested resource")
            .with_details("", "", "")
    }

    pub fn method_not_allowed(method: &str) -> Self {
        ApiError::new(
            405,
            "MethodNotAllowed",
            format!("the server does not allow this method on the requested resource ({method})"),
        )
    }

    pub fn already_exists(resource: &str, name: &str) -> Self {
        let (kind, group) = split_gr(resource);
        ApiError::new(409, "AlreadyExists", format!("{resource} \"{name}\" already exists"))
            .with_details(group, kind, name)
    }

    pub fn conflict(resource: &str, name: &str, why: &str) -> Self {
        let (kind, group) = split_gr(resource);
        ApiError::new(
            409,
            "Conflict",
            format!("Operation cannot be fulfilled on {resource} \"{name}\": {why}"),
        )
        .with_details(group, kind, name)
    }

    pub fn stale(resource: &str, name: &str) -> Self {
        ApiError::conflict(
            resource,
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        )
    }

    pub fn gone(message: impl Into<String>) -> Self {
        ApiError::new(410, "Expired", message)
    }

    pub fn too_large() -> Self {
        ApiError::new(413, "RequestEntityTooLarge", "Request entity too large: limit is 3145728")
    }

    pub fn unsupported_media_type(content_type: &str) -> Self {
        ApiError::new(
            415,
            "UnsupportedMediaType",
            format!("the body of the request was in an unknown format - accepted media types include: application/json, application/yaml, application/vnd.kubernetes.protobuf (got {content_type})"),
        )
    }

    pub fn not_acceptable(accept: &str) -> Self {
        ApiError::new(
            406,
            "NotAcceptable",
            format!("only the following media types are accepted: application/json, application/yaml, application/json;stream=watch (got {accept})"),
        )
    }

    /// 422 with field causes, as upstream's NewInvalid.
    pub fn invalid(kind: &str, group: &str, name: &str, errors: &[FieldError]) -> Self {
        let messages: Vec<String> = errors.iter().map(|e| e.message()).collect();
        let joined = if messages.len() == 1 {
            messages[0].clone()
        } else {
            format!("[{}]", messages.join(", "))
        };
        let message = format!("{kind} \"{name}\" is invalid: {joined}");
        let causes: Vec<Value> = errors
            .iter()
            // upstream's cause message is the error's body: kubectl prints the field before it
            .map(|e| json!({"reason": e.reason(), "message": e.body(), "field": e.field}))
            .collect();
        let mut err = ApiError::new(422, "Invalid", message).with_details(group, kind, name);
        if let Some(Value::Object(d)) = err.details.as_mut() {
            d.insert("causes".into(), Value::Array(causes));
        }
        err
    }

    pub fn too_many_requests(message: impl Into<String>) -> Self {
        let mut e = ApiError::new(429, "TooManyRequests", message);
        e.details = Some(json!({"retryAfterSeconds": 1}));
        e
    }

    /// 504 as upstream answers a read at a revision the store has not reached.
    pub fn too_large_resource_version(requested: i64, current: i64) -> Self {
        let mut e = ApiError::new(
            504,
            "Timeout",
            format!("Timeout: Too large resource version: {requested}, current: {current}"),
        );
        e.details = Some(json!({
            "causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}],
            "retryAfterSeconds": 1,
        }));
        e
    }

    pub fn internal(message: impl std::fmt::Display) -> Self {
        ApiError::new(500, "InternalError", format!("Internal error occurred: {message}"))
    }

    pub fn service_unavailable(message: impl Into<String>) -> Self {
        ApiError::new(503, "ServiceUnavailable", message)
    }

    pub fn status(&self) -> Value {
        let mut s = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if let Some(d) = &self.details {
            s["details"] = d.clone();
        }
        if self.reason.is_empty() {
            if let Some(o) = s.as_object_mut() {
                o.remove("reason");
            }
        }
        s
    }
}

/// "deployments.apps" -> ("deployments", "apps").
fn split_gr(resource: &str) -> (&str, &str) {
    match resource.split_once('.') {
        Some((r, g)) => (r, g),
        None => (resource, ""),
    }
}

impl From<crate::store::StoreError> for ApiError {
    fn from(e: crate::store::StoreError) -> Self {
        use crate::store::StoreError::*;
        match e {
            Compacted { requested, oldest } => ApiError::gone(format!(
                "too old resource version: {requested} ({})",
                oldest + 1
            )),
            Closed => ApiError::service_unavailable("the storage is shutting down"),
            other => ApiError::internal(other),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn status_shapes() {
        let s = ApiError::not_found("deployments.apps", "web").status();
        assert_eq!(s["message"], "deployments.apps \"web\" not found");
        assert_eq!(s["details"], json!({"name": "web", "group": "apps", "kind": "deployments"}));
        assert_eq!(s["code"], 404);
        let s = ApiError::stale("pods", "p").status();
        assert_eq!(s["reason"], "Conflict");
        assert_eq!(s["code"], 409);
        let e = ApiError::invalid(
            "Pod",
            "",
            "Bad",
            &[FieldError::invalid("metadata.name", json!("Bad"), "x")],
        );
        let s = e.status();
        assert_eq!(s["message"], "Pod \"Bad\" is invalid: metadata.name: Invalid value: \"Bad\": x");
        assert_eq!(s["details"]["causes"][0]["field"], "metadata.name");
        assert_eq!(s["details"]["causes"][0]["reason"], "FieldValueInvalid");
        assert_eq!(s["details"]["causes"][0]["message"], "Invalid value: \"Bad\": x", "without the field, as upstream's");
    }
}
