//! Structural schemas of CustomResourceDefinitions (apiextensions.k8s.io/v1): the checks that
//! make a schema structural, validation of objects against it, pruning of unknown fields and
//! defaulting — as upstream's apiextensions-apiserver does them.
//!
//! A schema is parsed once per CRD version into [`Schema`]; every custom object written is
//! validated, pruned and defaulted with it.

use std::collections::BTreeMap;

use regex::Regex;
use serde_json::{Map, Value};

use crate::validation::FieldError;

/// One node of a structural schema.
#[derive(Debug, Clone, Default)]
pub struct Schema {
    pub ty: Option<String>,
    pub format: Option<String>,
    pub properties: BTreeMap<String, Schema>,
    /// `additionalProperties` as a schema (maps); `Some(None)`-like `true` is `map_any`.
    pub additional: Option<Box<Schema>>,
    /// `additionalProperties: true` (or an empty schema): any value, not pruned.
    pub additional_any: bool,
    pub items: Option<Box<Schema>>,
    pub required: Vec<String>,
    pub enumeration: Vec<Value>,
    pub pattern: Option<(String, Regex)>,
    pub minimum: Option<f64>,
    pub maximum: Option<f64>,
    pub exclusive_minimum: bool,
    pub exclusive_maximum: bool,
    pub multiple_of: Option<f64>,
    pub min_length: Option<u64>,
    pub max_length: Option<u64>,
    pub min_items: Option<u64>,
    pub max_items: Option<u64>,
    pub min_properties: Option<u64>,
    pub max_properties: Option<u64>,
    pub unique_items: bool,
    pub default: Option<Value>,
    pub nullable: bool,
    pub preserve_unknown: bool,
    pub int_or_string: bool,
    pub embedded_resource: bool,
    pub list_type: Option<String>,
    pub list_map_keys: Vec<String>,
    pub all_of: Vec<Schema>,
    pub any_of: Vec<Schema>,
    pub one_of: Vec<Schema>,
    pub not: Option<Box<Schema>>,
    /// x-kubernetes-validations (CEL) rules are kept but not evaluated (docs/design/control-plane.md).
    pub cel_rules: usize,
}

fn num(v: &Map<String, Value>, k: &str) -> Option<f64> {
    v.get(k).and_then(Value::as_f64)
}

fn uint(v: &Map<String, Value>, k: &str) -> Option<u64> {
    v.get(k).and_then(Value::as_u64)
}

fn flag(v: &Map<String, Value>, k: &str) -> bool {
    v.get(k).and_then(Value::as_bool).unwrap_or(false)
}

/// Fields a structural schema may not use (upstream: they are not supported in CRD schemas).
const FORBIDDEN: &[&str] = &["$ref", "definitions", "id", "$schema", "dependencies", "additionalItems", "patternProperties"];

