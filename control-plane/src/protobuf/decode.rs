//! A protobuf wire-format decoder driven by the static schema of [`super::schema`], producing
//! the JSON an upstream API server would produce for the same object.
//!
//! Proto2 semantics: a field present on the wire is emitted, also when zero (the Go marshalers
//! write a pointer field only when it is set: `replicas: 0`, `runAsUser: 0` and
//! `automountServiceAccountToken: false` are meant), and a present empty sub-message becomes
//! `{}`. One exception: an empty optional string is unset. Go writes its non-pointer string
//! fields even when empty (`generateName`, `restartPolicy`, `sessionAffinity`...) and reads
//! them back as unset, so upstream's JSON omits them and its defaulting fills them in; the few
//! `*string` fields where "" has a meaning are [`Kind::StringKeepEmpty`].
//! Unknown field numbers are skipped, as the Go unmarshalers do.

use base64::Engine as _;
use serde_json::{Map, Number, Value};

use super::ProtobufError;

/// How often a field occurs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Label {
    Optional,
    Repeated,
    /// `map<string, kind>`: repeated entries {1: key, 2: value}.
    Map,
    /// A Go embedded struct (`json:",inline"`): the sub-message's fields belong to the parent.
    Inline,
}

/// The value type of a field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// An empty value of an optional (non-repeated, non-map) field is unset.
    String,
    /// A Go `*string` whose empty value is kept.
    StringKeepEmpty,
    Bool,
    Int32,
    Int64,
    Double,
    Bytes,
    /// Index into [`super::schema::MESSAGES`].
    Message(usize),
}

/// apimachinery types with a JSON form of their own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WellKnown {
    None,
    /// meta/v1 Time {1 seconds, 2 nanos}: RFC 3339 with second precision; empty: null.
    Time,
    /// meta/v1 MicroTime: RFC 3339 with six fractional digits; empty: null.
    MicroTime,
    /// meta/v1 Duration {1 nanoseconds}: a Go duration string ("1m30s").
    Duration,
    /// meta/v1 FieldsV1 {1 raw}: the raw JSON.
    FieldsV1,
    /// api/resource Quantity {1 string}: the string.
    Quantity,
    /// util/intstr IntOrString {1 type, 2 intVal, 3 strVal}: a number or a string.
    IntOrString,
    /// runtime RawExtension {1 raw}: the raw JSON.
    RawExtension,
    /// A message that only wraps `repeated string items = 1` (authentication's and
    /// certificates' ExtraValue): a JSON array of strings.
    StringList,
}

#[derive(Debug)]
pub struct Field {
    pub number: u32,
    pub json: &'static str,
    pub label: Label,
    pub kind: Kind,
}

#[derive(Debug)]
pub struct Message {
    pub name: &'static str,
    pub well_known: WellKnown,
    /// Sorted by number.
    pub fields: &'static [Field],
}

/// A kind accepted as a request body.
#[derive(Debug)]
pub struct Root {
    /// "*" matches any apiVersion.
    pub api_version: &'static str,
    pub kind: &'static str,
    pub message: usize,
}

/// Nesting deeper than this is refused. The served kinds' schema is not recursive today, so
/// this only guards against a future recursive message (JSONSchemaProps) exhausting the stack.
const MAX_DEPTH: usize = 64;

/// One field as read from the wire.
#[derive(Debug, Clone, Copy)]
pub enum Wire<'a> {
    Varint(u64),
    Fixed64(u64),
    Bytes(&'a [u8]),
    Fixed32(u32),
}

impl Wire<'_> {
    fn type_name(&self) -> &'static str {
        match self {
            Wire::Varint(_) => "varint",
            Wire::Fixed64(_) => "64-bit",
            Wire::Bytes(_) => "length-delimited",
            Wire::Fixed32(_) => "32-bit",
        }
    }
}

