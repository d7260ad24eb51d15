//! Generates `control-plane/src/protobuf/schema.rs`, the table that drives the decoder of
//! `application/vnd.kubernetes.protobuf` request bodies.
//!
//! Field numbers, wire types and message references come from the prost structs of the k8s-pb
//! crate (parsed with syn, never compiled into the server); the JSON name of every field comes
//! from the OpenAPI schema of the same type in k8s-openapi (matched lower-case without
//! underscores: `pod_i_ps` -> `podIPs`, `host_ip` -> `hostIP`). A field that matches no JSON
//! property (or more than one) stops the generator with an error: nothing is guessed.
//!
//! Regenerate (the k8s-pb sources are found with `cargo metadata`):
//!
//! ```text
//! cargo run -p ferro-control-plane --example gen-protobuf-schema
//! cargo run -p ferro-control-plane --example gen-protobuf-schema -- --check   # CI: up to date?
//! ```

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context as _};
use ferro_control_plane::resources::RESOURCES;
use syn::punctuated::Punctuated;
use syn::{Expr, Lit, Meta, Token};

/// Messages with a JSON form of their own (apimachinery's custom marshalers).
const WELL_KNOWN: &[(&str, &str)] = &[
    ("io.k8s.apimachinery.pkg.apis.meta.v1.Time", "Time"),
    ("io.k8s.apimachinery.pkg.apis.meta.v1.MicroTime", "MicroTime"),
    ("io.k8s.apimachinery.pkg.apis.meta.v1.Duration", "Duration"),
    ("io.k8s.apimachinery.pkg.apis.meta.v1.FieldsV1", "FieldsV1"),
    ("io.k8s.apimachinery.pkg.api.resource.Quantity", "Quantity"),
    ("io.k8s.apimachinery.pkg.util.intstr.IntOrString", "IntOrString"),
    ("io.k8s.apimachinery.pkg.runtime.RawExtension", "RawExtension"),
    ("io.k8s.api.certificates.v1.ExtraValue", "StringList"),
    ("io.k8s.api.authentication.v1.ExtraValue", "StringList"),
    ("io.k8s.api.authorization.v1.ExtraValue", "StringList"),
];

/// Kinds accepted as request bodies besides the served resources: subresource bodies and the
/// DeleteOptions of DELETE requests (sent under any group version, hence "*").
const EXTRA_ROOTS: &[(&str, &str, &str)] = &[
    ("v1", "Binding", "io.k8s.api.core.v1.Binding"),
    ("policy/v1", "Eviction", "io.k8s.api.policy.v1.Eviction"),
    ("autoscaling/v1", "Scale", "io.k8s.api.autoscaling.v1.Scale"),
    ("authentication.k8s.io/v1", "TokenRequest", "io.k8s.api.authentication.v1.TokenRequest"),
    ("authorization.k8s.io/v1", "SelfSubjectAccessReview", "io.k8s.api.authorization.v1.SelfSubjectAccessReview"),
    ("authorization.k8s.io/v1", "SelfSubjectRulesReview", "io.k8s.api.authorization.v1.SelfSubjectRulesReview"),
    ("*", "DeleteOptions", "io.k8s.apimachinery.pkg.apis.meta.v1.DeleteOptions"),
];

type Defs = serde_json::Map<String, serde_json::Value>;

/// Fields of k8s-pb (Kubernetes 1.34) that k8s-openapi's v1_33 does not have: they have no
/// JSON name to take, and the JSON path would drop them anyway. They are left out of the
/// table, so the decoder skips them like any unknown field. Listing a field that k8s-openapi
/// does have is an error too, so this list cannot go stale silently.
const NOT_IN_OPENAPI: &[&str] = &[
    "io.k8s.api.core.v1.Container.restart_policy_rules",
    "io.k8s.api.core.v1.EnvVarSource.file_key_ref",
    "io.k8s.api.core.v1.EphemeralContainerCommon.restart_policy_rules",
    "io.k8s.api.core.v1.NodeStatus.declared_features",
    "io.k8s.api.core.v1.PodSpec.hostname_override",
    "io.k8s.api.core.v1.PodSpec.workload_ref",
    "io.k8s.api.core.v1.PodStatus.allocated_resources",
    "io.k8s.api.core.v1.PodStatus.extended_resource_claim_status",
    "io.k8s.api.core.v1.PodStatus.resources",
    "io.k8s.api.core.v1.VolumeProjection.pod_certificate",
    "io.k8s.api.storage.v1.CSIDriverSpec.service_account_token_in_secrets",
];