impl Schema {
    /// Parses a JSONSchemaProps object. `path` is the field path of `v` (for errors); every
    /// problem that makes the schema unusable or not structural is pushed to `errs`.
    pub fn parse(v: &Value, path: &str, errs: &mut Vec<FieldError>) -> Schema {
        let Some(m) = v.as_object() else {
            errs.push(FieldError::invalid(path, v.clone(), "must be an object"));
            return Schema::default();
        };
        let mut s = Schema {
            ty: m.get("type").and_then(Value::as_str).filter(|t| !t.is_empty()).map(str::to_string),
            format: m.get("format").and_then(Value::as_str).map(str::to_string),
            minimum: num(m, "minimum"),
            maximum: num(m, "maximum"),
            exclusive_minimum: flag(m, "exclusiveMinimum"),
            exclusive_maximum: flag(m, "exclusiveMaximum"),
            multiple_of: num(m, "multipleOf"),
            min_length: uint(m, "minLength"),
            max_length: uint(m, "maxLength"),
            min_items: uint(m, "minItems"),
            max_items: uint(m, "maxItems"),
            min_properties: uint(m, "minProperties"),
            max_properties: uint(m, "maxProperties"),
            unique_items: flag(m, "uniqueItems"),
            default: m.get("default").cloned(),
            nullable: flag(m, "nullable"),
            preserve_unknown: flag(m, "x-kubernetes-preserve-unknown-fields"),
            int_or_string: flag(m, "x-kubernetes-int-or-string"),
            embedded_resource: flag(m, "x-kubernetes-embedded-resource"),
            list_type: m.get("x-kubernetes-list-type").and_then(Value::as_str).map(str::to_string),
            list_map_keys: str_list(m.get("x-kubernetes-list-map-keys")),
            required: str_list(m.get("required")),
            enumeration: m.get("enum").and_then(Value::as_array).cloned().unwrap_or_default(),
            cel_rules: m.get("x-kubernetes-validations").and_then(Value::as_array).map(Vec::len).unwrap_or(0),
            ..Schema::default()
        };
        for f in FORBIDDEN {
            if m.contains_key(*f) {
                errs.push(FieldError::forbidden(format!("{path}.{f}"), format!("{f} is not supported")));
            }
        }
        if let Some(t) = &s.ty {
            if !matches!(t.as_str(), "object" | "array" | "string" | "integer" | "number" | "boolean") {
                errs.push(FieldError::not_supported(
                    format!("{path}.type"),
                    t.clone(),
                    &["array", "boolean", "integer", "number", "object", "string"],
                ));
            }
        }
        if let Some(p) = m.get("pattern").and_then(Value::as_str) {
            match Regex::new(p) {
                Ok(re) => s.pattern = Some((p.to_string(), re)),
                Err(e) => errs.push(FieldError::invalid(format!("{path}.pattern"), p, format!("must be a valid regular expression, but isn't: {e}"))),
            }
        }
        if let Some(Value::Object(props)) = m.get("properties") {
            for (k, pv) in props {
                s.properties.insert(k.clone(), Schema::parse(pv, &format!("{path}.properties[{k}]"), errs));
            }
        }
        match m.get("additionalProperties") {
            Some(Value::Bool(true)) => s.additional_any = true,
            Some(Value::Bool(false)) | None => {}
            Some(a @ Value::Object(_)) => {
                if !s.properties.is_empty() {
                    errs.push(FieldError::forbidden(
                        format!("{path}.additionalProperties"),
                        "additionalProperties and properties are mutual exclusive",
                    ));
                }
                s.additional = Some(Box::new(Schema::parse(a, &format!("{path}.additionalProperties"), errs)));
            }
            Some(other) => errs.push(FieldError::invalid(format!("{path}.additionalProperties"), other.clone(), "must be a boolean or a schema")),
        }
        match m.get("items") {
            None => {}
            Some(Value::Array(_)) => errs.push(FieldError::forbidden(format!("{path}.items"), "items must be a schema object and not an array")),
            Some(i) => s.items = Some(Box::new(Schema::parse(i, &format!("{path}.items"), errs))),
        }
        for (key, out) in [("allOf", &mut s.all_of), ("anyOf", &mut s.any_of), ("oneOf", &mut s.one_of)] {
            if let Some(list) = m.get(key).and_then(Value::as_array) {
                for (i, x) in list.iter().enumerate() {
                    out.push(Schema::parse(x, &format!("{path}.{key}[{i}]"), errs));
                }
            }
        }
        if let Some(n) = m.get("not") {
            s.not = Some(Box::new(Schema::parse(n, &format!("{path}.not"), errs)));
        }
        s
    }

