//! Request bodies in `application/vnd.kubernetes.protobuf`, as kubectl's typed clients send
//! them: the 4-byte magic "k8s\0" and a `runtime.Unknown` envelope {1 typeMeta {1 apiVersion,
//! 2 kind}, 2 raw, 3 contentEncoding, 4 contentType} whose `raw` is the object's message.
//! The object is decoded into the JSON an upstream server would hold for it, so the rest of
//! the request takes the JSON path. Responses are never protobuf.

pub mod decode;
#[rustfmt::skip]
mod schema;

use serde_json::Value;

use decode::{Reader, Wire};

/// The media type.
pub const MEDIA_TYPE: &str = "application/vnd.kubernetes.protobuf";

/// The prefix of every Kubernetes protobuf body.
pub const MAGIC: [u8; 4] = [0x6b, 0x38, 0x73, 0x00];

#[derive(Debug, thiserror::Error)]
pub enum ProtobufError {
    #[error("provided data does not appear to be a protobuf message, expected prefix {MAGIC:?}")]
    NoMagic,
    #[error("the protobuf body is truncated")]
    Truncated,
    #[error("malformed protobuf body: {0}")]
    Malformed(String),
    #[error("malformed protobuf body: {message}.{field} has wire type {got}, expected {want}")]
    WireType { message: &'static str, field: &'static str, got: &'static str, want: String },
    #[error("no kind {kind:?} is registered for version {api_version:?} in protobuf request bodies")]
    UnknownKind { api_version: String, kind: String },
    #[error("unsupported contentEncoding {0:?} in the protobuf envelope")]
    ContentEncoding(String),
    #[error("unsupported contentType {0:?} in the protobuf envelope")]
    ContentType(String),
    #[error("the protobuf body decodes to a non-object")]
    NotAnObject,
}

fn utf8(b: &[u8], what: &str) -> Result<String, ProtobufError> {
    String::from_utf8(b.to_vec()).map_err(|_| ProtobufError::Malformed(format!("{what} is not UTF-8")))
}

fn bytes_of<'a>(w: Wire<'a>, what: &str) -> Result<&'a [u8], ProtobufError> {
    match w {
        Wire::Bytes(b) => Ok(b),
        _ => Err(ProtobufError::Malformed(format!("{what} is not length-delimited"))),
    }
}

/// The envelope of a body, as sent.
#[derive(Debug, Default)]
struct Envelope<'a> {
    api_version: String,
    kind: String,
    raw: &'a [u8],
    content_encoding: String,
    content_type: String,
}

fn envelope(body: &[u8]) -> Result<Envelope<'_>, ProtobufError> {
    let rest = body.strip_prefix(&MAGIC[..]).ok_or(ProtobufError::NoMagic)?;
    let mut env = Envelope::default();
    let mut r = Reader::new(rest);
    while let Some((n, w)) = r.next_field()? {
        match n {
            1 => {
                let mut tm = Reader::new(bytes_of(w, "typeMeta")?);
                while let Some((n, w)) = tm.next_field()? {
                    match n {
                        1 => env.api_version = utf8(bytes_of(w, "typeMeta.apiVersion")?, "apiVersion")?,
                        2 => env.kind = utf8(bytes_of(w, "typeMeta.kind")?, "kind")?,
                        _ => {}
                    }
                }
            }
            2 => env.raw = bytes_of(w, "raw")?,
            3 => env.content_encoding = utf8(bytes_of(w, "contentEncoding")?, "contentEncoding")?,
            4 => env.content_type = utf8(bytes_of(w, "contentType")?, "contentType")?,
            _ => {}
        }
    }
    Ok(env)
}

/// Decodes a protobuf request body into the object's JSON, with apiVersion and kind set from
/// the envelope.
pub fn decode_body(body: &[u8]) -> Result<Value, ProtobufError> {
    let env = envelope(body)?;
    if !env.content_encoding.is_empty() {
        return Err(ProtobufError::ContentEncoding(env.content_encoding));
    }
    if !env.content_type.is_empty() && env.content_type != MEDIA_TYPE {
        return Err(ProtobufError::ContentType(env.content_type));
    }
    let root = schema::ROOTS
        .iter()
        .find(|r| r.kind == env.kind && (r.api_version == env.api_version || r.api_version == "*"))
        .ok_or_else(|| ProtobufError::UnknownKind { api_version: env.api_version.clone(), kind: env.kind.clone() })?;
    let mut v = decode::decode_message(root.message, env.raw, 0)?;
    let obj = v.as_object_mut().ok_or(ProtobufError::NotAnObject)?;
    obj.insert("apiVersion".into(), Value::String(env.api_version));
    obj.insert("kind".into(), Value::String(env.kind));
    Ok(v)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;
