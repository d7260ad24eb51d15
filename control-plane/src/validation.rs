//! Name and metadata validation helpers.
//!
//! The string checks (`dns1123_subdomain`, `qualified_name`, ...) return a list
//! of human-readable problems (an empty list means the value is valid) worded
//! exactly like Kubernetes' `k8s.io/apimachinery/pkg/util/validation` package
//! (as of v1.33), because these messages are sent back to clients.
//!
//! [`FieldError`] mirrors apimachinery's `field.Error`, and [`FieldError::message`]
//! renders it the same way `field.Error.Error()` does.

use std::fmt;

use serde_json::Value;

// ---------------------------------------------------------------------------
// string format checks
// ---------------------------------------------------------------------------

const DNS1123_LABEL_FMT: &str = "[a-z0-9]([-a-z0-9]*[a-z0-9])?";
const DNS1123_LABEL_ERR_MSG: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character";
const DNS1123_LABEL_MAX_LENGTH: usize = 63;

const DNS1123_SUBDOMAIN_FMT: &str =
    "[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*";
const DNS1123_SUBDOMAIN_ERR_MSG: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character";
const DNS1123_SUBDOMAIN_MAX_LENGTH: usize = 253;

const DNS1035_LABEL_FMT: &str = "[a-z]([-a-z0-9]*[a-z0-9])?";
const DNS1035_LABEL_ERR_MSG: &str = "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character";
const DNS1035_LABEL_MAX_LENGTH: usize = 63;

const QUALIFIED_NAME_FMT: &str = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]";
const QUALIFIED_NAME_ERR_MSG: &str = "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character";
const QUALIFIED_NAME_MAX_LENGTH: usize = 63;

const LABEL_VALUE_FMT: &str = "(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?";
const LABEL_VALUE_ERR_MSG: &str = "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character";
const LABEL_VALUE_MAX_LENGTH: usize = 63;

/// Upper bound on the summed length of all annotation keys and values.
pub const TOTAL_ANNOTATION_SIZE_LIMIT_BYTES: usize = 256 * 1024;

/// Detail used by upstream for changes to immutable fields.
pub const FIELD_IMMUTABLE_ERROR_MSG: &str = "field is immutable";

/// "must be no more than N characters"
fn max_len_error(length: usize) -> String {
    format!("must be no more than {length} characters")
}

fn empty_error() -> &'static str {
    "must be non-empty"
}

/// Builds upstream's regex failure message, including its quirky double
/// space before each " or ".
fn regex_error(msg: &str, fmt: &str, examples: &[&str]) -> String {
    if examples.is_empty() {
        return format!("{msg} (regex used for validation is '{fmt}')");
    }
    let mut out = String::from(msg);
    out.push_str(" (e.g. ");
    for (i, example) in examples.iter().enumerate() {
        if i > 0 {
            out.push_str(" or ");
        }
        out.push('\'');
        out.push_str(example);
        out.push_str("', ");
    }
    out.push_str("regex used for validation is '");
    out.push_str(fmt);
    out.push_str("')");
    out
}

fn is_lower_alnum(b: u8) -> bool {
    b.is_ascii_lowercase() || b.is_ascii_digit()
}

/// Matches `[a-z0-9]([-a-z0-9]*[a-z0-9])?` (no length limit).
fn matches_dns1123_label(value: &str) -> bool {
    let b = value.as_bytes();
    match (b.first(), b.last()) {
        (Some(&first), Some(&last)) => {
            is_lower_alnum(first)
                && is_lower_alnum(last)
                && b.iter().all(|&c| is_lower_alnum(c) || c == b'-')
        }
        _ => false,
    }
}

/// Matches the DNS-1123 subdomain regex (no length limit).
fn matches_dns1123_subdomain(value: &str) -> bool {
    value.split('.').all(matches_dns1123_label)
}

/// Matches `[a-z]([-a-z0-9]*[a-z0-9])?` (no length limit).
fn matches_dns1035_label(value: &str) -> bool {
    let b = value.as_bytes();
    match (b.first(), b.last()) {
        (Some(&first), Some(&last)) => {
            first.is_ascii_lowercase()
                && is_lower_alnum(last)
                && b.iter().all(|&c| is_lower_alnum(c) || c == b'-')
        }
        _ => false,
    }
}