    /// The structural rules upstream checks (NewStructural + ValidateStructural): every
    /// specified node has a type (unless int-or-string or preserve-unknown-fields), value
    /// validations (allOf/anyOf/oneOf/not) carry no structure, embedded resources are objects,
    /// the metadata at the root restricts only name and generateName.
    pub fn check_structural(&self, path: &str, root: bool, errs: &mut Vec<FieldError>) {
        if self.ty.is_none() && !self.int_or_string && !self.preserve_unknown {
            errs.push(FieldError::required(format!("{path}.type"), "must not be empty for specified object fields"));
        }
        if root && self.ty.as_deref() != Some("object") {
            errs.push(FieldError::invalid(format!("{path}.type"), self.ty.clone().unwrap_or_default(), "must be object at the root"));
        }
        if self.int_or_string && self.ty.is_some() {
            errs.push(FieldError::invalid(
                format!("{path}.type"),
                self.ty.clone().unwrap_or_default(),
                "must be empty if x-kubernetes-int-or-string is true",
            ));
        }
        if self.embedded_resource {
            if self.ty.as_deref() != Some("object") {
                errs.push(FieldError::invalid(format!("{path}.type"), self.ty.clone().unwrap_or_default(), "must be object if x-kubernetes-embedded-resource is true"));
            }
            if self.properties.is_empty() && !self.preserve_unknown {
                errs.push(FieldError::required(
                    format!("{path}.properties"),
                    "must not be empty if x-kubernetes-embedded-resource is true without x-kubernetes-preserve-unknown-fields",
                ));
            }
        }
        if self.ty.as_deref() == Some("array") && self.items.is_none() {
            errs.push(FieldError::required(format!("{path}.items"), "must be specified"));
        }
        if self.nullable && self.ty.is_none() {
            errs.push(FieldError::forbidden(format!("{path}.nullable"), "must be false when type is empty"));
        }
        match self.list_type.as_deref() {
            None | Some("atomic") | Some("set") => {
                if !self.list_map_keys.is_empty() {
                    errs.push(FieldError::forbidden(format!("{path}.x-kubernetes-list-map-keys"), "must be empty if x-kubernetes-list-type is not map"));
                }
            }
            Some("map") => {
                if self.list_map_keys.is_empty() {
                    errs.push(FieldError::required(format!("{path}.x-kubernetes-list-map-keys"), "must not be empty if x-kubernetes-list-type is map"));
                }
                if let Some(items) = &self.items {
                    if items.ty.as_deref() != Some("object") {
                        errs.push(FieldError::invalid(format!("{path}.items.type"), items.ty.clone().unwrap_or_default(), "must be object if parent array's x-kubernetes-list-type is map"));
                    }
                    for k in &self.list_map_keys {
                        match items.properties.get(k) {
                            None => errs.push(FieldError::invalid(format!("{path}.x-kubernetes-list-map-keys"), k.clone(), "entries must all be names of item properties")),
                            Some(p) if !items.required.contains(k) && p.default.is_none() => errs.push(FieldError::required(
                                format!("{path}.items.properties[{k}]"),
                                "this property is in x-kubernetes-list-map-keys, so it must have a default or be a required property",
                            )),
                            _ => {}
                        }
                    }
                }
            }
            Some(other) => errs.push(FieldError::not_supported(format!("{path}.x-kubernetes-list-type"), other, &["atomic", "set", "map"])),
        }
        if self.list_type.is_some() && self.ty.as_deref() != Some("array") {
            errs.push(FieldError::invalid(format!("{path}.type"), self.ty.clone().unwrap_or_default(), "must be array if x-kubernetes-list-type is specified"));
        }
        if root {
            if let Some(meta) = self.properties.get("metadata") {
                for k in meta.properties.keys() {
                    if k != "name" && k != "generateName" {
                        errs.push(FieldError::forbidden(format!("{path}.properties[metadata].properties[{k}]"), "must not be specified"));
                    }
                }
            }
        }
        for (k, p) in &self.properties {
            let at = format!("{path}.properties[{k}]");
            if root && k == "metadata" {
                if p.ty.as_deref() != Some("object") {
                    errs.push(FieldError::invalid(format!("{at}.type"), p.ty.clone().unwrap_or_default(), "must be object"));
                }
                continue;
            }
            p.check_structural(&at, false, errs);
        }
        if let Some(a) = &self.additional {
            a.check_structural(&format!("{path}.additionalProperties"), false, errs);
        }
        if let Some(i) = &self.items {
            i.check_structural(&format!("{path}.items"), false, errs);
        }
        for (key, list) in [("allOf", &self.all_of), ("anyOf", &self.any_of), ("oneOf", &self.one_of)] {
            for (i, x) in list.iter().enumerate() {
                x.check_value_validation(&format!("{path}.{key}[{i}]"), self, errs);
            }
        }
        if let Some(n) = &self.not {
            n.check_value_validation(&format!("{path}.not"), self, errs);
        }
    }

