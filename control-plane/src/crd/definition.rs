//! Validation of CustomResourceDefinition objects and the resources one defines.

use serde_json::Value;

use super::schema::Schema;
use super::{Column, ScalePaths};
use crate::validation::{self, FieldError};

/// One served version of a CRD, parsed.
#[derive(Debug)]
pub struct Version {
    pub name: String,
    pub storage: bool,
    pub schema: Schema,
    pub raw_schema: Value,
    pub status: bool,
    pub scale: Option<ScalePaths>,
    pub columns: Vec<Column>,
}

/// A CRD, parsed: what the registry turns into served resources.
#[derive(Debug)]
pub struct Definition {
    pub name: String,
    pub group: String,
    pub plural: String,
    pub singular: String,
    pub kind: String,
    pub list_kind: String,
    pub short_names: Vec<String>,
    pub categories: Vec<String>,
    pub namespaced: bool,
    /// Served versions only, in spec order.
    pub versions: Vec<Version>,
    pub storage_version: String,
}

fn s<'a>(v: &'a Value, ptr: &str) -> &'a str {
    v.pointer(ptr).and_then(Value::as_str).unwrap_or("")
}

fn strs(v: &Value, ptr: &str) -> Vec<String> {
    v.pointer(ptr)
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(|x| x.as_str().map(str::to_string)).collect())
        .unwrap_or_default()
}

const COLUMN_TYPES: &[&str] = &["integer", "number", "string", "boolean", "date"];
const COLUMN_FORMATS: &[&str] = &["int32", "int64", "float", "double", "byte", "date", "date-time", "password"];

fn dns1035(field: &str, value: &str, errs: &mut Vec<FieldError>) {
    for msg in validation::dns1035_label(value) {
        errs.push(FieldError::invalid(field, value, msg));
    }
}