/// Matches `([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]` (no length limit).
fn matches_qualified_name_part(value: &str) -> bool {
    let b = value.as_bytes();
    match (b.first(), b.last()) {
        (Some(&first), Some(&last)) => {
            first.is_ascii_alphanumeric()
                && last.is_ascii_alphanumeric()
                && b.iter()
                    .all(|&c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
        }
        _ => false,
    }
}

/// Checks a lowercase RFC 1123 subdomain (most object names). Empty result = valid.
pub fn dns1123_subdomain(value: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if value.len() > DNS1123_SUBDOMAIN_MAX_LENGTH {
        errs.push(max_len_error(DNS1123_SUBDOMAIN_MAX_LENGTH));
    }
    if !matches_dns1123_subdomain(value) {
        errs.push(regex_error(
            DNS1123_SUBDOMAIN_ERR_MSG,
            DNS1123_SUBDOMAIN_FMT,
            &["example.com"],
        ));
    }
    errs
}

/// Checks a lowercase RFC 1123 label (namespaces and some other names). Empty result = valid.
pub fn dns1123_label(value: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if value.len() > DNS1123_LABEL_MAX_LENGTH {
        errs.push(max_len_error(DNS1123_LABEL_MAX_LENGTH));
    }
    if !matches_dns1123_label(value) {
        if matches_dns1123_subdomain(value) {
            // a valid subdomain but not a valid label: the length was already
            // checked, so the dots are the problem
            errs.push("must not contain dots".to_string());
        } else {
            errs.push(regex_error(
                DNS1123_LABEL_ERR_MSG,
                DNS1123_LABEL_FMT,
                &["my-name", "123-abc"],
            ));
        }
    }
    errs
}

/// Checks a DNS-1035 label (service names). Empty result = valid.
pub fn dns1035_label(value: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if value.len() > DNS1035_LABEL_MAX_LENGTH {
        errs.push(max_len_error(DNS1035_LABEL_MAX_LENGTH));
    }
    if !matches_dns1035_label(value) {
        errs.push(regex_error(
            DNS1035_LABEL_ERR_MSG,
            DNS1035_LABEL_FMT,
            &["my-name", "abc-123"],
        ));
    }
    errs
}

/// Checks a "qualified name" (label and annotation keys, finalizers): an
/// optional DNS-1123 subdomain prefix and '/', then a name of at most 63
/// characters. Empty result = valid.
pub fn qualified_name(value: &str) -> Vec<String> {
    let mut errs = Vec::new();
    let parts: Vec<&str> = value.split('/').collect();
    let name = match parts.as_slice() {
        [name] => *name,
        [prefix, name] => {
            if prefix.is_empty() {
                errs.push(format!("prefix part {}", empty_error()));
            } else {
                errs.extend(
                    dns1123_subdomain(prefix)
                        .into_iter()
                        .map(|m| format!("prefix part {m}")),
                );
            }
            *name
        }
        _ => {
            errs.push(format!(
                "a qualified name {} with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')",
                regex_error(
                    QUALIFIED_NAME_ERR_MSG,
                    QUALIFIED_NAME_FMT,
                    &["MyName", "my.name", "123-abc"],
                )
            ));
            return errs;
        }
    };
    if name.is_empty() {
        errs.push(format!("name part {}", empty_error()));
    } else if name.len() > QUALIFIED_NAME_MAX_LENGTH {
        errs.push(format!(
            "name part {}",
            max_len_error(QUALIFIED_NAME_MAX_LENGTH)
        ));
    }
    if !matches_qualified_name_part(name) {
        errs.push(format!(
            "name part {}",
            regex_error(
                QUALIFIED_NAME_ERR_MSG,
                QUALIFIED_NAME_FMT,
                &["MyName", "my.name", "123-abc"],
            )
        ));
    }
    errs
}

/// Checks a label value: empty, or up to 63 characters of `[-A-Za-z0-9_.]`
/// starting and ending with an alphanumeric. Empty result = valid.
pub fn label_value(value: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if value.len() > LABEL_VALUE_MAX_LENGTH {
        errs.push(max_len_error(LABEL_VALUE_MAX_LENGTH));
    }
    if !value.is_empty() && !matches_qualified_name_part(value) {
        errs.push(regex_error(
            LABEL_VALUE_ERR_MSG,
            LABEL_VALUE_FMT,
            &["MyValue", "my_value", "12345"],
        ));
    }
    errs
}

/// Checks that a name can be used as a single URL path segment: it may not be
/// "." or "..", and may not contain "/" or "%". Empty result = valid.
pub fn path_segment_name(value: &str) -> Vec<String> {
    for bad in [".", ".."] {
        if value == bad {
            return vec![format!("may not be '{bad}'")];
        }
    }
    ["/", "%"]
        .iter()
        .filter(|bad| value.contains(**bad))
        .map(|bad| format!("may not contain '{bad}'"))
        .collect()
}

// ---------------------------------------------------------------------------
// field errors
// ---------------------------------------------------------------------------

/// The kind of a [`FieldError`]; matches upstream's `field.ErrorType`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FieldErrorKind {
    /// "FieldValueInvalid"
    Invalid,
    /// "FieldValueRequired"
    Required,
    /// "FieldValueNotSupported"
    NotSupported,
    /// "FieldValueDuplicate"
    Duplicate,
    /// "FieldValueForbidden"
    Forbidden,
    /// "FieldValueTooLong"
    TooLong,
}

impl FieldErrorKind {
    /// The machine-readable type, used as a Status cause `reason`.
    pub fn reason(self) -> &'static str {
        match self {
            FieldErrorKind::Invalid => "FieldValueInvalid",
            FieldErrorKind::Required => "FieldValueRequired",
            FieldErrorKind::NotSupported => "FieldValueNotSupported",
            FieldErrorKind::Duplicate => "FieldValueDuplicate",
            FieldErrorKind::Forbidden => "FieldValueForbidden",
            FieldErrorKind::TooLong => "FieldValueTooLong",
        }
    }

    /// The human-readable type, as in "Invalid value".
    pub fn title(self) -> &'static str {
        match self {
            FieldErrorKind::Invalid => "Invalid value",
            FieldErrorKind::Required => "Required value",
            FieldErrorKind::NotSupported => "Unsupported value",
            FieldErrorKind::Duplicate => "Duplicate value",
            FieldErrorKind::Forbidden => "Forbidden",
            FieldErrorKind::TooLong => "Too long",
        }
    }
}

/// A field-level validation error, as upstream's `field.Error`.
#[derive(Debug, Clone, PartialEq)]
pub struct FieldError {
    pub kind: FieldErrorKind,
    /// Field path such as "metadata.labels" or "spec.ports[0].port".
    pub field: String,
    /// The offending value; `None` when it is not shown.
    pub value: Option<Value>,
    pub detail: String,
}