    /// Inside allOf/anyOf/oneOf/not only value validations may appear; their properties and
    /// items must be specified in the structural part too.
    fn check_value_validation(&self, path: &str, structural: &Schema, errs: &mut Vec<FieldError>) {
        // upstream's one exception: the int-or-string pattern anyOf [{type: integer}, {type: string}]
        let int_or_string_branch = structural.int_or_string && matches!(self.ty.as_deref(), Some("integer" | "string")) && self.properties.is_empty();
        if self.ty.is_some() && !int_or_string_branch {
            errs.push(FieldError::forbidden(format!("{path}.type"), "must be empty to be structural"));
        }
        if self.default.is_some() {
            errs.push(FieldError::forbidden(format!("{path}.default"), "must be undefined to be structural"));
        }
        if self.additional.is_some() || self.additional_any {
            errs.push(FieldError::forbidden(format!("{path}.additionalProperties"), "must be undefined to be structural"));
        }
        if self.nullable {
            errs.push(FieldError::forbidden(format!("{path}.nullable"), "must be false to be structural"));
        }
        if self.preserve_unknown || self.embedded_resource || self.int_or_string {
            errs.push(FieldError::forbidden(format!("{path}.x-kubernetes-preserve-unknown-fields"), "must be false to be structural"));
        }
        for k in self.properties.keys() {
            if !structural.properties.contains_key(k) {
                errs.push(FieldError::required(
                    format!("{path}.properties[{k}]"),
                    format!("must have a corresponding property in the structural schema ({k})"),
                ));
            }
        }
    }

    fn is_map(&self) -> bool {
        self.additional.is_some() || self.additional_any
    }
}