/// Upstream's validation of a CRD (ValidateCustomResourceDefinition), the parts ferro serves.
/// `old` is the stored CRD on update.
pub fn validate(crd: &Value, old: Option<&Value>) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let group = s(crd, "/spec/group");
    let plural = s(crd, "/spec/names/plural");
    let name = s(crd, "/metadata/name");
    if name != format!("{plural}.{group}") {
        errs.push(FieldError::invalid("metadata.name", name, "must be spec.names.plural+\".\"+spec.group"));
    }
    if group.is_empty() {
        errs.push(FieldError::required("spec.group", ""));
    } else {
        for msg in validation::dns1123_subdomain(group) {
            errs.push(FieldError::invalid("spec.group", group, msg));
        }
        if !group.contains('.') {
            errs.push(FieldError::invalid("spec.group", group, "should be a domain with at least one dot"));
        }
    }
    match s(crd, "/spec/scope") {
        "Namespaced" | "Cluster" => {}
        "" => errs.push(FieldError::required("spec.scope", "")),
        other => errs.push(FieldError::not_supported("spec.scope", other, &["Cluster", "Namespaced"])),
    }
    // names
    if plural.is_empty() {
        errs.push(FieldError::required("spec.names.plural", ""));
    } else {
        dns1035("spec.names.plural", plural, &mut errs);
    }
    let singular = s(crd, "/spec/names/singular");
    if !singular.is_empty() {
        dns1035("spec.names.singular", singular, &mut errs);
    }
    let kind = s(crd, "/spec/names/kind");
    if kind.is_empty() {
        errs.push(FieldError::required("spec.names.kind", ""));
    } else {
        for msg in validation::dns1035_label(&kind.to_lowercase()) {
            errs.push(FieldError::invalid("spec.names.kind", kind, msg));
        }
    }
    let list_kind = s(crd, "/spec/names/listKind");
    if !list_kind.is_empty() {
        for msg in validation::dns1035_label(&list_kind.to_lowercase()) {
            errs.push(FieldError::invalid("spec.names.listKind", list_kind, msg));
        }
        if list_kind == kind {
            errs.push(FieldError::invalid("spec.names.listKind", list_kind, "kind and listKind may not be the same"));
        }
    }
    for (i, short) in strs(crd, "/spec/names/shortNames").iter().enumerate() {
        dns1035(&format!("spec.names.shortNames[{i}]"), short, &mut errs);
    }
    for (i, c) in strs(crd, "/spec/names/categories").iter().enumerate() {
        dns1035(&format!("spec.names.categories[{i}]"), c, &mut errs);
    }
    // conversion: None only
    match s(crd, "/spec/conversion/strategy") {
        "" | "None" => {}
        "Webhook" => errs.push(FieldError::not_supported("spec.conversion.strategy", "Webhook", &["None"])),
        other => errs.push(FieldError::not_supported("spec.conversion.strategy", other, &["None", "Webhook"])),
    }
    // versions
    let versions = crd.pointer("/spec/versions").and_then(Value::as_array).cloned().unwrap_or_default();
    if versions.is_empty() {
        errs.push(FieldError::invalid("spec.versions", Value::Array(vec![]), "must have exactly one version marked as storage version"));
    } else {
        let storage = versions.iter().filter(|v| v.get("storage").and_then(Value::as_bool) == Some(true)).count();
        if storage != 1 {
            errs.push(FieldError::invalid("spec.versions", Value::Array(versions.clone()), "must have exactly one version marked as storage version"));
        }
        if !versions.iter().any(|v| v.get("served").and_then(Value::as_bool) == Some(true)) {
            errs.push(FieldError::invalid("spec.versions", Value::Array(versions.clone()), "must have at least one version marked as served"));
        }
    }
    let mut seen: Vec<&str> = Vec::new();
    for (i, v) in versions.iter().enumerate() {
        let at = format!("spec.versions[{i}]");
        let vname = v.get("name").and_then(Value::as_str).unwrap_or("");
        if vname.is_empty() {
            errs.push(FieldError::required(format!("{at}.name"), ""));
        } else {
            dns1035(&format!("{at}.name"), vname, &mut errs);
            if seen.contains(&vname) {
                errs.push(FieldError::duplicate(format!("{at}.name"), vname));
            }
            seen.push(vname);
        }
        match v.pointer("/schema/openAPIV3Schema") {
            None => errs.push(FieldError::required(format!("{at}.schema.openAPIV3Schema"), "schemas are required")),
            Some(raw) => {
                let path = format!("{at}.schema.openAPIV3Schema");
                let schema = Schema::parse(raw, &path, &mut errs);
                schema.check_structural(&path, true, &mut errs);
                if schema.default.is_some() {
                    errs.push(FieldError::forbidden(format!("{path}.default"), "must not be set at the root"));
                }
            }
        }
        parse_scale(v, &at, &mut errs);
        parse_columns(v, &at, &mut errs);
    }
    if let Some(old) = old {
        if s(old, "/spec/scope") != s(crd, "/spec/scope") && !s(old, "/spec/scope").is_empty() {
            errs.push(FieldError::immutable("spec.scope", s(crd, "/spec/scope")));
        }
    }
    // every stored version must stay in spec.versions
    for (i, stored) in strs(crd, "/status/storedVersions").iter().enumerate() {
        if !seen.contains(&stored.as_str()) {
            errs.push(FieldError::invalid(format!("status.storedVersions[{i}]"), stored.as_str(), "must appear in spec.versions"));
        }
    }
    errs
}

fn parse_scale(v: &Value, at: &str, errs: &mut Vec<FieldError>) -> Option<ScalePaths> {
    let scale = v.pointer("/subresources/scale")?;
    let at = format!("{at}.subresources.scale");
    let path = |key: &str, prefixes: &[&str], errs: &mut Vec<FieldError>| -> Option<String> {
        let p = scale.get(key).and_then(Value::as_str).unwrap_or("");
        if p.is_empty() {
            errs.push(FieldError::required(format!("{at}.{key}"), ""));
            return None;
        }
        let simple = p.starts_with('.') && !p.contains('[') && p.split('.').skip(1).all(|s| !s.is_empty());
        if !simple || !prefixes.iter().any(|pre| p.starts_with(&format!("{pre}."))) {
            let detail = if prefixes.len() == 1 {
                format!("should be a json path under {}", prefixes[0])
            } else {
                "should be a json path under either .spec or .status".to_string()
            };
            errs.push(FieldError::invalid(format!("{at}.{key}"), p, detail));
            return None;
        }
        Some(p.to_string())
    };
    let spec_replicas = path("specReplicasPath", &[".spec"], errs);
    let status_replicas = path("statusReplicasPath", &[".status"], errs);
    let label_selector = match scale.get("labelSelectorPath").and_then(Value::as_str) {
        None | Some("") => None,
        Some(_) => path("labelSelectorPath", &[".spec", ".status"], errs),
    };
    Some(ScalePaths { spec_replicas: spec_replicas?, status_replicas: status_replicas?, label_selector })
}