/// Iterates over the fields of one encoded message.
pub struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        Reader { buf }
    }

    fn varint(&mut self) -> Result<u64, ProtobufError> {
        let mut v: u64 = 0;
        for i in 0..10 {
            let (&b, rest) = self.buf.split_first().ok_or(ProtobufError::Truncated)?;
            self.buf = rest;
            if i == 9 && b > 1 {
                return Err(ProtobufError::Malformed("varint overflows 64 bits".into()));
            }
            v |= u64::from(b & 0x7f) << (7 * i);
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(ProtobufError::Malformed("varint longer than 10 bytes".into()))
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], ProtobufError> {
        if n > self.buf.len() {
            return Err(ProtobufError::Truncated);
        }
        let (head, rest) = self.buf.split_at(n);
        self.buf = rest;
        Ok(head)
    }

    fn fixed<const N: usize>(&mut self) -> Result<[u8; N], ProtobufError> {
        let b = self.take(N)?;
        let mut a = [0u8; N];
        a.copy_from_slice(b);
        Ok(a)
    }

    /// The next (field number, value), or None at the end of the message.
    pub fn next_field(&mut self) -> Result<Option<(u32, Wire<'a>)>, ProtobufError> {
        if self.buf.is_empty() {
            return Ok(None);
        }
        let key = self.varint()?;
        let number = u32::try_from(key >> 3).map_err(|_| ProtobufError::Malformed(format!("field number {} out of range", key >> 3)))?;
        if number == 0 {
            return Err(ProtobufError::Malformed("field number 0".into()));
        }
        let wire = match key & 7 {
            0 => Wire::Varint(self.varint()?),
            1 => Wire::Fixed64(u64::from_le_bytes(self.fixed::<8>()?)),
            2 => {
                let len = usize::try_from(self.varint()?).map_err(|_| ProtobufError::Truncated)?;
                Wire::Bytes(self.take(len)?)
            }
            5 => Wire::Fixed32(u32::from_le_bytes(self.fixed::<4>()?)),
            t => return Err(ProtobufError::Malformed(format!("field {number}: unsupported wire type {t}"))),
        };
        Ok(Some((number, wire)))
    }
}

fn messages() -> &'static [Message] {
    super::schema::MESSAGES
}

fn message(index: usize) -> Result<&'static Message, ProtobufError> {
    messages().get(index).ok_or_else(|| ProtobufError::Malformed(format!("schema has no message {index}")))
}

fn wrong_type(msg: &Message, field: &Field, got: &Wire<'_>, want: &str) -> ProtobufError {
    ProtobufError::WireType { message: msg.name, field: field.json, got: got.type_name(), want: want.to_string() }
}

/// Decodes one scalar (or a whole sub-message) of `field`.
fn value(msg: &Message, field: &Field, w: Wire<'_>, depth: usize) -> Result<Value, ProtobufError> {
    Ok(match (field.kind, w) {
        (Kind::String | Kind::StringKeepEmpty, Wire::Bytes(b)) => Value::String(
            String::from_utf8(b.to_vec())
                .map_err(|_| ProtobufError::Malformed(format!("{}.{}: string is not UTF-8", msg.name, field.json)))?,
        ),
        (Kind::Bytes, Wire::Bytes(b)) => Value::String(base64::engine::general_purpose::STANDARD.encode(b)),
        (Kind::Message(i), Wire::Bytes(b)) => decode_message(i, b, depth + 1)?,
        (Kind::Bool, Wire::Varint(v)) => Value::Bool(v != 0),
        // int32 is sign-extended to 64 bits on the wire; truncation is the proto rule.
        (Kind::Int32, Wire::Varint(v)) => Value::from(v as i64 as i32),
        (Kind::Int64, Wire::Varint(v)) => Value::from(v as i64),
        (Kind::Double, Wire::Fixed64(v)) => Number::from_f64(f64::from_bits(v))
            .map(Value::Number)
            .ok_or_else(|| ProtobufError::Malformed(format!("{}.{}: not a finite number", msg.name, field.json)))?,
        (Kind::String | Kind::StringKeepEmpty | Kind::Bytes | Kind::Message(_), w) => return Err(wrong_type(msg, field, &w, "length-delimited")),
        (Kind::Bool | Kind::Int32 | Kind::Int64, w) => return Err(wrong_type(msg, field, &w, "varint")),
        (Kind::Double, w) => return Err(wrong_type(msg, field, &w, "64-bit")),
    })
}

/// A packed run of scalars (repeated int32/int64/bool/double sent as one length-delimited field).
fn packed(msg: &Message, field: &Field, b: &[u8], out: &mut Vec<Value>) -> Result<(), ProtobufError> {
    let mut r = Reader::new(b);
    while !r.buf.is_empty() {
        let w = match field.kind {
            Kind::Double => Wire::Fixed64(u64::from_le_bytes(r.fixed::<8>()?)),
            _ => Wire::Varint(r.varint()?),
        };
        out.push(value(msg, field, w, 0)?);
    }
    Ok(())
}