/// Go `*string` fields whose empty value means something ("" storage class: no dynamic
/// provisioning). Every other optional string reads an empty value as unset, as Go does for
/// its (non-pointer, omitempty) string fields, which its marshaler writes even when empty.
const EMPTY_STRING_KEPT: &[&str] = &["io.k8s.api.core.v1.PersistentVolumeClaimSpec.storage_class_name"];

#[derive(Debug, Clone)]
enum Label {
    Optional,
    Repeated,
    Map,
}

#[derive(Debug, Clone)]
enum Kind {
    String,
    Bool,
    Int32,
    Int64,
    Double,
    Bytes,
    /// Full name of the referenced message.
    Message(String),
}

#[derive(Debug, Clone)]
struct PbField {
    number: u32,
    name: String,
    label: Label,
    kind: Kind,
}

/// OpenAPI definitions of every type reachable from the request-body kinds.
fn openapi_definitions() -> serde_json::Map<String, serde_json::Value> {
    use k8s_openapi::api::{apps, authentication, authorization, autoscaling, batch, certificates, coordination, core, discovery, policy, rbac, storage};
    use k8s_openapi::apimachinery::pkg::apis::meta;
    let mut generator = schemars::generate::SchemaSettings::openapi3().into_generator();
    macro_rules! add {
        ($($ty:ty),* $(,)?) => { $( generator.subschema_for::<$ty>(); )* };
    }
    add!(
        core::v1::Namespace, core::v1::Node, core::v1::Pod, core::v1::Service, core::v1::Endpoints,
        core::v1::ConfigMap, core::v1::Secret, core::v1::ServiceAccount, core::v1::Event,
        core::v1::PersistentVolume, core::v1::PersistentVolumeClaim, core::v1::Binding,
        discovery::v1::EndpointSlice, coordination::v1::Lease, storage::v1::StorageClass,
        storage::v1::CSIDriver, storage::v1::CSINode, storage::v1::VolumeAttachment, storage::v1::CSIStorageCapacity,
        apps::v1::Deployment, apps::v1::ReplicaSet, apps::v1::DaemonSet, apps::v1::StatefulSet,
        apps::v1::ControllerRevision, batch::v1::Job, batch::v1::CronJob, policy::v1::PodDisruptionBudget,
        autoscaling::v1::Scale,
        policy::v1::Eviction, meta::v1::DeleteOptions, authentication::v1::TokenRequest,
        authorization::v1::SelfSubjectAccessReview, authorization::v1::SelfSubjectRulesReview,
        rbac::v1::ClusterRole, rbac::v1::ClusterRoleBinding, rbac::v1::Role, rbac::v1::RoleBinding,
        certificates::v1::CertificateSigningRequest,
    );
    generator.take_definitions(true)
}