fn parse_columns(v: &Value, at: &str, errs: &mut Vec<FieldError>) -> Vec<Column> {
    let mut out = Vec::new();
    let Some(cols) = v.get("additionalPrinterColumns").and_then(Value::as_array) else { return out };
    for (i, c) in cols.iter().enumerate() {
        let at = format!("{at}.additionalPrinterColumns[{i}]");
        let name = s(c, "/name");
        let ty = s(c, "/type");
        let format = s(c, "/format");
        let json_path = s(c, "/jsonPath");
        let priority = c.get("priority").and_then(Value::as_i64).unwrap_or(0);
        if name.is_empty() {
            errs.push(FieldError::required(format!("{at}.name"), ""));
        }
        if !COLUMN_TYPES.contains(&ty) {
            errs.push(FieldError::not_supported(format!("{at}.type"), ty, COLUMN_TYPES));
        }
        if !format.is_empty() && !COLUMN_FORMATS.contains(&format) {
            errs.push(FieldError::not_supported(format!("{at}.format"), format, COLUMN_FORMATS));
        }
        if priority < 0 {
            errs.push(FieldError::invalid(format!("{at}.priority"), priority, "must be greater than or equal to 0"));
        }
        if json_path.is_empty() {
            errs.push(FieldError::required(format!("{at}.jsonPath"), ""));
        } else if let Err(e) = super::objects::column_path(json_path) {
            errs.push(FieldError::invalid(format!("{at}.jsonPath"), json_path, format!("must be a simple json path: {e}")));
        }
        out.push(Column {
            name: name.to_string(),
            ty: ty.to_string(),
            format: format.to_string(),
            description: s(c, "/description").to_string(),
            priority,
            json_path: json_path.to_string(),
        });
    }
    out
}

/// The served resources of a valid CRD. `None` for an invalid one (the API refused it when it
/// was written; one in the store anyway is not served).
pub fn parse(crd: &Value) -> Option<Definition> {
    if !validate(crd, None).is_empty() {
        return None;
    }
    let kind = s(crd, "/spec/names/kind").to_string();
    let plural = s(crd, "/spec/names/plural").to_string();
    let mut versions = Vec::new();
    let mut storage_version = String::new();
    for v in crd.pointer("/spec/versions").and_then(Value::as_array).into_iter().flatten() {
        let name = s(v, "/name").to_string();
        let storage = v.get("storage").and_then(Value::as_bool) == Some(true);
        if storage {
            storage_version = name.clone();
        }
        if v.get("served").and_then(Value::as_bool) != Some(true) {
            continue;
        }
        let mut errs = Vec::new();
        let raw_schema = v.pointer("/schema/openAPIV3Schema").cloned().unwrap_or(Value::Null);
        let schema = Schema::parse(&raw_schema, "", &mut errs);
        versions.push(Version {
            name,
            storage,
            schema,
            raw_schema,
            status: v.pointer("/subresources/status").is_some(),
            scale: parse_scale(v, "", &mut errs),
            columns: parse_columns(v, "", &mut errs),
        });
    }
    Some(Definition {
        name: s(crd, "/metadata/name").to_string(),
        group: s(crd, "/spec/group").to_string(),
        singular: match s(crd, "/spec/names/singular") {
            "" => kind.to_lowercase(),
            x => x.to_string(),
        },
        list_kind: match s(crd, "/spec/names/listKind") {
            "" => format!("{kind}List"),
            x => x.to_string(),
        },
        kind,
        plural,
        short_names: strs(crd, "/spec/names/shortNames"),
        categories: strs(crd, "/spec/names/categories"),
        namespaced: s(crd, "/spec/scope") == "Namespaced",
        versions,
        storage_version,
    })
}