fn str_list(v: Option<&Value>) -> Vec<String> {
    v.and_then(Value::as_array).map(|a| a.iter().filter_map(|s| s.as_str().map(str::to_string)).collect()).unwrap_or_default()
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

/// Validates `v` against the schema; errors name the field path as upstream's
/// (`spec.replicas: Invalid value: "string": spec.replicas in body must be of type integer: "string"`).
pub fn validate(s: &Schema, v: &Value, path: &str, errs: &mut Vec<FieldError>) {
    if v.is_null() {
        if !s.nullable && s.ty.is_some() {
            errs.push(FieldError::invalid(path, Value::Null, format!("{path} in body must be of type {}: \"null\"", s.ty.as_deref().unwrap_or(""))));
        }
        return;
    }
    let actual = type_name(v);
    if s.int_or_string {
        if !matches!(actual, "integer" | "string") {
            errs.push(FieldError::invalid(path, v.clone(), format!("{path} in body must be of type integer or string: \"{actual}\"")));
            return;
        }
    } else if let Some(t) = &s.ty {
        let ok = match t.as_str() {
            "number" => matches!(actual, "number" | "integer"),
            "integer" => actual == "integer" || v.as_f64().is_some_and(|f| f.fract() == 0.0 && actual == "number"),
            t => t == actual,
        };
        if !ok {
            errs.push(FieldError::invalid(path, type_shown(v), format!("{path} in body must be of type {t}: \"{actual}\"")));
            return;
        }
    }
    if !s.enumeration.is_empty() && !s.enumeration.contains(v) {
        let allowed: Vec<String> = s.enumeration.iter().map(|e| match e {
            Value::String(x) => format!("\"{x}\""),
            other => other.to_string(),
        }).collect();
        let shown: Vec<&str> = allowed.iter().map(String::as_str).collect();
        let mut e = FieldError::not_supported(path, v.clone(), &[]);
        e.detail = format!("supported values: {}", shown.join(", "));
        errs.push(e);
    }
    match v {
        Value::String(x) => {
            let len = x.chars().count() as u64;
            if let Some(m) = s.max_length.filter(|m| len > *m) {
                errs.push(FieldError::too_long(path, m as usize));
                if let Some(last) = errs.last_mut() {
                    last.detail = format!("may not be more than {m} bytes");
                }
            }
            if let Some(m) = s.min_length.filter(|m| len < *m) {
                errs.push(FieldError::invalid(path, v.clone(), format!("{path} in body should be at least {m} chars long")));
            }
            if let Some((p, re)) = &s.pattern {
                if !re.is_match(x) {
                    errs.push(FieldError::invalid(path, v.clone(), format!("{path} in body should match '{p}'")));
                }
            }
            if let Some(f) = &s.format {
                if let Some(why) = check_format(f, x) {
                    errs.push(FieldError::invalid(path, v.clone(), format!("{path} in body must be of type {f}: {why}")));
                }
            }
        }
        Value::Number(n) => {
            let f = n.as_f64().unwrap_or(0.0);
            if let Some(m) = s.maximum {
                if f > m || (s.exclusive_maximum && f == m) {
                    let rel = if s.exclusive_maximum { "less than" } else { "less than or equal to" };
                    errs.push(FieldError::invalid(path, v.clone(), format!("{path} in body should be {rel} {}", fmt_num(m))));
                }
            }
            if let Some(m) = s.minimum {
                if f < m || (s.exclusive_minimum && f == m) {
                    let rel = if s.exclusive_minimum { "greater than" } else { "greater than or equal to" };
                    errs.push(FieldError::invalid(path, v.clone(), format!("{path} in body should be {rel} {}", fmt_num(m))));
                }
            }
            if let Some(m) = s.multiple_of.filter(|m| *m != 0.0) {
                let q = f / m;
                if (q - q.round()).abs() > 1e-9 {
                    errs.push(FieldError::invalid(path, v.clone(), format!("{path} in body should be a multiple of {}", fmt_num(m))));
                }
            }
        }
        Value::Array(items) => {
            let n = items.len() as u64;
            if let Some(m) = s.max_items.filter(|m| n > *m) {
                let mut e = FieldError::too_long(path, m as usize);
                e.detail = format!("must have at most {m} items");
                errs.push(e);
            }
            if let Some(m) = s.min_items.filter(|m| n < *m) {
                errs.push(FieldError::invalid(path, Value::from(n), format!("{path} in body should have at least {m} items")));
            }
            if let Some(is) = &s.items {
                for (i, x) in items.iter().enumerate() {
                    validate(is, x, &format!("{path}[{i}]"), errs);
                }
            }
            match s.list_type.as_deref() {
                Some("set") => {
                    for (i, x) in items.iter().enumerate() {
                        if items[..i].contains(x) {
                            errs.push(FieldError::duplicate(format!("{path}[{i}]"), x.clone()));
                        }
                    }
                }
                Some("map") => {
                    let key_of = |x: &Value| s.list_map_keys.iter().map(|k| x.get(k).cloned().unwrap_or(Value::Null)).collect::<Vec<_>>();
                    for (i, x) in items.iter().enumerate() {
                        let k = key_of(x);
                        if items[..i].iter().any(|y| key_of(y) == k) {
                            let shown: Map<String, Value> = s.list_map_keys.iter().cloned().zip(k).collect();
                            errs.push(FieldError::duplicate(format!("{path}[{i}]"), Value::Object(shown)));
                        }
                    }
                }
                _ => {
                    if s.unique_items {
                        for (i, x) in items.iter().enumerate() {
                            if items[..i].contains(x) {
                                errs.push(FieldError::duplicate(format!("{path}[{i}]"), x.clone()));
                            }
                        }
                    }
                }
            }
        }
        Value::Object(m) => {
            for r in &s.required {
                if !m.contains_key(r) {
                    errs.push(FieldError::required(join(path, r), ""));
                }
            }
            let n = m.len() as u64;
            if let Some(x) = s.max_properties.filter(|x| n > *x) {
                let mut e = FieldError::too_long(path, x as usize);
                e.detail = format!("must have at most {x} items");
                errs.push(e);
            }
            if let Some(x) = s.min_properties.filter(|x| n < *x) {
                errs.push(FieldError::invalid(path, Value::from(n), format!("{path} in body should have at least {x} properties")));
            }
            for (k, x) in m {
                if let Some(p) = s.properties.get(k) {
                    validate(p, x, &join(path, k), errs);
                } else if let Some(a) = &s.additional {
                    validate(a, x, &join(path, k), errs);
                }
            }
            if s.embedded_resource {
                for k in ["apiVersion", "kind"] {
                    if m.get(k).and_then(Value::as_str).is_none_or(|x| x.is_empty()) {
                        errs.push(FieldError::required(join(path, k), "must not be empty"));
                    }
                }
            }
        }
        _ => {}
    }
    for x in &s.all_of {
        validate(x, v, path, errs);
    }
    if !s.any_of.is_empty() && !s.any_of.iter().any(|x| passes(x, v, path)) {
        errs.push(FieldError::invalid(path, v.clone(), format!("{path} in body must match at least one schema (anyOf)")));
    }
    if !s.one_of.is_empty() {
        let n = s.one_of.iter().filter(|x| passes(x, v, path)).count();
        if n != 1 {
            errs.push(FieldError::invalid(path, v.clone(), format!("{path} in body must match exactly one schema (oneOf)")));
        }
    }
    if let Some(n) = &s.not {
        if passes(n, v, path) {
            errs.push(FieldError::invalid(path, v.clone(), format!("{path} in body must not validate the schema (not)")));
        }
    }
}

fn passes(s: &Schema, v: &Value, path: &str) -> bool {
    let mut e = Vec::new();
    validate(s, v, path, &mut e);
    e.is_empty()
}

/// The value echoed in a type error: upstream shows the Go type name of what was sent.
fn type_shown(v: &Value) -> Value {
    Value::String(type_name(v).to_string())
}

fn fmt_num(f: f64) -> String {
    if f.fract() == 0.0 && f.abs() < 1e15 {
        format!("{}", f as i64)
    } else {
        f.to_string()
    }
}

/// The formats upstream checks; unknown formats are accepted, as upstream does.
fn check_format(format: &str, x: &str) -> Option<String> {
    let bad = |what: &str| Some(format!("\"{x}\" is not a valid {what}"));
    match format {
        "int32" | "int64" | "float" | "double" | "byte" | "password" | "" => None,
        "date-time" | "datetime" => x.parse::<jiff::Timestamp>().is_err().then(|| format!("\"{x}\" is not a valid date-time")),
        "date" => x.parse::<jiff::civil::Date>().is_err().then(|| format!("\"{x}\" is not a valid date")),
        "ipv4" => x.parse::<std::net::Ipv4Addr>().is_err().then(|| bad("ipv4").unwrap_or_default()),
        "ipv6" => x.parse::<std::net::Ipv6Addr>().is_err().then(|| bad("ipv6").unwrap_or_default()),
        "cidr" => x.parse::<ipnet::IpNet>().is_err().then(|| bad("cidr").unwrap_or_default()),
        "uuid" => uuid::Uuid::parse_str(x).is_err().then(|| bad("uuid").unwrap_or_default()),
        "hostname" => (!crate::validation::dns1123_subdomain(x).is_empty()).then(|| bad("hostname").unwrap_or_default()),
        _ => None,
    }
}

/// Drops every field the schema does not specify (upstream's pruning), except under
/// x-kubernetes-preserve-unknown-fields; returns the dropped paths. `apiVersion`, `kind` and
/// `metadata` at the root and of embedded resources are kept (metadata is pruned to
/// ObjectMeta by the caller).
pub fn prune(s: &Schema, v: &mut Value, path: &str, root: bool, dropped: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            if s.preserve_unknown && s.properties.is_empty() && !s.is_map() {
                return;
            }
            let keep_meta = root || s.embedded_resource;
            let keys: Vec<String> = m.keys().cloned().collect();
            for k in keys {
                if keep_meta && matches!(k.as_str(), "apiVersion" | "kind" | "metadata") {
                    continue;
                }
                if let Some(p) = s.properties.get(&k) {
                    if let Some(x) = m.get_mut(&k) {
                        prune(p, x, &join(path, &k), false, dropped);
                    }
                } else if let Some(a) = &s.additional {
                    if let Some(x) = m.get_mut(&k) {
                        prune(a, x, &join(path, &k), false, dropped);
                    }
                } else if !s.additional_any && !s.preserve_unknown {
                    m.remove(&k);
                    dropped.push(join(path, &k));
                }
            }
        }
        Value::Array(items) => {
            if let Some(is) = &s.items {
                for (i, x) in items.iter_mut().enumerate() {
                    prune(is, x, &format!("{path}[{i}]"), false, dropped);
                }
            }
        }
        _ => {}
    }
}