fn map_entry(msg: &Message, field: &Field, b: &[u8], depth: usize) -> Result<(String, Value), ProtobufError> {
    let mut r = Reader::new(b);
    let (mut key, mut val) = (String::new(), None);
    while let Some((n, w)) = r.next_field()? {
        match (n, w) {
            (1, Wire::Bytes(k)) => {
                key = String::from_utf8(k.to_vec())
                    .map_err(|_| ProtobufError::Malformed(format!("{}.{}: map key is not UTF-8", msg.name, field.json)))?;
            }
            (1, w) => return Err(wrong_type(msg, field, &w, "length-delimited (map key)")),
            (2, w) => val = Some(value(msg, field, w, depth)?),
            _ => {}
        }
    }
    let val = match val {
        Some(v) => v,
        // An absent value is the zero value of its type.
        None => match field.kind {
            Kind::String | Kind::StringKeepEmpty | Kind::Bytes => Value::String(String::new()),
            Kind::Bool => Value::Bool(false),
            Kind::Int32 | Kind::Int64 => Value::from(0),
            Kind::Double => Value::from(0.0),
            Kind::Message(i) => decode_message(i, &[], depth + 1)?,
        },
    };
    Ok((key, val))
}

/// Decodes an encoded message of schema index `index` into its JSON form.
pub fn decode_message(index: usize, buf: &[u8], depth: usize) -> Result<Value, ProtobufError> {
    if depth > MAX_DEPTH {
        return Err(ProtobufError::Malformed(format!("messages nested deeper than {MAX_DEPTH}")));
    }
    let msg = message(index)?;
    if msg.well_known != WellKnown::None {
        return well_known(msg, buf);
    }
    let mut obj = Map::new();
    let mut r = Reader::new(buf);
    while let Some((number, w)) = r.next_field()? {
        let Ok(pos) = msg.fields.binary_search_by_key(&number, |f| f.number) else {
            continue; // unknown field: skipped, as upstream does
        };
        let field = &msg.fields[pos];
        match field.label {
            Label::Optional => {
                let v = value(msg, field, w, depth)?;
                // A zero Time is marshalled as an empty message and reads back as null; an
                // empty string is Go's unset non-pointer string.
                let unset = v.is_null() || (field.kind == Kind::String && v.as_str() == Some(""));
                if unset {
                    obj.remove(field.json);
                } else {
                    obj.insert(field.json.to_string(), v);
                }
            }
            Label::Repeated => {
                let slot = obj.entry(field.json).or_insert_with(|| Value::Array(Vec::new()));
                let Value::Array(items) = slot else { continue };
                match (field.kind, w) {
                    (Kind::Int32 | Kind::Int64 | Kind::Bool | Kind::Double, Wire::Bytes(b)) => packed(msg, field, b, items)?,
                    _ => items.push(value(msg, field, w, depth)?),
                }
            }
            Label::Inline => {
                if let Value::Object(sub) = value(msg, field, w, depth)? {
                    obj.extend(sub);
                }
            }
            Label::Map => {
                let Wire::Bytes(b) = w else { return Err(wrong_type(msg, field, &w, "length-delimited (map entry)")) };
                let (k, v) = map_entry(msg, field, b, depth)?;
                let slot = obj.entry(field.json).or_insert_with(|| Value::Object(Map::new()));
                if let Value::Object(m) = slot {
                    m.insert(k, v);
                }
            }
        }
    }
    Ok(Value::Object(obj))
}

/// The fields of a well-known message by number (last occurrence wins).
fn fields_by_number(buf: &[u8]) -> Result<Vec<(u32, Wire<'_>)>, ProtobufError> {
    let mut r = Reader::new(buf);
    let mut out: Vec<(u32, Wire<'_>)> = Vec::new();
    while let Some((n, w)) = r.next_field()? {
        out.retain(|(m, _)| *m != n);
        out.push((n, w));
    }
    Ok(out)
}

fn wk_int(msg: &Message, fields: &[(u32, Wire<'_>)], n: u32) -> Result<Option<i64>, ProtobufError> {
    match fields.iter().find(|(m, _)| *m == n) {
        None => Ok(None),
        Some((_, Wire::Varint(v))) => Ok(Some(*v as i64)),
        Some((_, w)) => Err(ProtobufError::Malformed(format!("{}: field {n} is {}, expected varint", msg.name, w.type_name()))),
    }
}

fn wk_bytes<'a>(msg: &Message, fields: &[(u32, Wire<'a>)], n: u32) -> Result<Option<&'a [u8]>, ProtobufError> {
    match fields.iter().find(|(m, _)| *m == n) {
        None => Ok(None),
        Some((_, Wire::Bytes(b))) => Ok(Some(b)),
        Some((_, w)) => Err(ProtobufError::Malformed(format!("{}: field {n} is {}, expected length-delimited", msg.name, w.type_name()))),
    }
}