impl FieldError {
    /// A malformed value.
    pub fn invalid(
        field: impl Into<String>,
        value: impl Into<Value>,
        detail: impl Into<String>,
    ) -> FieldError {
        FieldError {
            kind: FieldErrorKind::Invalid,
            field: field.into(),
            value: Some(value.into()),
            detail: detail.into(),
        }
    }

    /// A required value that was not provided.
    pub fn required(field: impl Into<String>, detail: impl Into<String>) -> FieldError {
        FieldError {
            kind: FieldErrorKind::Required,
            field: field.into(),
            value: None,
            detail: detail.into(),
        }
    }

    /// An unknown value for an enumerated field; the detail lists the supported values.
    pub fn not_supported(
        field: impl Into<String>,
        value: impl Into<Value>,
        supported: &[&str],
    ) -> FieldError {
        let detail = if supported.is_empty() {
            String::new()
        } else {
            let quoted: Vec<String> = supported.iter().map(|s| go_quote(s)).collect();
            format!("supported values: {}", quoted.join(", "))
        };
        FieldError {
            kind: FieldErrorKind::NotSupported,
            field: field.into(),
            value: Some(value.into()),
            detail,
        }
    }

    /// A well-formed value that is not permitted in this context.
    pub fn forbidden(field: impl Into<String>, detail: impl Into<String>) -> FieldError {
        FieldError {
            kind: FieldErrorKind::Forbidden,
            field: field.into(),
            value: None,
            detail: detail.into(),
        }
    }

    /// A value that must be unique but is repeated.
    pub fn duplicate(field: impl Into<String>, value: impl Into<Value>) -> FieldError {
        FieldError {
            kind: FieldErrorKind::Duplicate,
            field: field.into(),
            value: Some(value.into()),
            detail: String::new(),
        }
    }

    /// An attempt to change an immutable field (Invalid with "field is immutable").
    pub fn immutable(field: impl Into<String>, value: impl Into<Value>) -> FieldError {
        FieldError::invalid(field, value, FIELD_IMMUTABLE_ERROR_MSG)
    }

    /// A value longer than `max_bytes`; the value itself is not echoed back.
    pub fn too_long(field: impl Into<String>, max_bytes: usize) -> FieldError {
        FieldError {
            kind: FieldErrorKind::TooLong,
            field: field.into(),
            value: None,
            detail: format!("must have at most {max_bytes} bytes"),
        }
    }

    /// Upstream's error type string, e.g. "FieldValueInvalid" (a Status cause `reason`).
    pub fn reason(&self) -> &'static str {
        self.kind.reason()
    }

    /// The message without the field path, as upstream's `ErrorBody()`;
    /// this is what goes into a Status cause `message`.
    pub fn body(&self) -> String {
        let mut s = String::from(self.kind.title());
        match self.kind {
            FieldErrorKind::Required | FieldErrorKind::Forbidden | FieldErrorKind::TooLong => {}
            FieldErrorKind::Invalid | FieldErrorKind::NotSupported | FieldErrorKind::Duplicate => {
                if let Some(value) = &self.value {
                    s.push_str(": ");
                    s.push_str(&render_value(value));
                }
            }
        }
        if !self.detail.is_empty() {
            s.push_str(": ");
            s.push_str(&self.detail);
        }
        s
    }

    /// The full message as upstream's `Error()`, e.g.
    /// `metadata.name: Invalid value: "Foo": a lowercase RFC 1123 ...`.
    pub fn message(&self) -> String {
        format!("{}: {}", self.field, self.body())
    }
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message())
    }
}

impl std::error::Error for FieldError {}

/// Joins a list of field errors the way upstream's `ErrorList.ToAggregate().Error()`
/// does: duplicate messages dropped, a single message as is, several as
/// `[first, second]`. Empty input gives an empty string.
pub fn aggregate_message(errs: &[FieldError]) -> String {
    let mut seen: Vec<String> = Vec::new();
    for err in errs {
        let msg = err.message();
        if !seen.contains(&msg) {
            seen.push(msg);
        }
    }
    match seen.len() {
        0 => String::new(),
        1 => seen.swap_remove(0),
        _ => format!("[{}]", seen.join(", ")),
    }
}

/// Renders a bad value the way upstream's `ErrorBody` does: strings quoted
/// as Go's `%q`, scalars plainly, anything else as compact JSON.
fn render_value(value: &Value) -> String {
    match value {
        Value::String(s) => go_quote(s),
        Value::Number(n) => n.to_string(),
        Value::Bool(b) => b.to_string(),
        Value::Null => "null".to_string(),
        Value::Array(_) | Value::Object(_) => {
            let json = serde_json::to_string(value).unwrap_or_default();
            // Go's encoding/json escapes these even inside strings
            json.replace('<', "\\u003c")
                .replace('>', "\\u003e")
                .replace('&', "\\u0026")
                .replace('\u{2028}', "\\u2028")
                .replace('\u{2029}', "\\u2029")
        }
    }
}

pub(crate) use k8s_semantics::go_quote;

// ---------------------------------------------------------------------------
// object metadata
// ---------------------------------------------------------------------------