fn k8s_pb_src() -> anyhow::Result<PathBuf> {
    let out = std::process::Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .args(["metadata", "--format-version", "1", "--offline"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .context("running cargo metadata")?;
    if !out.status.success() {
        bail!("cargo metadata failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    let pkg = meta["packages"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| p["name"] == "k8s-pb")
        .ok_or_else(|| anyhow!("k8s-pb is not in the dependency graph (it is a dev-dependency of ferro-control-plane)"))?;
    let manifest = pkg["manifest_path"].as_str().ok_or_else(|| anyhow!("no manifest_path for k8s-pb"))?;
    Ok(Path::new(manifest).parent().ok_or_else(|| anyhow!("bad manifest path"))?.join("src"))
}

/// Every `mod.rs` under `src`, with its module path ("api::core::v1" -> ["api","core","v1"]).
fn module_files(src: &Path) -> anyhow::Result<Vec<(Vec<String>, PathBuf)>> {
    let mut out = Vec::new();
    let mut stack = vec![src.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))? {
            let p = e?.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.file_name().is_some_and(|n| n == "mod.rs") {
                let rel = p.parent().and_then(|d| d.strip_prefix(src).ok()).ok_or_else(|| anyhow!("bad path"))?;
                let module: Vec<String> = rel.iter().map(|s| s.to_string_lossy().into_owned()).collect();
                out.push((module, p));
            }
        }
    }
    out.sort();
    Ok(out)
}

/// The innermost type of `Option<..>`, `Vec<..>`, `Box<..>` or the value of `BTreeMap<K, ..>`.
fn inner_path(ty: &syn::Type) -> Option<&syn::Path> {
    let syn::Type::Path(tp) = ty else { return None };
    let last = tp.path.segments.last()?;
    let wrapper = matches!(last.ident.to_string().as_str(), "Option" | "Vec" | "Box" | "BTreeMap" | "HashMap");
    if !wrapper {
        return Some(&tp.path);
    }
    let syn::PathArguments::AngleBracketed(args) = &last.arguments else { return None };
    let ty = args.args.iter().filter_map(|a| if let syn::GenericArgument::Type(t) = a { Some(t) } else { None }).last()?;
    inner_path(ty)
}

/// Resolves a (possibly `super::`-relative) type path seen in module `module` to its full name
/// "io.k8s.<module path>.<Type>".
fn resolve(module: &[String], path: &syn::Path) -> String {
    let mut full: Vec<String> = vec!["io".into(), "k8s".into()];
    let mut base: Vec<String> = module.to_vec();
    let mut segs = path.segments.iter().map(|s| s.ident.to_string()).peekable();
    while segs.peek().is_some_and(|s| s == "super") {
        segs.next();
        base.pop();
    }
    full.extend(base);
    full.extend(segs);
    full.join(".")
}

fn scalar(name: &str) -> Option<Kind> {
    Some(match name {
        "string" => Kind::String,
        "bool" => Kind::Bool,
        "int32" => Kind::Int32,
        "int64" => Kind::Int64,
        "double" => Kind::Double,
        "bytes" => Kind::Bytes,
        _ => return None,
    })
}

fn parse_field(module: &[String], msg: &str, field: &syn::Field) -> anyhow::Result<Option<PbField>> {
    let Some(attr) = field.attrs.iter().find(|a| a.path().is_ident("prost")) else { return Ok(None) };
    let name = field.ident.as_ref().ok_or_else(|| anyhow!("{msg}: unnamed field"))?.to_string();
    let name = name.trim_start_matches("r#").to_string();
    let metas = attr.parse_args_with(Punctuated::<Meta, Token![,]>::parse_terminated)?;
    let (mut number, mut label, mut kind) = (None, Label::Optional, None);
    for m in metas {
        let key = m.path().get_ident().map(|i| i.to_string()).unwrap_or_default();
        let value = match &m {
            Meta::NameValue(nv) => match &nv.value {
                Expr::Lit(l) => match &l.lit {
                    Lit::Str(s) => Some(s.value()),
                    _ => None,
                },
                _ => None,
            },
            _ => None,
        };
        match (key.as_str(), value) {
            ("tag", Some(v)) => number = Some(v.parse::<u32>()?),
            ("optional" | "boxed" | "packed", _) => {}
            ("repeated", None) => label = Label::Repeated,
            ("message", None) => kind = Some(Kind::Message(String::new())),
            ("bytes", _) => kind = Some(Kind::Bytes),
            ("btree_map" | "hash_map", Some(v)) => {
                label = Label::Map;
                let (k, val) = v.split_once(',').ok_or_else(|| anyhow!("{msg}.{name}: map {v:?}"))?;
                if k.trim() != "string" {
                    bail!("{msg}.{name}: map key {k:?} is not a string");
                }
                kind = Some(match val.trim() {
                    "message" => Kind::Message(String::new()),
                    s => scalar(s).ok_or_else(|| anyhow!("{msg}.{name}: map value type {s:?}"))?,
                });
            }
            (s, None) if scalar(s).is_some() => kind = scalar(s),
            (other, _) => bail!("{msg}.{name}: unsupported prost attribute {other:?}"),
        }
    }
    let number = number.ok_or_else(|| anyhow!("{msg}.{name}: no tag"))?;
    let mut kind = kind.ok_or_else(|| anyhow!("{msg}.{name}: no type"))?;
    if let Kind::Message(m) = &mut kind {
        let path = inner_path(&field.ty).ok_or_else(|| anyhow!("{msg}.{name}: cannot read the message type"))?;
        *m = resolve(module, path);
    }
    Ok(Some(PbField { number, name, label, kind }))
}

fn parse_messages(src: &Path) -> anyhow::Result<HashMap<String, Vec<PbField>>> {
    let mut messages = HashMap::new();
    for (module, file) in module_files(src)? {
        let text = std::fs::read_to_string(&file)?;
        let ast = syn::parse_file(&text).with_context(|| format!("parsing {}", file.display()))?;
        for item in ast.items {
            let syn::Item::Struct(s) = item else { continue };
            let mut full = vec!["io".to_string(), "k8s".to_string()];
            full.extend(module.iter().cloned());
            full.push(s.ident.to_string());
            let full = full.join(".");
            let mut fields = Vec::new();
            for f in &s.fields {
                if let Some(pf) = parse_field(&module, &full, f)? {
                    fields.push(pf);
                }
            }
            fields.sort_by_key(|f| f.number);
            messages.insert(full, fields);
        }
    }
    Ok(messages)
}

fn squash(s: &str) -> String {
    s.chars().filter(|c| *c != '_').flat_map(char::to_lowercase).collect()
}

/// The JSON property names of message `m` in k8s-openapi. prost's message names lose the Go
/// acronyms (`SeLinuxOptions` for `SELinuxOptions`), so names match case-insensitively.
fn properties(defs: &Defs, m: &str) -> Option<Vec<String>> {
    let def = defs.get(m).or_else(|| defs.iter().find(|(k, _)| k.eq_ignore_ascii_case(m)).map(|(_, v)| v))?;
    Some(def.get("properties")?.as_object()?.keys().cloned().collect())
}

fn listed(m: &str, f: &PbField) -> bool {
    NOT_IN_OPENAPI.contains(&format!("{m}.{}", f.name).as_str())
}

/// Whether message `sub` can be a Go embedded struct inlined into a message with properties
/// `props`: each of its fields matches a property (or is itself inlined, or listed).
fn inlines(sub: &str, props: &[String], messages: &HashMap<String, Vec<PbField>>, depth: usize) -> bool {
    let Some(fields) = messages.get(sub) else { return false };
    depth < 4
        && !fields.is_empty()
        && fields.iter().all(|f| {
            listed(sub, f)
                || props.iter().any(|p| squash(p) == squash(&f.name))
                || matches!(&f.kind, Kind::Message(s) if inlines(s, props, messages, depth + 1))
        })
}

/// The JSON name of field `f` of message `m`: Some("") for a Go embedded struct whose fields
/// are inlined into the parent (`ProbeHandler` in `Probe`), None for a field listed in
/// [`NOT_IN_OPENAPI`]; an error for anything else that does not match exactly one property.
fn json_name(props: &[String], m: &str, f: &PbField, messages: &HashMap<String, Vec<PbField>>) -> Result<Option<String>, String> {
    let matches: Vec<&String> = props.iter().filter(|p| squash(p) == squash(&f.name)).collect();
    match (matches.as_slice(), listed(m, f)) {
        ([one], false) => Ok(Some(one.to_string())),
        ([_], true) => Err(format!("{m}.{} is listed in NOT_IN_OPENAPI but k8s-openapi has it", f.name)),
        ([], true) => Ok(None),
        ([], false) => match &f.kind {
            Kind::Message(sub) if inlines(sub, props, messages, 0) => Ok(Some(String::new())),
            _ => Err(format!("{m}.{} (field {}): no JSON property matches; properties: {props:?}", f.name, f.number)),
        },
        (many, _) => Err(format!("{m}.{}: ambiguous JSON properties {many:?}", f.name)),
    }
}

fn roots() -> Vec<(String, String, String)> {
    let mut out: Vec<(String, String, String)> = RESOURCES
        .iter()
        // Served from CustomResourceDefinitions upstream: JSON only, no protobuf message.
        // CustomResourceDefinitions: JSON only here (their clients send JSON).
        .filter(|r| !matches!(r.group, "snapshot.storage.k8s.io" | "apiextensions.k8s.io"))
        .map(|r| {
            let pkg = if r.group.is_empty() { "core" } else { r.group.split('.').next().unwrap_or(r.group) };
            (r.api_version(), r.kind.to_string(), format!("io.k8s.api.{pkg}.{}.{}", r.version, r.kind))
        })
        .collect();
    out.extend(EXTRA_ROOTS.iter().map(|(a, k, m)| (a.to_string(), k.to_string(), m.to_string())));
    out
}

fn generate() -> anyhow::Result<String> {
    let src = k8s_pb_src()?;
    let messages = parse_messages(&src)?;
    let defs = openapi_definitions();
    let roots = roots();
    let well_known: HashMap<&str, &str> = WELL_KNOWN.iter().copied().collect();

    // Reachable messages, breadth first from the roots; indices in discovery order.
    let mut order: Vec<String> = Vec::new();
    let mut seen: BTreeSet<String> = BTreeSet::new();
    let mut queue: VecDeque<String> = roots.iter().map(|r| r.2.clone()).collect();
    let mut errors: Vec<String> = Vec::new();
    while let Some(m) = queue.pop_front() {
        if !seen.insert(m.clone()) {
            continue;
        }
        let Some(fields) = messages.get(&m) else {
            errors.push(format!("message {m} is not in k8s-pb"));
            continue;
        };
        order.push(m.clone());
        if well_known.contains_key(m.as_str()) {
            continue;
        }
        for f in fields.iter().filter(|f| !listed(&m, f)) {
            if let Kind::Message(sub) = &f.kind {
                queue.push_back(sub.clone());
            }
        }
    }
    let index: HashMap<&str, usize> = order.iter().enumerate().map(|(i, m)| (m.as_str(), i)).collect();

    let mut inline_props: HashMap<String, Vec<String>> = HashMap::new();
    let mut kept = 0;
    let mut out = String::new();
    out.push_str(
        "// @generated by control-plane/examples/gen-protobuf-schema.rs from the k8s-pb prost structs\n\
         // (field numbers and types) and the k8s-openapi schemas (JSON names). Do not edit; regenerate:\n\
         //     cargo run -p ferro-control-plane --example gen-protobuf-schema\n\n\
         use super::decode::{Field, Kind, Label, Message, Root, WellKnown};\n\n",
    );
    writeln!(out, "/// Request-body kinds: (apiVersion, kind) -> index into [`MESSAGES`] (\"*\": any apiVersion).")?;
    writeln!(out, "pub static ROOTS: &[Root] = &[")?;
    for (api_version, kind, m) in &roots {
        if let Some(i) = index.get(m.as_str()) {
            writeln!(out, "    Root {{ api_version: {api_version:?}, kind: {kind:?}, message: {i} }},")?;
        }
    }
    writeln!(out, "];\n")?;
    writeln!(out, "pub static MESSAGES: &[Message] = &[")?;
    for (i, m) in order.iter().enumerate() {
        let wk = well_known.get(m.as_str()).copied().unwrap_or("None");
        writeln!(out, "    // {i}")?;
        if wk != "None" {
            writeln!(out, "    Message {{ name: {m:?}, well_known: WellKnown::{wk}, fields: &[] }},")?;
            continue;
        }
        // A message without a schema of its own is a Go embedded struct: its JSON names are
        // those of the message it is inlined into.
        let props = match properties(&defs, m).or_else(|| inline_props.get(m).cloned()) {
            Some(p) => p,
            None => {
                errors.push(format!("{m}: no object schema in k8s-openapi"));
                continue;
            }
        };
        writeln!(out, "    Message {{ name: {m:?}, well_known: WellKnown::None, fields: &[")?;
        for f in &messages[m] {
            let json = match json_name(&props, m, f, &messages) {
                Ok(Some(j)) => j,
                Ok(None) => continue, // listed in NOT_IN_OPENAPI
                Err(e) => {
                    errors.push(e);
                    continue;
                }
            };
            let label = if json.is_empty() { "Inline".to_string() } else { format!("{:?}", f.label) };
            if let (true, Kind::Message(sub)) = (json.is_empty(), &f.kind) {
                inline_props.entry(sub.clone()).or_default().extend(props.iter().cloned());
            }
            let kind = match &f.kind {
                Kind::Message(sub) => match index.get(sub.as_str()) {
                    Some(i) => format!("Kind::Message({i})"),
                    None => {
                        errors.push(format!("{m}.{}: message {sub} is not in the table", f.name));
                        continue;
                    }
                },
                Kind::String if EMPTY_STRING_KEPT.contains(&format!("{m}.{}", f.name).as_str()) => {
                    kept += 1;
                    "Kind::StringKeepEmpty".to_string()
                }
                k => format!("Kind::{k:?}"),
            };
            writeln!(out, "        Field {{ number: {}, json: {json:?}, label: Label::{label}, kind: {kind} }},", f.number)?;
        }
        writeln!(out, "    ] }},")?;
    }
    writeln!(out, "];")?;
    if kept != EMPTY_STRING_KEPT.len() {
        errors.push(format!("EMPTY_STRING_KEPT names {} fields, {kept} were found", EMPTY_STRING_KEPT.len()));
    }
    if !errors.is_empty() {
        bail!("cannot generate the protobuf schema:\n  {}", errors.join("\n  "));
    }
    Ok(out)
}

fn main() -> anyhow::Result<()> {
    let check = std::env::args().any(|a| a == "--check");
    let target = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/protobuf/schema.rs");
    let text = generate()?;
    if check {
        let current = std::fs::read_to_string(&target).unwrap_or_default();
        if current != text {
            bail!("{} is out of date; run the generator", target.display());
        }
        println!("{} is up to date", target.display());
        return Ok(());
    }
    std::fs::write(&target, &text).with_context(|| format!("writing {}", target.display()))?;
    println!("wrote {} ({} lines)", target.display(), text.lines().count());
    Ok(())
}