fn wk_string(msg: &Message, fields: &[(u32, Wire<'_>)], n: u32) -> Result<String, ProtobufError> {
    let b = wk_bytes(msg, fields, n)?.unwrap_or_default();
    String::from_utf8(b.to_vec()).map_err(|_| ProtobufError::Malformed(format!("{}: field {n} is not UTF-8", msg.name)))
}

fn raw_json(msg: &Message, raw: Option<&[u8]>) -> Result<Value, ProtobufError> {
    match raw {
        None | Some([]) => Ok(Value::Null),
        Some(b) => serde_json::from_slice(b)
            .map_err(|e| ProtobufError::Malformed(format!("{}: raw is not JSON: {e}", msg.name))),
    }
}

fn well_known(msg: &Message, buf: &[u8]) -> Result<Value, ProtobufError> {
    if msg.well_known == WellKnown::StringList {
        let mut r = Reader::new(buf);
        let mut items = Vec::new();
        while let Some((n, w)) = r.next_field()? {
            match (n, w) {
                (1, Wire::Bytes(b)) => items.push(Value::String(
                    String::from_utf8(b.to_vec()).map_err(|_| ProtobufError::Malformed(format!("{}: field 1 is not UTF-8", msg.name)))?,
                )),
                (1, w) => return Err(ProtobufError::Malformed(format!("{}: field 1 is {}, expected length-delimited", msg.name, w.type_name()))),
                _ => {}
            }
        }
        return Ok(Value::Array(items));
    }
    let f = fields_by_number(buf)?;
    Ok(match msg.well_known {
        WellKnown::None => Value::Null,
        WellKnown::Time | WellKnown::MicroTime => {
            // Go's Time.Unmarshal: an empty message is the zero time (JSON null).
            if buf.is_empty() {
                return Ok(Value::Null);
            }
            let seconds = wk_int(msg, &f, 1)?.unwrap_or(0);
            let nanos = wk_int(msg, &f, 2)?.unwrap_or(0) as i32;
            if msg.well_known == WellKnown::Time {
                // upstream keeps whole seconds only
                let ts = jiff::Timestamp::from_second(seconds)
                    .map_err(|e| ProtobufError::Malformed(format!("{}: {e}", msg.name)))?;
                Value::String(ts.strftime("%Y-%m-%dT%H:%M:%SZ").to_string())
            } else {
                let ts = jiff::Timestamp::new(seconds, nanos)
                    .map_err(|e| ProtobufError::Malformed(format!("{}: {e}", msg.name)))?;
                Value::String(ts.strftime("%Y-%m-%dT%H:%M:%S%.6fZ").to_string())
            }
        }
        WellKnown::Duration => Value::String(go_duration(wk_int(msg, &f, 1)?.unwrap_or(0))),
        WellKnown::Quantity => Value::String(wk_string(msg, &f, 1)?),
        WellKnown::IntOrString => match wk_int(msg, &f, 1)?.unwrap_or(0) {
            0 => Value::from(wk_int(msg, &f, 2)?.unwrap_or(0) as i32),
            1 => Value::String(wk_string(msg, &f, 3)?),
            t => return Err(ProtobufError::Malformed(format!("{}: unknown type {t}", msg.name))),
        },
        WellKnown::FieldsV1 | WellKnown::RawExtension => raw_json(msg, wk_bytes(msg, &f, 1)?)?,
        WellKnown::StringList => Value::Null,
    })
}

/// Go's `time.Duration.String()` (the shared crate's, one implementation for every component).
pub fn go_duration(nanos: i64) -> String {
    k8s_semantics::format_go_duration(nanos)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn go_durations() {
        assert_eq!(go_duration(0), "0s");
        assert_eq!(go_duration(90_000_000_000), "1m30s");
        assert_eq!(go_duration(3_600_000_000_000), "1h0m0s");
        assert_eq!(go_duration(1_500_000_000), "1.5s");
        assert_eq!(go_duration(250_000_000), "250ms");
        assert_eq!(go_duration(1_500), "1.5µs");
        assert_eq!(go_duration(7), "7ns");
        assert_eq!(go_duration(-2_000_000_000), "-2s");
        assert_eq!(go_duration(3_661_000_000_001), "1h1m1.000000001s");
    }

    #[test]
    fn varints_and_truncation() {
        let mut r = Reader::new(&[0x08, 0x96, 0x01]);
        let (n, w) = r.next_field().unwrap().unwrap();
        assert_eq!(n, 1);
        assert!(matches!(w, Wire::Varint(150)));
        assert!(r.next_field().unwrap().is_none());
        assert!(matches!(Reader::new(&[0x08, 0x96]).next_field(), Err(ProtobufError::Truncated)));
        assert!(matches!(Reader::new(&[0x0a, 0x05, 0x01]).next_field(), Err(ProtobufError::Truncated)));
        assert!(Reader::new(&[0x0b]).next_field().is_err()); // group wire type
        assert!(Reader::new(&[0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f]).next_field().is_err());
    }
}