/// Validates `metadata` of a built-in object being created, as upstream's
/// core `ValidateObjectMeta`: name (required; checked with `name_fn`),
/// generateName, namespace (required and a DNS-1123 label iff `namespaced`,
/// forbidden otherwise), generation, labels, annotations (keys and total
/// size), ownerReferences and finalizers (qualified names; names without a
/// '/' must be one of the standard finalizers).
///
/// `meta` is the JSON `metadata` object; a missing (null) one counts as empty.
pub fn validate_object_meta(
    meta: &Value,
    namespaced: bool,
    name_fn: fn(&str) -> Vec<String>,
) -> Vec<FieldError> {
    let mut errs = validate_generic_object_meta(meta, namespaced, name_fn);
    if let Some(finalizers) = meta.get("finalizers").and_then(Value::as_array) {
        for (i, f) in finalizers.iter().enumerate() {
            if let Some(f) = f.as_str() {
                if !f.contains('/') && !STANDARD_FINALIZERS.contains(&f) {
                    errs.push(FieldError::invalid(
                        format!("metadata.finalizers[{i}]"),
                        f,
                        "name is neither a standard finalizer name nor is it fully qualified",
                    ));
                }
            }
        }
    }
    errs
}

/// Finalizer names that need no domain prefix on built-in objects.
const STANDARD_FINALIZERS: &[&str] = &["kubernetes", "orphan", "foregroundDeletion"];

/// Like [`validate_object_meta`] but with only the generic apimachinery rules
/// (as used for custom resources): unqualified finalizer names are accepted.
pub fn validate_generic_object_meta(
    meta: &Value,
    namespaced: bool,
    name_fn: fn(&str) -> Vec<String>,
) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let empty = serde_json::Map::new();
    let obj = match meta {
        Value::Object(m) => m,
        Value::Null => &empty,
        other => {
            errs.push(FieldError::invalid(
                "metadata",
                other.clone(),
                "must be an object",
            ));
            return errs;
        }
    };

    // generateName and name
    let generate_name = str_field(obj, "generateName", "metadata.generateName", &mut errs);
    if !generate_name.is_empty() {
        for msg in name_fn(&mask_trailing_dash(generate_name)) {
            errs.push(FieldError::invalid(
                "metadata.generateName",
                generate_name,
                msg,
            ));
        }
    }
    let name = str_field(obj, "name", "metadata.name", &mut errs);
    if name.is_empty() {
        errs.push(FieldError::required(
            "metadata.name",
            "name or generateName is required",
        ));
    } else {
        for msg in name_fn(name) {
            errs.push(FieldError::invalid("metadata.name", name, msg));
        }
    }

    // namespace
    let namespace = str_field(obj, "namespace", "metadata.namespace", &mut errs);
    if namespaced {
        if namespace.is_empty() {
            errs.push(FieldError::required("metadata.namespace", ""));
        } else {
            for msg in dns1123_label(namespace) {
                errs.push(FieldError::invalid("metadata.namespace", namespace, msg));
            }
        }
    } else if !namespace.is_empty() {
        errs.push(FieldError::forbidden(
            "metadata.namespace",
            "not allowed on this type",
        ));
    }

    // generation
    if let Some(generation) = obj.get("generation").and_then(Value::as_i64) {
        if generation < 0 {
            errs.push(FieldError::invalid(
                "metadata.generation",
                generation,
                "must be greater than or equal to 0",
            ));
        }
    }

    // labels
    if let Some(labels) = string_map(obj, "labels", "metadata.labels", &mut errs) {
        for (k, v) in labels {
            for msg in qualified_name(k) {
                errs.push(FieldError::invalid("metadata.labels", k.as_str(), msg));
            }
            match v.as_str() {
                Some(v) => {
                    for msg in label_value(v) {
                        errs.push(FieldError::invalid("metadata.labels", v, msg));
                    }
                }
                None => errs.push(FieldError::invalid(
                    "metadata.labels",
                    v.clone(),
                    "must be a string",
                )),
            }
        }
    }

    // annotations
    if let Some(annotations) = string_map(obj, "annotations", "metadata.annotations", &mut errs) {
        let mut total = 0usize;
        for (k, v) in annotations {
            // case does not matter for annotation keys
            for msg in qualified_name(&k.to_lowercase()) {
                errs.push(FieldError::invalid("metadata.annotations", k.as_str(), msg));
            }
            match v.as_str() {
                Some(v) => total = total.saturating_add(k.len()).saturating_add(v.len()),
                None => errs.push(FieldError::invalid(
                    "metadata.annotations",
                    v.clone(),
                    "must be a string",
                )),
            }
        }
        if total > TOTAL_ANNOTATION_SIZE_LIMIT_BYTES {
            errs.push(FieldError::too_long(
                "metadata.annotations",
                TOTAL_ANNOTATION_SIZE_LIMIT_BYTES,
            ));
        }
    }

    // ownerReferences
    if let Some(refs) = array_field(
        obj,
        "ownerReferences",
        "metadata.ownerReferences",
        &mut errs,
    ) {
        validate_owner_references(refs, &mut errs);
    }

    // finalizers
    if let Some(finalizers) = array_field(obj, "finalizers", "metadata.finalizers", &mut errs) {
        let mut orphan = false;
        let mut foreground = false;
        for (i, f) in finalizers.iter().enumerate() {
            let Some(f) = f.as_str() else {
                errs.push(FieldError::invalid(
                    format!("metadata.finalizers[{i}]"),
                    f.clone(),
                    "must be a string",
                ));
                continue;
            };
            for msg in qualified_name(f) {
                errs.push(FieldError::invalid("metadata.finalizers", f, msg));
            }
            orphan |= f == "orphan";
            foreground |= f == "foregroundDeletion";
        }
        if orphan && foreground {
            errs.push(FieldError::invalid(
                "metadata.finalizers",
                Value::Array(finalizers.clone()),
                "finalizer orphan and foregroundDeletion cannot be both set",
            ));
        }
    }

    errs
}