/// Upstream's defaults for a CRD: singular and listKind from the kind, conversion None.
pub fn apply_defaults(crd: &mut Value) {
    let kind = s(crd, "/spec/names/kind").to_string();
    if let Some(names) = crd.pointer_mut("/spec/names").and_then(Value::as_object_mut) {
        if !kind.is_empty() {
            names.entry("singular").or_insert_with(|| Value::String(kind.to_lowercase()));
            names.entry("listKind").or_insert_with(|| Value::String(format!("{kind}List")));
        }
    }
    if let Some(spec) = crd.get_mut("spec").and_then(Value::as_object_mut) {
        spec.entry("conversion").or_insert_with(|| serde_json::json!({"strategy": "None"}));
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    pub fn widgets() -> Value {
        json!({
            "metadata": {"name": "widgets.example.com"},
            "spec": {
                "group": "example.com", "scope": "Namespaced",
                "names": {"plural": "widgets", "kind": "Widget", "shortNames": ["wg"], "categories": ["all"]},
                "versions": [
                    {"name": "v1", "served": true, "storage": true,
                     "schema": {"openAPIV3Schema": {"type": "object", "properties": {"spec": {"type": "object", "properties": {"replicas": {"type": "integer"}}}, "status": {"type": "object", "properties": {"replicas": {"type": "integer"}}}}}},
                     "subresources": {"status": {}, "scale": {"specReplicasPath": ".spec.replicas", "statusReplicasPath": ".status.replicas"}},
                     "additionalPrinterColumns": [{"name": "Replicas", "type": "integer", "jsonPath": ".spec.replicas"}]},
                    {"name": "v1beta1", "served": true, "storage": false,
                     "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}
                ]
            }
        })
    }

    fn messages(crd: &Value) -> Vec<String> {
        validate(crd, None).iter().map(|e| e.message()).collect()
    }

    #[test]
    fn a_valid_crd_defines_its_served_versions() {
        let crd = widgets();
        assert_eq!(messages(&crd), Vec::<String>::new());
        let d = parse(&crd).unwrap();
        assert_eq!((d.kind.as_str(), d.singular.as_str(), d.list_kind.as_str(), d.storage_version.as_str()), ("Widget", "widget", "WidgetList", "v1"));
        assert_eq!(d.versions.len(), 2);
        assert!(d.versions[0].status);
        assert_eq!(d.versions[0].scale.as_ref().unwrap().spec_replicas, ".spec.replicas");
        assert_eq!(d.versions[0].columns[0].name, "Replicas");
    }

    #[test]
    fn bad_crds_are_refused_with_field_paths() {
        let mut crd = widgets();
        crd["metadata"]["name"] = json!("gadgets.example.com");
        assert_eq!(messages(&crd), vec!["metadata.name: Invalid value: \"gadgets.example.com\": must be spec.names.plural+\".\"+spec.group"]);

        let mut crd = widgets();
        crd["spec"]["versions"][1]["storage"] = json!(true);
        assert!(messages(&crd)[0].ends_with("must have exactly one version marked as storage version"), "{:?}", messages(&crd));

        let mut crd = widgets();
        crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"] = json!({"properties": {"a": {"type": "string"}}});
        assert_eq!(
            messages(&crd),
            vec!["spec.versions[0].schema.openAPIV3Schema.properties[spec].type: Required value: must not be empty for specified object fields"]
        );

        let mut crd = widgets();
        crd["spec"]["versions"][0].as_object_mut().unwrap().remove("schema");
        assert_eq!(messages(&crd), vec!["spec.versions[0].schema.openAPIV3Schema: Required value: schemas are required"]);

        let mut crd = widgets();
        crd["spec"]["scope"] = json!("Global");
        assert_eq!(messages(&crd), vec!["spec.scope: Unsupported value: \"Global\": supported values: \"Cluster\", \"Namespaced\""]);

        let mut crd = widgets();
        crd["spec"]["versions"][0]["subresources"]["scale"]["specReplicasPath"] = json!(".status.replicas");
        assert_eq!(messages(&crd), vec!["spec.versions[0].subresources.scale.specReplicasPath: Invalid value: \".status.replicas\": should be a json path under .spec"]);

        let mut crd = widgets();
        crd["spec"]["versions"][0]["additionalPrinterColumns"][0]["type"] = json!("float");
        assert_eq!(messages(&crd).len(), 1);

        let mut crd = widgets();
        crd["spec"]["conversion"] = json!({"strategy": "Webhook"});
        assert_eq!(messages(&crd), vec!["spec.conversion.strategy: Unsupported value: \"Webhook\": supported values: \"None\""]);

        let mut crd = widgets();
        crd["spec"]["group"] = json!("example");
        crd["metadata"]["name"] = json!("widgets.example");
        assert_eq!(messages(&crd), vec!["spec.group: Invalid value: \"example\": should be a domain with at least one dot"]);
    }

    #[test]
    fn scope_is_immutable_and_stored_versions_stay() {
        let old = widgets();
        let mut new = widgets();
        new["spec"]["scope"] = json!("Cluster");
        assert_eq!(validate(&new, Some(&old)).len(), 1);
        let mut new = widgets();
        new["status"] = json!({"storedVersions": ["v1alpha1"]});
        assert_eq!(
            validate(&new, Some(&old)).iter().map(|e| e.message()).collect::<Vec<_>>(),
            vec!["status.storedVersions[0]: Invalid value: \"v1alpha1\": must appear in spec.versions"]
        );
    }
}