/// Applies the schema's defaults: missing properties with a default get it, then defaults
/// inside apply recursively (upstream's structural defaulting). Nulls of non-nullable fields
/// with a default are replaced, as upstream does.
pub fn apply_defaults(s: &Schema, v: &mut Value) {
    match v {
        Value::Object(m) => {
            for (k, p) in &s.properties {
                match m.get(k) {
                    None => {
                        if let Some(d) = &p.default {
                            m.insert(k.clone(), d.clone());
                        }
                    }
                    Some(Value::Null) if !p.nullable => {
                        if let Some(d) = &p.default {
                            m.insert(k.clone(), d.clone());
                        }
                    }
                    _ => {}
                }
                if let Some(x) = m.get_mut(k) {
                    apply_defaults(p, x);
                }
            }
            if let Some(a) = &s.additional {
                for x in m.values_mut() {
                    apply_defaults(a, x);
                }
            }
        }
        Value::Array(items) => {
            if let Some(is) = &s.items {
                for x in items {
                    apply_defaults(is, x);
                }
            }
        }
        _ => {}
    }
}

/// Counts the x-kubernetes-validations rules in the schema (they are not evaluated).
pub fn cel_rules(s: &Schema) -> usize {
    s.cel_rules
        + s.properties.values().map(cel_rules).sum::<usize>()
        + s.additional.as_deref().map(cel_rules).unwrap_or(0)
        + s.items.as_deref().map(cel_rules).unwrap_or(0)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(v: Value) -> Schema {
        let mut errs = Vec::new();
        let s = Schema::parse(&v, "schema", &mut errs);
        assert!(errs.is_empty(), "{errs:?}");
        s
    }

    fn widget() -> Schema {
        parse(json!({
            "type": "object",
            "properties": {
                "spec": {
                    "type": "object",
                    "required": ["size"],
                    "properties": {
                        "size": {"type": "string", "enum": ["small", "large"]},
                        "replicas": {"type": "integer", "minimum": 0, "maximum": 10, "default": 1},
                        "name": {"type": "string", "pattern": "^[a-z]+$", "maxLength": 8},
                        "port": {"x-kubernetes-int-or-string": true},
                        "tags": {"type": "array", "items": {"type": "string"}, "x-kubernetes-list-type": "set"},
                        "env": {"type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"],
                                "items": {"type": "object", "required": ["name"], "properties": {"name": {"type": "string"}, "value": {"type": "string"}}}},
                        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                        "raw": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                        "template": {"type": "object", "x-kubernetes-embedded-resource": true, "x-kubernetes-preserve-unknown-fields": true},
                    }
                },
                "status": {"type": "object", "properties": {"ready": {"type": "boolean"}}}
            }
        }))
    }

    fn errors(s: &Schema, v: Value) -> Vec<String> {
        let mut errs = Vec::new();
        validate(s, &v, "", &mut errs);
        errs.iter().map(|e| e.message()).collect()
    }

    #[test]
    fn valid_objects_pass_and_each_violation_names_its_field() {
        let s = widget();
        assert_eq!(errors(&s, json!({"spec": {"size": "small", "replicas": 3, "port": "http", "tags": ["a", "b"]}})), Vec::<String>::new());
        assert_eq!(errors(&s, json!({"spec": {"size": "small", "port": 8080}})), Vec::<String>::new());
        let e = errors(&s, json!({"spec": {"size": "medium", "replicas": "3"}}));
        assert!(e.contains(&"spec.size: Unsupported value: \"medium\": supported values: \"small\", \"large\"".to_string()), "{e:?}");
        assert!(e.contains(&"spec.replicas: Invalid value: \"string\": spec.replicas in body must be of type integer: \"string\"".to_string()), "{e:?}");
        let e = errors(&s, json!({"spec": {"replicas": 11}}));
        assert!(e.contains(&"spec.size: Required value".to_string()), "{e:?}");
        assert!(e.contains(&"spec.replicas: Invalid value: 11: spec.replicas in body should be less than or equal to 10".to_string()), "{e:?}");
        let e = errors(&s, json!({"spec": {"size": "small", "name": "Abc"}}));
        assert_eq!(e, vec!["spec.name: Invalid value: \"Abc\": spec.name in body should match '^[a-z]+$'"]);
        let e = errors(&s, json!({"spec": {"size": "small", "name": "abcdefghij"}}));
        assert_eq!(e, vec!["spec.name: Too long: may not be more than 8 bytes"]);
        let e = errors(&s, json!({"spec": {"size": "small", "port": true}}));
        assert_eq!(e, vec!["spec.port: Invalid value: true: spec.port in body must be of type integer or string: \"boolean\""]);
        let e = errors(&s, json!({"spec": {"size": "small", "tags": ["a", "a"]}}));
        assert_eq!(e, vec!["spec.tags[1]: Duplicate value: \"a\""]);
        let e = errors(&s, json!({"spec": {"size": "small", "env": [{"name": "A"}, {"name": "A", "value": "x"}]}}));
        assert_eq!(e, vec!["spec.env[1]: Duplicate value: {\"name\":\"A\"}"]);
        let e = errors(&s, json!({"spec": {"size": "small", "labels": {"a": 1}}}));
        assert_eq!(e, vec!["spec.labels.a: Invalid value: \"integer\": spec.labels.a in body must be of type string: \"integer\""]);
        let e = errors(&s, json!({"spec": {"size": "small", "template": {"spec": {}}}}));
        assert_eq!(e, vec!["spec.template.apiVersion: Required value: must not be empty", "spec.template.kind: Required value: must not be empty"]);
    }

    #[test]
    fn pruning_drops_unknown_fields_but_keeps_preserved_and_root_metadata() {
        let s = widget();
        let mut v = json!({"apiVersion": "x/v1", "kind": "W", "metadata": {"name": "a"}, "bogus": 1,
            "spec": {"size": "small", "extra": {"a": 1}, "raw": {"anything": [1]}, "labels": {"k": "v"},
                     "template": {"apiVersion": "v1", "kind": "Pod", "metadata": {"x": 1}, "spec": {"y": 2}},
                     "env": [{"name": "A", "junk": 1}]},
            "status": {"ready": true, "gone": 1}});
        let mut dropped = Vec::new();
        prune(&s, &mut v, "", true, &mut dropped);
        assert_eq!(dropped, vec!["bogus", "spec.env[0].junk", "spec.extra", "status.gone"]);
        assert_eq!(v["spec"]["raw"], json!({"anything": [1]}));
        assert_eq!(v["spec"]["template"]["spec"], json!({"y": 2}));
        assert_eq!(v["metadata"], json!({"name": "a"}));
        assert_eq!(v["spec"]["labels"], json!({"k": "v"}));
    }

    #[test]
    fn defaults_fill_missing_fields() {
        let s = widget();
        let mut v = json!({"spec": {"size": "small"}});
        apply_defaults(&s, &mut v);
        assert_eq!(v["spec"]["replicas"], json!(1));
        let mut v = json!({"spec": {"size": "small", "replicas": 5}});
        apply_defaults(&s, &mut v);
        assert_eq!(v["spec"]["replicas"], json!(5));
        let mut v = json!({"spec": {"size": "small", "replicas": null}});
        apply_defaults(&s, &mut v);
        assert_eq!(v["spec"]["replicas"], json!(1));
    }

    #[test]
    fn non_structural_schemas_are_named() {
        let check = |v: Value| {
            let mut errs = Vec::new();
            let s = Schema::parse(&v, "schema.openAPIV3Schema", &mut errs);
            s.check_structural("schema.openAPIV3Schema", true, &mut errs);
            errs.iter().map(|e| e.message()).collect::<Vec<_>>()
        };
        assert!(check(json!({"type": "object", "properties": {"spec": {"type": "object"}}})).is_empty());
        assert_eq!(
            check(json!({"type": "object", "properties": {"spec": {"properties": {"a": {"type": "string"}}}}})),
            vec!["schema.openAPIV3Schema.properties[spec].type: Required value: must not be empty for specified object fields"]
        );
        assert_eq!(
            check(json!({"type": "object", "properties": {"spec": {"type": "object", "anyOf": [{"type": "object"}]}}})),
            vec!["schema.openAPIV3Schema.properties[spec].anyOf[0].type: Forbidden: must be empty to be structural"]
        );
        assert_eq!(
            check(json!({"type": "array", "items": {"type": "string"}})),
            vec!["schema.openAPIV3Schema.type: Invalid value: \"array\": must be object at the root"]
        );
        assert_eq!(
            check(json!({"type": "object", "properties": {"metadata": {"type": "object", "properties": {"labels": {"type": "object"}}}}})),
            vec!["schema.openAPIV3Schema.properties[metadata].properties[labels]: Forbidden: must not be specified"]
        );
        assert_eq!(
            check(json!({"type": "object", "properties": {"a": {"type": "array", "items": [{"type": "string"}]}}})),
            vec!["schema.openAPIV3Schema.properties[a].items: Forbidden: items must be a schema object and not an array", "schema.openAPIV3Schema.properties[a].items: Required value: must be specified"]
        );
        assert!(check(json!({"type": "object", "properties": {"p": {"x-kubernetes-int-or-string": true, "anyOf": [{"type": "integer"}, {"type": "string"}]}}})).is_empty());
        assert_eq!(check(json!({"type": "object", "properties": {"p": {"type": "strin"}}})).len(), 1);
        assert_eq!(
            check(json!({"type": "object", "properties": {"p": {"type": "string", "pattern": "(["}}})).len(),
            1
        );
    }

    #[test]
    fn garbage_never_panics() {
        let s = widget();
        for v in [json!(null), json!(1), json!("x"), json!([1, {"a": null}]), json!({"spec": null}), json!({"spec": [1]})] {
            let mut x = v.clone();
            let _ = errors(&s, v);
            prune(&s, &mut x, "", true, &mut Vec::new());
            apply_defaults(&s, &mut x);
        }
    }
}