fn validate_owner_references(refs: &[Value], errs: &mut Vec<FieldError>) {
    const PATH: &str = "metadata.ownerReferences";
    let mut first_controller: Option<String> = None;
    for r in refs {
        let Some(obj) = r.as_object() else {
            errs.push(FieldError::invalid(PATH, r.clone(), "must be an object"));
            continue;
        };
        let get = |key: &str| obj.get(key).and_then(Value::as_str).unwrap_or("");
        let api_version = get("apiVersion");
        let kind = get("kind");
        let name = get("name");
        let uid = get("uid");

        let (group, version) = parse_group_version(api_version);
        if version.is_empty() {
            errs.push(FieldError::invalid(
                format!("{PATH}.apiVersion"),
                api_version,
                "version must not be empty",
            ));
        }
        if kind.is_empty() {
            errs.push(FieldError::invalid(
                format!("{PATH}.kind"),
                kind,
                "must not be empty",
            ));
        }
        if name.is_empty() {
            errs.push(FieldError::invalid(
                format!("{PATH}.name"),
                name,
                "must not be empty",
            ));
        }
        if uid.is_empty() {
            errs.push(FieldError::invalid(
                format!("{PATH}.uid"),
                uid,
                "must not be empty",
            ));
        }
        if group.is_empty() && version == "v1" && kind == "Event" {
            errs.push(FieldError::invalid(
                PATH,
                r.clone(),
                format!("{group}/{version}, Kind={kind} is disallowed from being an owner"),
            ));
        }
        if obj.get("controller").and_then(Value::as_bool) == Some(true) {
            let current = format!("{kind}/{name}");
            match &first_controller {
                Some(first) => errs.push(FieldError::invalid(
                    PATH,
                    Value::Array(refs.to_vec()),
                    format!(
                        "Only one reference can have Controller set to true. Found \"true\" in references for {first} and {current}"
                    ),
                )),
                None => first_controller = Some(current),
            }
        }
    }
}

/// Splits an apiVersion into (group, version) as upstream's
/// `schema.FromAPIVersionAndKind` does: more than one '/' yields nothing.
fn parse_group_version(api_version: &str) -> (&str, &str) {
    if api_version.is_empty() || api_version == "/" {
        return ("", "");
    }
    match api_version.matches('/').count() {
        0 => ("", api_version),
        1 => api_version.split_once('/').unwrap_or(("", "")),
        _ => ("", ""),
    }
}

/// Upstream's `maskTrailingDash`, applied to generateName before checking it
/// with a name function (it is used as a prefix, so a trailing '-' is fine).
fn mask_trailing_dash(name: &str) -> String {
    let b = name.as_bytes();
    if b.len() > 1 && name.ends_with('-') {
        let mut masked = b[..b.len() - 2].to_vec();
        masked.push(b'a');
        String::from_utf8_lossy(&masked).into_owned()
    } else {
        name.to_string()
    }
}

/// Reads an optional string field; a non-string value is reported and read as "".
fn str_field<'a>(
    obj: &'a serde_json::Map<String, Value>,
    key: &str,
    path: &str,
    errs: &mut Vec<FieldError>,
) -> &'a str {
    match obj.get(key) {
        None | Some(Value::Null) => "",
        Some(Value::String(s)) => s,
        Some(other) => {
            errs.push(FieldError::invalid(path, other.clone(), "must be a string"));
            ""
        }
    }
}

fn string_map<'a>(
    obj: &'a serde_json::Map<String, Value>,
    key: &str,
    path: &str,
    errs: &mut Vec<FieldError>,
) -> Option<&'a serde_json::Map<String, Value>> {
    match obj.get(key) {
        None | Some(Value::Null) => None,
        Some(Value::Object(m)) => Some(m),
        Some(other) => {
            errs.push(FieldError::invalid(
                path,
                other.clone(),
                "must be an object",
            ));
            None
        }
    }
}

fn array_field<'a>(
    obj: &'a serde_json::Map<String, Value>,
    key: &str,
    path: &str,
    errs: &mut Vec<FieldError>,
) -> Option<&'a Vec<Value>> {
    match obj.get(key) {
        None | Some(Value::Null) => None,
        Some(Value::Array(a)) => Some(a),
        Some(other) => {
            errs.push(FieldError::invalid(path, other.clone(), "must be an array"));
            None
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    const SUBDOMAIN_MSG: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";
    const LABEL_MSG: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')";
    const DNS1035_MSG: &str = "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')";
    const QNAME_PART_MSG: &str = "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')";
    const LABEL_VALUE_MSG: &str = "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')";

    #[test]
    fn subdomain() {
        for ok in [
            "a",
            "example.com",
            "a-b.c-d",
            "0",
            "1.2.3.4",
            &"a".repeat(253),
        ] {
            assert!(dns1123_subdomain(ok).is_empty(), "{ok}");
        }
        for bad in ["", "A", "a_b", "-a", "a-", "a..b", ".a", "a.", "a b", "ä"] {
            assert_eq!(
                dns1123_subdomain(bad),
                vec![SUBDOMAIN_MSG.to_string()],
                "{bad}"
            );
        }
        assert_eq!(
            dns1123_subdomain(&"a".repeat(254)),
            vec!["must be no more than 253 characters".to_string()]
        );
        assert_eq!(
            dns1123_subdomain(&format!("{}-", "a".repeat(254))),
            vec![
                "must be no more than 253 characters".to_string(),
                SUBDOMAIN_MSG.to_string()
            ]
        );
    }

    #[test]
    fn label() {
        for ok in ["a", "my-name", "123-abc", "0", &"a".repeat(63)] {
            assert!(dns1123_label(ok).is_empty(), "{ok}");
        }
        for bad in ["", "A", "-a", "a-", "a_b", "a..b"] {
            assert_eq!(dns1123_label(bad), vec![LABEL_MSG.to_string()], "{bad}");
        }
        assert_eq!(
            dns1123_label("a.b"),
            vec!["must not contain dots".to_string()]
        );
        assert_eq!(
            dns1123_label(&"a".repeat(64)),
            vec!["must be no more than 63 characters".to_string()]
        );
    }

    #[test]
    fn dns1035() {
        for ok in ["a", "my-name", "abc-123", &"a".repeat(63)] {
            assert!(dns1035_label(ok).is_empty(), "{ok}");
        }
        for bad in ["", "1abc", "-a", "a-", "A", "a.b", "a_b"] {
            assert_eq!(dns1035_label(bad), vec![DNS1035_MSG.to_string()], "{bad}");
        }
        assert_eq!(
            dns1035_label(&"a".repeat(64)),
            vec!["must be no more than 63 characters".to_string()]
        );
    }

    #[test]
    fn qualified_names() {
        for ok in [
            "a",
            "A",
            "MyName",
            "my.name",
            "123-abc",
            "a_b",
            "example.com/MyName",
            "k8s.io/a",
            &"a".repeat(63),
            &format!("{}/{}", "a".repeat(253), "b".repeat(63)),
        ] {
            assert!(qualified_name(ok).is_empty(), "{ok}");
        }
        assert_eq!(
            qualified_name(""),
            vec![
                "name part must be non-empty".to_string(),
                QNAME_PART_MSG.to_string()
            ]
        );
        assert_eq!(qualified_name("-a"), vec![QNAME_PART_MSG.to_string()]);
        assert_eq!(qualified_name("a b"), vec![QNAME_PART_MSG.to_string()]);
        assert_eq!(
            qualified_name(&"a".repeat(64)),
            vec!["name part must be no more than 63 characters".to_string()]
        );
        assert_eq!(
            qualified_name("/a"),
            vec!["prefix part must be non-empty".to_string()]
        );
        assert_eq!(
            qualified_name("Example.com/a"),
            vec![format!("prefix part {SUBDOMAIN_MSG}")]
        );
        assert_eq!(
            qualified_name("example.com/"),
            vec![
                "name part must be non-empty".to_string(),
                QNAME_PART_MSG.to_string()
            ]
        );
        assert_eq!(
            qualified_name("a/b/c"),
            vec!["a qualified name must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]') with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')".to_string()]
        );
    }

    #[test]
    fn label_values() {
        for ok in [
            "",
            "a",
            "MyValue",
            "my_value",
            "12345",
            "a.b-c_d",
            &"a".repeat(63),
        ] {
            assert!(label_value(ok).is_empty(), "{ok}");
        }
        for bad in ["-a", "a-", "a b", "a/b", "ä"] {
            assert_eq!(label_value(bad), vec![LABEL_VALUE_MSG.to_string()], "{bad}");
        }
        assert_eq!(
            label_value(&"a".repeat(64)),
            vec!["must be no more than 63 characters".to_string()]
        );
    }

    #[test]
    fn path_segments() {
        assert!(path_segment_name("foo").is_empty());
        assert!(path_segment_name("...").is_empty());
        assert_eq!(path_segment_name("."), vec!["may not be '.'".to_string()]);
        assert_eq!(path_segment_name(".."), vec!["may not be '..'".to_string()]);
        assert_eq!(
            path_segment_name("a/b%c"),
            vec![
                "may not contain '/'".to_string(),
                "may not contain '%'".to_string()
            ]
        );
    }

    #[test]
    fn field_error_messages() {
        let e = FieldError::invalid("metadata.name", "Foo", dns1123_subdomain("Foo").join(", "));
        assert_eq!(e.reason(), "FieldValueInvalid");
        assert_eq!(
            e.message(),
            format!("metadata.name: Invalid value: \"Foo\": {SUBDOMAIN_MSG}")
        );
        assert_eq!(e.to_string(), e.message());

        let e = FieldError::required("spec.containers", "");
        assert_eq!(e.reason(), "FieldValueRequired");
        assert_eq!(e.message(), "spec.containers: Required value");
        let e = FieldError::required("metadata.name", "name or generateName is required");
        assert_eq!(
            e.message(),
            "metadata.name: Required value: name or generateName is required"
        );

        let e = FieldError::not_supported("spec.type", "Foo", &["ClusterIP", "ExternalName"]);
        assert_eq!(e.reason(), "FieldValueNotSupported");
        assert_eq!(
            e.message(),
            "spec.type: Unsupported value: \"Foo\": supported values: \"ClusterIP\", \"ExternalName\""
        );

        let e = FieldError::immutable("spec.selector", json!({"app": "a"}));
        assert_eq!(
            e.message(),
            "spec.selector: Invalid value: {\"app\":\"a\"}: field is immutable"
        );

        let e = FieldError::forbidden("metadata.namespace", "not allowed on this type");
        assert_eq!(e.reason(), "FieldValueForbidden");
        assert_eq!(
            e.message(),
            "metadata.namespace: Forbidden: not allowed on this type"
        );

        let e = FieldError::duplicate("spec.ports[1].port", 80);
        assert_eq!(e.reason(), "FieldValueDuplicate");
        assert_eq!(e.message(), "spec.ports[1].port: Duplicate value: 80");

        let e = FieldError::too_long("metadata.annotations", 262144);
        assert_eq!(e.reason(), "FieldValueTooLong");
        assert_eq!(
            e.message(),
            "metadata.annotations: Too long: must have at most 262144 bytes"
        );

        let e = FieldError::invalid("spec.replicas", -1, "must be greater than or equal to 0");
        assert_eq!(
            e.message(),
            "spec.replicas: Invalid value: -1: must be greater than or equal to 0"
        );
        let e = FieldError::invalid("x", vec!["a", "<b>"], "bad");
        assert_eq!(
            e.message(),
            "x: Invalid value: [\"a\",\"\\u003cb\\u003e\"]: bad"
        );
        let e = FieldError::invalid("x", "tab\there \"q\" é\u{1}", "bad");
        assert_eq!(
            e.message(),
            "x: Invalid value: \"tab\\there \\\"q\\\" é\\x01\": bad"
        );
        let e = FieldError::invalid("x", true, "");
        assert_eq!(e.body(), "Invalid value: true");
        let e = FieldError::not_supported("x", "y", &[]);
        assert_eq!(e.message(), "x: Unsupported value: \"y\"");
    }

    #[test]
    fn aggregate() {
        assert_eq!(aggregate_message(&[]), "");
        let a = FieldError::required("a", "");
        let b = FieldError::required("b", "");
        assert_eq!(
            aggregate_message(std::slice::from_ref(&a)),
            "a: Required value"
        );
        assert_eq!(
            aggregate_message(&[a.clone(), b, a]),
            "[a: Required value, b: Required value]"
        );
    }

    fn messages(errs: &[FieldError]) -> Vec<String> {
        errs.iter().map(FieldError::message).collect()
    }

    #[test]
    fn object_meta_valid() {
        let meta = json!({
            "name": "web-1",
            "namespace": "default",
            "generation": 1,
            "labels": {"app": "web", "example.com/tier": "", "Version": "v1.2_3"},
            "annotations": {"Example.com/Note": "anything at all: ok", "kubectl.kubernetes.io/x": "{}"},
            "finalizers": ["kubernetes", "example.com/cleanup", "foregroundDeletion"],
            "ownerReferences": [
                {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": "u1", "controller": true},
                {"apiVersion": "v1", "kind": "ConfigMap", "name": "cm", "uid": "u2", "controller": false}
            ]
        });
        assert!(validate_object_meta(&meta, true, dns1123_subdomain).is_empty());
        let cluster = json!({"name": "node-a"});
        assert!(validate_object_meta(&cluster, false, dns1123_subdomain).is_empty());
    }

    #[test]
    fn object_meta_name_and_namespace() {
        let errs = validate_object_meta(&json!({}), true, dns1123_subdomain);
        assert_eq!(
            messages(&errs),
            vec![
                "metadata.name: Required value: name or generateName is required",
                "metadata.namespace: Required value",
            ]
        );
        assert_eq!(errs[0].reason(), "FieldValueRequired");

        let errs = validate_object_meta(&Value::Null, false, dns1123_subdomain);
        assert_eq!(errs.len(), 1);
        assert_eq!(errs[0].field, "metadata.name");

        let errs = validate_object_meta(
            &json!({"name": "Foo", "namespace": "a.b"}),
            true,
            dns1123_subdomain,
        );
        assert_eq!(
            messages(&errs),
            vec![
                format!("metadata.name: Invalid value: \"Foo\": {SUBDOMAIN_MSG}"),
                "metadata.namespace: Invalid value: \"a.b\": must not contain dots".to_string(),
            ]
        );

        let errs = validate_object_meta(&json!({"name": "my.svc"}), false, dns1035_label);
        assert_eq!(
            messages(&errs),
            vec![format!(
                "metadata.name: Invalid value: \"my.svc\": {DNS1035_MSG}"
            )]
        );

        let errs = validate_object_meta(
            &json!({"name": "x", "namespace": "default"}),
            false,
            dns1123_subdomain,
        );
        assert_eq!(
            messages(&errs),
            vec!["metadata.namespace: Forbidden: not allowed on this type"]
        );

        let errs = validate_object_meta(&json!({"name": ".."}), false, path_segment_name);
        assert_eq!(
            messages(&errs),
            vec!["metadata.name: Invalid value: \"..\": may not be '..'"]
        );
    }

    #[test]
    fn object_meta_generate_name() {
        let ok = json!({"name": "web-x7k2p", "generateName": "web-"});
        assert!(validate_object_meta(&ok, false, dns1123_subdomain).is_empty());
        let bad = json!({"name": "Web-x7k2p", "generateName": "Web-"});
        let errs = validate_object_meta(&bad, false, dns1123_subdomain);
        assert_eq!(errs.len(), 2);
        assert_eq!(errs[0].field, "metadata.generateName");
        assert_eq!(errs[1].field, "metadata.name");
    }

    #[test]
    fn object_meta_generation() {
        let errs = validate_object_meta(
            &json!({"name": "a", "generation": -1}),
            false,
            dns1123_subdomain,
        );
        assert_eq!(
            messages(&errs),
            vec!["metadata.generation: Invalid value: -1: must be greater than or equal to 0"]
        );
    }

    #[test]
    fn object_meta_labels() {
        let meta = json!({"name": "a", "labels": {"bad key": "ok", "good": "bad value", "n": 1}});
        let errs = validate_object_meta(&meta, false, dns1123_subdomain);
        assert_eq!(
            messages(&errs),
            vec![
                format!("metadata.labels: Invalid value: \"bad key\": {QNAME_PART_MSG}"),
                format!("metadata.labels: Invalid value: \"bad value\": {LABEL_VALUE_MSG}"),
                "metadata.labels: Invalid value: 1: must be a string".to_string(),
            ]
        );
        let meta = json!({"name": "a", "labels": {"a/b/c": "x"}});
        let errs = validate_object_meta(&meta, false, dns1123_subdomain);
        assert_eq!(errs.len(), 1);
        assert!(errs[0].detail.starts_with("a qualified name must consist"));
    }

    #[test]
    fn object_meta_annotations() {
        let meta = json!({"name": "a", "annotations": {"UPPER.example.com/Key": "v", "-bad": "v"}});
        let errs = validate_object_meta(&meta, false, dns1123_subdomain);
        assert_eq!(
            messages(&errs),
            vec![format!(
                "metadata.annotations: Invalid value: \"-bad\": {QNAME_PART_MSG}"
            )]
        );

        let exactly = "v".repeat(TOTAL_ANNOTATION_SIZE_LIMIT_BYTES - 1);
        let meta = json!({"name": "a", "annotations": {"k": exactly}});
        assert!(validate_object_meta(&meta, false, dns1123_subdomain).is_empty());
        let big = "v".repeat(TOTAL_ANNOTATION_SIZE_LIMIT_BYTES);
        let meta = json!({"name": "a", "annotations": {"k": big}});
        let errs = validate_object_meta(&meta, false, dns1123_subdomain);
        assert_eq!(
            messages(&errs),
            vec!["metadata.annotations: Too long: must have at most 262144 bytes"]
        );
        assert_eq!(errs[0].reason(), "FieldValueTooLong");
    }

    #[test]
    fn object_meta_finalizers() {
        let meta = json!({"name": "a", "finalizers": ["example.com/ok", "bad/", "plain", "orphan", "foregroundDeletion"]});
        let errs = validate_object_meta(&meta, false, dns1123_subdomain);
        assert_eq!(
            messages(&errs),
            vec![
                "metadata.finalizers: Invalid value: \"bad/\": name part must be non-empty".to_string(),
                format!("metadata.finalizers: Invalid value: \"bad/\": {QNAME_PART_MSG}"),
                "metadata.finalizers: Invalid value: [\"example.com/ok\",\"bad/\",\"plain\",\"orphan\",\"foregroundDeletion\"]: finalizer orphan and foregroundDeletion cannot be both set".to_string(),
                "metadata.finalizers[2]: Invalid value: \"plain\": name is neither a standard finalizer name nor is it fully qualified".to_string(),
            ]
        );
        // generic rules accept unqualified finalizers
        let meta = json!({"name": "a", "finalizers": ["plain"]});
        assert!(validate_generic_object_meta(&meta, false, dns1123_subdomain).is_empty());
        let meta = json!({"name": "a", "finalizers": ["a b"]});
        let errs = validate_generic_object_meta(&meta, false, dns1123_subdomain);
        assert_eq!(errs.len(), 1);
        assert_eq!(errs[0].field, "metadata.finalizers");
    }

    #[test]
    fn object_meta_owner_references() {
        let meta = json!({"name": "a", "ownerReferences": [{"controller": true}]});
        let errs = validate_object_meta(&meta, false, dns1123_subdomain);
        assert_eq!(
            messages(&errs),
            vec![
                "metadata.ownerReferences.apiVersion: Invalid value: \"\": version must not be empty",
                "metadata.ownerReferences.kind: Invalid value: \"\": must not be empty",
                "metadata.ownerReferences.name: Invalid value: \"\": must not be empty",
                "metadata.ownerReferences.uid: Invalid value: \"\": must not be empty",
            ]
        );

        let meta = json!({"name": "a", "ownerReferences": [
            {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "one", "uid": "1", "controller": true},
            {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "two", "uid": "2", "controller": true}
        ]});
        let errs = validate_object_meta(&meta, false, dns1123_subdomain);
        assert_eq!(errs.len(), 1);
        assert_eq!(errs[0].field, "metadata.ownerReferences");
        assert!(errs[0].message().ends_with(
            ": Only one reference can have Controller set to true. Found \"true\" in references for ReplicaSet/one and StatefulSet/two"
        ), "{}", errs[0].message());

        let meta = json!({"name": "a", "ownerReferences": [
            {"apiVersion": "v1", "kind": "Event", "name": "e", "uid": "1"},
            {"apiVersion": "apps/", "kind": "X", "name": "x", "uid": "2"},
            {"apiVersion": "a/b/c", "kind": "X", "name": "x", "uid": "3"}
        ]});
        let errs = validate_object_meta(&meta, false, dns1123_subdomain);
        assert_eq!(errs.len(), 3);
        assert!(errs[0].detail == "/v1, Kind=Event is disallowed from being an owner");
        assert_eq!(errs[1].message(), "metadata.ownerReferences.apiVersion: Invalid value: \"apps/\": version must not be empty");
        assert_eq!(errs[2].message(), "metadata.ownerReferences.apiVersion: Invalid value: \"a/b/c\": version must not be empty");
    }

    #[test]
    fn object_meta_wrong_types() {
        let errs = validate_object_meta(&json!("x"), false, dns1123_subdomain);
        assert_eq!(
            messages(&errs),
            vec!["metadata: Invalid value: \"x\": must be an object"]
        );
        let errs =
            validate_object_meta(&json!({"name": 5, "labels": []}), false, dns1123_subdomain);
        assert_eq!(
            messages(&errs),
            vec![
                "metadata.name: Invalid value: 5: must be a string",
                "metadata.name: Required value: name or generateName is required",
                "metadata.labels: Invalid value: []: must be an object",
            ]
        );
    }

    #[test]
    fn masks_trailing_dash() {
        assert_eq!(mask_trailing_dash("abc-"), "aba");
        assert_eq!(mask_trailing_dash("-"), "-");
        assert_eq!(mask_trailing_dash("abc"), "abc");
    }
}
