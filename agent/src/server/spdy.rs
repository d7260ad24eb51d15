//! A small SPDY/3.1 client: the framing (draft-mbelshe-httpbis-spdy-00, with 3.1's
//! session-level flow control), the header-block compression, and a connection that reads
//! frames on its own task.
//!
//! It is what the agent needs to talk to a CRI streaming server (containerd's, built on
//! `moby/spdystream`) as the upstream `remotecommand` SPDY client does: open streams with
//! `SYN_STREAM`, wait for their `SYN_REPLY`, move `DATA`, half-close with `FIN`. Server push,
//! priorities and `HEADERS` after the reply are parsed but not used.
//!
//! Flow control: the agent acknowledges what it receives with `WINDOW_UPDATE` (per stream and
//! for the session) and keeps the peer's windows when it sends. spdystream neither sends
//! `WINDOW_UPDATE` nor reads it, so a sender that waited for window updates from it would stall
//! after the first 64 KiB; [`Windows`] therefore enforces the peer's windows only once the peer
//! has shown that it does flow control (a `WINDOW_UPDATE` or an initial window in `SETTINGS`).

use std::collections::HashMap;

use bytes::{Buf as _, BufMut as _, Bytes, BytesMut};
use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress};
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};
use tokio::sync::mpsc;

/// The protocol version this module speaks.
pub const VERSION: u16 = 3;
/// The initial window of a stream and of the session (SPDY/3.1: 64 KiB).
pub const DEFAULT_WINDOW: u32 = 65536;
/// The largest frame payload (24-bit length).
const MAX_LENGTH: usize = 0x00ff_ffff;
/// Data frames the agent sends are cut at this size.
pub const MAX_DATA: usize = 16384;

pub const FLAG_FIN: u8 = 0x01;
pub const FLAG_UNIDIRECTIONAL: u8 = 0x02;

const TYPE_SYN_STREAM: u16 = 1;
const TYPE_SYN_REPLY: u16 = 2;
const TYPE_RST_STREAM: u16 = 3;
const TYPE_SETTINGS: u16 = 4;
const TYPE_PING: u16 = 6;
const TYPE_GOAWAY: u16 = 7;
const TYPE_HEADERS: u16 = 8;
const TYPE_WINDOW_UPDATE: u16 = 9;

/// SETTINGS id of the initial stream window.
pub const SETTINGS_INITIAL_WINDOW_SIZE: u32 = 7;

/// RST_STREAM status codes used here.
pub const RST_CANCEL: u32 = 5;
/// GOAWAY status: OK.
pub const GOAWAY_OK: u32 = 0;

/// The zlib dictionary of SPDY/3 header blocks: length-prefixed header names and values,
/// followed by a run of common tokens ([`dictionary`] assembles it).
const DICTIONARY_WORDS: &[&str] = &[
    "options",
    "head",
    "post",
    "put",
    "delete",
    "trace",
    "accept",
    "accept-charset",
    "accept-encoding",
    "accept-language",
    "accept-ranges",
    "age",
    "allow",
    "authorization",
    "cache-control",
    "connection",
    "content-base",
    "content-encoding",
    "content-language",
    "content-length",
    "content-location",
    "content-md5",
    "content-range",
    "content-type",
    "date",
    "etag",
    "expect",
    "expires",
    "from",
    "host",
    "if-match",
    "if-modified-since",
    "if-none-match",
    "if-range",
    "if-unmodified-since",
    "last-modified",
    "location",
    "max-forwards",
    "pragma",
    "proxy-authenticate",
    "proxy-authorization",
    "range",
    "referer",
    "retry-after",
    "server",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "user-agent",
    "vary",
    "via",
    "warning",
    "www-authenticate",
    "method",
    "get",
    "status",
    "200 OK",
    "version",
    "HTTP/1.1",
    "url",
    "public",
    "set-cookie",
    "keep-alive",
    "origin",
];

const DICTIONARY_TAIL: &str = concat!(
    "100101201202205206300302303304305306307402405406407408409410411412413414415416417502504505",
    "203 Non-Authoritative Information",
    "204 No Content",
    "301 Moved Permanently",
    "400 Bad Request",
    "401 Unauthorized",
    "403 Forbidden",
    "404 Not Found",
    "500 Internal Server Error",
    "501 Not Implemented",
    "503 Service Unavailable",
    "Jan Feb Mar Apr May Jun Jul Aug Sept Oct Nov Dec",
    " 00:00:00",
    " Mon, Tue, Wed, Thu, Fri, Sat, Sun, GMT",
    "chunked,text/html,image/png,image/jpg,image/gif,application/xml,application/xhtml+xml,",
    "text/plain,text/javascript,publicprivatemax-age=gzip,deflate,sdch",
    "charset=utf-8charset=iso-8859-1,utf-,*,enq=0.",
);

/// The SPDY/3 header dictionary (1423 bytes).
pub fn dictionary() -> Vec<u8> {
    let mut d = Vec::with_capacity(1423);
    for w in DICTIONARY_WORDS {
        d.extend_from_slice(&(w.len() as u32).to_be_bytes());
        d.extend_from_slice(w.as_bytes());
    }
    d.extend_from_slice(DICTIONARY_TAIL.as_bytes());
    d
}

#[derive(Debug, thiserror::Error)]
pub enum SpdyError {
    #[error("spdy connection: {0}")]
    Io(#[from] std::io::Error),
    #[error("spdy header block compression: {0}")]
    Compress(String),
    #[error("spdy header block decompression: {0}")]
    Decompress(String),
    #[error("spdy protocol error: {0}")]
    Protocol(String),
}

/// Header name/value pairs (names lower-case; several values of one name are joined with NUL).
pub type Headers = Vec<(String, String)>;

/// A SPDY/3.1 frame.
#[derive(Debug, Clone, PartialEq)]
pub enum Frame {
    Data {
        stream: u32,
        flags: u8,
        data: Bytes,
    },
    SynStream {
        stream: u32,
        associated: u32,
        priority: u8,
        flags: u8,
        headers: Headers,
    },
    SynReply {
        stream: u32,
        flags: u8,
        headers: Headers,
    },
    RstStream {
        stream: u32,
        status: u32,
    },
    /// (flags, id, value) entries.
    Settings {
        flags: u8,
        entries: Vec<(u8, u32, u32)>,
    },
    Ping {
        id: u32,
    },
    GoAway {
        last_good: u32,
        status: u32,
    },
    Headers {
        stream: u32,
        flags: u8,
        headers: Headers,
    },
    WindowUpdate {
        stream: u32,
        delta: u32,
    },
    /// A control frame of a type this module does not know (ignored, as the spec says).
    Unknown {
        kind: u16,
    },
}

/// Compresses header blocks: one zlib stream for the whole connection, primed with the
/// dictionary, each block ending with a sync flush.
pub struct HeaderCompressor(Compress);

impl HeaderCompressor {
    pub fn new() -> Result<Self, SpdyError> {
        let mut c = Compress::new(Compression::default(), true);
        c.set_dictionary(&dictionary()).map_err(|e| SpdyError::Compress(e.to_string()))?;
        Ok(HeaderCompressor(c))
    }

    pub fn compress(&mut self, block: &[u8]) -> Result<Vec<u8>, SpdyError> {
        let mut out = Vec::with_capacity(block.len() + 64);
        let mut pos = 0;
        loop {
            if out.len() == out.capacity() {
                out.reserve(256);
            }
            let before = self.0.total_in();
            self.0
                .compress_vec(&block[pos..], &mut out, FlushCompress::Sync)
                .map_err(|e| SpdyError::Compress(e.to_string()))?;
            pos += (self.0.total_in() - before) as usize;
            // Done when all input is in and the flush left room in the output.
            if pos >= block.len() && out.len() < out.capacity() {
                return Ok(out);
            }
        }
    }
}

/// Decompresses the peer's header blocks (its own zlib stream, primed with the dictionary
/// when the stream asks for it).
pub struct HeaderDecompressor(Decompress);

impl Default for HeaderDecompressor {
    fn default() -> Self {
        HeaderDecompressor(Decompress::new(true))
    }
}

impl HeaderDecompressor {
    pub fn decompress(&mut self, input: &[u8]) -> Result<Vec<u8>, SpdyError> {
        let err = |e: flate2::DecompressError| SpdyError::Decompress(e.to_string());
        let mut out = Vec::with_capacity(input.len() * 4 + 64);
        let mut pos = 0;
        loop {
            if out.len() == out.capacity() {
                out.reserve(out.capacity().max(256));
            }
            let (in_before, out_before) = (self.0.total_in(), out.len());
            let r = self.0.decompress_vec(&input[pos..], &mut out, FlushDecompress::Sync);
            pos += (self.0.total_in() - in_before) as usize;
            match r {
                Ok(_) => {}
                Err(e) if e.needs_dictionary().is_some() => {
                    self.0.set_dictionary(&dictionary()).map_err(err)?;
                    continue;
                }
                Err(e) => return Err(err(e)),
            }
            if pos >= input.len() && out.len() < out.capacity() {
                return Ok(out);
            }
            if pos < input.len()
                && self.0.total_in() == in_before
                && out.len() == out_before
                && out.len() < out.capacity()
            {
                return Err(SpdyError::Decompress("no progress".into()));
            }
        }
    }
}

/// The uncompressed name/value block.
pub fn encode_headers(headers: &Headers) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(&(headers.len() as u32).to_be_bytes());
    for (k, v) in headers {
        b.extend_from_slice(&(k.len() as u32).to_be_bytes());
        b.extend_from_slice(k.to_ascii_lowercase().as_bytes());
        b.extend_from_slice(&(v.len() as u32).to_be_bytes());
        b.extend_from_slice(v.as_bytes());
    }
    b
}

pub fn decode_headers(mut b: &[u8]) -> Result<Headers, SpdyError> {
    let bad = || SpdyError::Protocol("truncated header block".into());
    let string = |b: &mut &[u8]| -> Result<String, SpdyError> {
        if b.len() < 4 {
            return Err(bad());
        }
        let n = b.get_u32() as usize;
        if b.len() < n {
            return Err(bad());
        }
        let s = String::from_utf8_lossy(&b[..n]).into_owned();
        b.advance(n);
        Ok(s)
    };
    if b.len() < 4 {
        return Err(bad());
    }
    let count = b.get_u32() as usize;
    let mut out = Vec::with_capacity(count.min(64));
    for _ in 0..count {
        let k = string(&mut b)?;
        let v = string(&mut b)?;
        out.push((k, v));
    }
    Ok(out)
}

fn control(out: &mut BytesMut, kind: u16, flags: u8, payload: &[u8]) -> Result<(), SpdyError> {
    if payload.len() > MAX_LENGTH {
        return Err(SpdyError::Protocol(format!("frame of {} bytes is too long", payload.len())));
    }
    out.put_u16(0x8000 | VERSION);
    out.put_u16(kind);
    out.put_u32((u32::from(flags) << 24) | payload.len() as u32);
    out.put_slice(payload);
    Ok(())
}

impl Frame {
    /// Appends the frame's bytes to `out`; header blocks go through `zlib`.
    pub fn encode(&self, zlib: &mut HeaderCompressor, out: &mut BytesMut) -> Result<(), SpdyError> {
        let id = |s: u32| s & 0x7fff_ffff;
        match self {
            Frame::Data { stream, flags, data } => {
                if data.len() > MAX_LENGTH {
                    return Err(SpdyError::Protocol(format!("data frame of {} bytes is too long", data.len())));
                }
                out.put_u32(id(*stream));
                out.put_u32((u32::from(*flags) << 24) | data.len() as u32);
                out.put_slice(data);
                Ok(())
            }
            Frame::SynStream { stream, associated, priority, flags, headers } => {
                let block = zlib.compress(&encode_headers(headers))?;
                let mut p = Vec::with_capacity(10 + block.len());
                p.extend_from_slice(&id(*stream).to_be_bytes());
                p.extend_from_slice(&id(*associated).to_be_bytes());
                p.push((priority & 0x07) << 5);
                p.push(0); // slot
                p.extend_from_slice(&block);
                control(out, TYPE_SYN_STREAM, *flags, &p)
            }
            Frame::SynReply { stream, flags, headers } | Frame::Headers { stream, flags, headers } => {
                let kind = if matches!(self, Frame::SynReply { .. }) { TYPE_SYN_REPLY } else { TYPE_HEADERS };
                let block = zlib.compress(&encode_headers(headers))?;
                let mut p = Vec::with_capacity(4 + block.len());
                p.extend_from_slice(&id(*stream).to_be_bytes());
                p.extend_from_slice(&block);
                control(out, kind, *flags, &p)
            }
            Frame::RstStream { stream, status } => {
                let mut p = id(*stream).to_be_bytes().to_vec();
                p.extend_from_slice(&status.to_be_bytes());
                control(out, TYPE_RST_STREAM, 0, &p)
            }
            Frame::Settings { flags, entries } => {
                let mut p = (entries.len() as u32).to_be_bytes().to_vec();
                for (f, i, v) in entries {
                    p.extend_from_slice(&((u32::from(*f) << 24) | (i & 0x00ff_ffff)).to_be_bytes());
                    p.extend_from_slice(&v.to_be_bytes());
                }
                control(out, TYPE_SETTINGS, *flags, &p)
            }
            Frame::Ping { id: ping } => control(out, TYPE_PING, 0, &ping.to_be_bytes()),
            Frame::GoAway { last_good, status } => {
                let mut p = id(*last_good).to_be_bytes().to_vec();
                p.extend_from_slice(&status.to_be_bytes());
                control(out, TYPE_GOAWAY, 0, &p)
            }
            Frame::WindowUpdate { stream, delta } => {
                let mut p = id(*stream).to_be_bytes().to_vec();
                p.extend_from_slice(&(delta & 0x7fff_ffff).to_be_bytes());
                control(out, TYPE_WINDOW_UPDATE, 0, &p)
            }
            Frame::Unknown { kind } => {
                Err(SpdyError::Protocol(format!("cannot encode a frame of unknown type {kind}")))
            }
        }
    }

    /// Takes one whole frame off the front of `buf`; `None` when more bytes are needed.
    pub fn decode(buf: &mut BytesMut, zlib: &mut HeaderDecompressor) -> Result<Option<Frame>, SpdyError> {
        if buf.len() < 8 {
            return Ok(None);
        }
        let len = (u32::from_be_bytes([0, buf[5], buf[6], buf[7]])) as usize;
        if buf.len() < 8 + len {
            return Ok(None);
        }
        let head = buf.split_to(8);
        let mut p = buf.split_to(len).freeze();
        let flags = head[4];
        let word = u32::from_be_bytes([head[0], head[1], head[2], head[3]]);
        if word & 0x8000_0000 == 0 {
            return Ok(Some(Frame::Data { stream: word & 0x7fff_ffff, flags, data: p }));
        }
        let version = ((word >> 16) & 0x7fff) as u16;
        if version != VERSION {
            return Err(SpdyError::Protocol(format!("unsupported version {version}")));
        }
        let kind = (word & 0xffff) as u16;
        let short = |need: usize, p: &Bytes| {
            if p.len() < need {
                Err(SpdyError::Protocol(format!("control frame type {kind} too short ({} bytes)", p.len())))
            } else {
                Ok(())
            }
        };
        let frame = match kind {
            TYPE_SYN_STREAM => {
                short(10, &p)?;
                let stream = p.get_u32() & 0x7fff_ffff;
                let associated = p.get_u32() & 0x7fff_ffff;
                let priority = p.get_u8() >> 5;
                let _slot = p.get_u8();
                let headers = decode_headers(&zlib.decompress(&p)?)?;
                Frame::SynStream { stream, associated, priority, flags, headers }
            }
            TYPE_SYN_REPLY | TYPE_HEADERS => {
                short(4, &p)?;
                let stream = p.get_u32() & 0x7fff_ffff;
                let headers = decode_headers(&zlib.decompress(&p)?)?;
                if kind == TYPE_SYN_REPLY {
                    Frame::SynReply { stream, flags, headers }
                } else {
                    Frame::Headers { stream, flags, headers }
                }
            }
            TYPE_RST_STREAM => {
                short(8, &p)?;
                Frame::RstStream { stream: p.get_u32() & 0x7fff_ffff, status: p.get_u32() }
            }
            TYPE_SETTINGS => {
                short(4, &p)?;
                let n = p.get_u32() as usize;
                short(n.saturating_mul(8), &p)?;
                let entries = (0..n)
                    .map(|_| {
                        let w = p.get_u32();
                        ((w >> 24) as u8, w & 0x00ff_ffff, p.get_u32())
                    })
                    .collect();
                Frame::Settings { flags, entries }
            }
            TYPE_PING => {
                short(4, &p)?;
                Frame::Ping { id: p.get_u32() }
            }
            TYPE_GOAWAY => {
                short(8, &p)?;
                Frame::GoAway { last_good: p.get_u32() & 0x7fff_ffff, status: p.get_u32() }
            }
            TYPE_WINDOW_UPDATE => {
                short(8, &p)?;
                Frame::WindowUpdate { stream: p.get_u32() & 0x7fff_ffff, delta: p.get_u32() & 0x7fff_ffff }
            }
            kind => Frame::Unknown { kind },
        };
        Ok(Some(frame))
    }
}

/// The flow-control windows of one connection, both directions (pure bookkeeping).
#[derive(Debug)]
pub struct Windows {
    /// What the peer lets us send, per stream and for the session.
    send_stream: HashMap<u32, i64>,
    send_session: i64,
    initial_send: i64,
    /// Whether the peer has shown it does flow control (see the module docs).
    enforced: bool,
    /// Received and consumed but not yet acknowledged.
    unacked_stream: HashMap<u32, u32>,
    unacked_session: u32,
}

impl Default for Windows {
    fn default() -> Self {
        Windows {
            send_stream: HashMap::new(),
            send_session: i64::from(DEFAULT_WINDOW),
            initial_send: i64::from(DEFAULT_WINDOW),
            enforced: false,
            unacked_stream: HashMap::new(),
            unacked_session: 0,
        }
    }
}

impl Windows {
    /// How many bytes may be sent on `stream` now.
    pub fn allowance(&self, stream: u32) -> usize {
        if !self.enforced {
            return usize::MAX;
        }
        let s = self.send_stream.get(&stream).copied().unwrap_or(self.initial_send);
        s.min(self.send_session).max(0) as usize
    }

    pub fn sent(&mut self, stream: u32, n: usize) {
        let n = n as i64;
        *self.send_stream.entry(stream).or_insert(self.initial_send) -= n;
        self.send_session -= n;
    }

    pub fn window_update(&mut self, stream: u32, delta: u32) {
        self.enforced = true;
        if stream == 0 {
            self.send_session += i64::from(delta);
        } else {
            *self.send_stream.entry(stream).or_insert(self.initial_send) += i64::from(delta);
        }
    }

    /// SETTINGS_INITIAL_WINDOW_SIZE: every stream's window moves by the difference.
    pub fn initial_window(&mut self, size: u32) {
        self.enforced = true;
        let diff = i64::from(size) - self.initial_send;
        self.initial_send = i64::from(size);
        for w in self.send_stream.values_mut() {
            *w += diff;
        }
    }

    /// `n` bytes received on `stream` were consumed: the WINDOW_UPDATEs to send now (once
    /// half a window is owed, so that the peer never waits).
    pub fn consumed(&mut self, stream: u32, n: usize) -> Vec<Frame> {
        let n = n.min(DEFAULT_WINDOW as usize) as u32;
        let mut out = Vec::new();
        let s = self.unacked_stream.entry(stream).or_default();
        *s += n;
        if *s >= DEFAULT_WINDOW / 2 {
            out.push(Frame::WindowUpdate { stream, delta: *s });
            *s = 0;
        }
        self.unacked_session += n;
        if self.unacked_session >= DEFAULT_WINDOW / 2 {
            out.push(Frame::WindowUpdate { stream: 0, delta: self.unacked_session });
            self.unacked_session = 0;
        }
        out
    }

    /// Forgets a stream that ended.
    pub fn remove(&mut self, stream: u32) {
        self.send_stream.remove(&stream);
        self.unacked_stream.remove(&stream);
    }
}

/// The sending half of a client connection: allocates stream ids (odd, from 1) and owns the
/// header compressor.
pub struct Writer<W> {
    io: W,
    zlib: HeaderCompressor,
    next_stream: u32,
    buf: BytesMut,
}

impl<W: AsyncWrite + Unpin> Writer<W> {
    pub fn new(io: W) -> Result<Self, SpdyError> {
        Ok(Writer { io, zlib: HeaderCompressor::new()?, next_stream: 1, buf: BytesMut::new() })
    }

    /// The id the next [`Writer::open`] uses.
    pub fn open(&mut self) -> u32 {
        let id = self.next_stream;
        self.next_stream += 2;
        id
    }

    pub async fn send(&mut self, frame: &Frame) -> Result<(), SpdyError> {
        self.buf.clear();
        frame.encode(&mut self.zlib, &mut self.buf)?;
        self.io.write_all(&self.buf).await?;
        self.io.flush().await?;
        Ok(())
    }

    /// Sends GOAWAY and closes the write side. The last good stream is 0: a client accepts no
    /// stream from the server.
    pub async fn close(&mut self) {
        let _ = self.send(&Frame::GoAway { last_good: 0, status: GOAWAY_OK }).await;
        let _ = self.io.shutdown().await;
    }
}

/// Reads frames from `io` until it ends or fails, and hands them over `tx`; the last item is
/// the error, if any.
pub async fn read_frames<R: AsyncRead + Unpin>(mut io: R, tx: mpsc::Sender<Result<Frame, SpdyError>>) {
    let mut zlib = HeaderDecompressor::default();
    let mut buf = BytesMut::with_capacity(16384);
    loop {
        match Frame::decode(&mut buf, &mut zlib) {
            Ok(Some(f)) => {
                if tx.send(Ok(f)).await.is_err() {
                    return;
                }
                continue;
            }
            Ok(None) => {}
            Err(e) => {
                let _ = tx.send(Err(e)).await;
                return;
            }
        }
        match io.read_buf(&mut buf).await {
            Ok(0) => {
                if !buf.is_empty() {
                    let _ = tx.send(Err(SpdyError::Protocol("connection ended inside a frame".into()))).await;
                }
                return;
            }
            Ok(_) => {}
            Err(e) => {
                let _ = tx.send(Err(e.into())).await;
                return;
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn roundtrip(frames: &[Frame]) -> Vec<Frame> {
        let mut z = HeaderCompressor::new().unwrap();
        let mut out = BytesMut::new();
        for f in frames {
            f.encode(&mut z, &mut out).unwrap();
        }
        let mut d = HeaderDecompressor::default();
        let mut got = Vec::new();
        // Fed a byte at a time: decode waits for whole frames.
        let mut buf = BytesMut::new();
        for b in out.iter() {
            buf.put_u8(*b);
            while let Some(f) = Frame::decode(&mut buf, &mut d).unwrap() {
                got.push(f);
            }
        }
        assert!(buf.is_empty());
        got
    }

    #[test]
    fn the_dictionary_is_the_specs() {
        let d = dictionary();
        assert_eq!(d.len(), 1423);
        assert_eq!(&d[..11], b"\0\0\0\x07options");
        assert!(d.ends_with(b"enq=0."));
        // Its Adler-32, which zlib streams primed with it carry in their header.
        let (mut a, mut b) = (1u32, 0u32);
        for x in &d {
            a = (a + u32::from(*x)) % 65521;
            b = (b + a) % 65521;
        }
        let mut z = HeaderCompressor::new().unwrap();
        let block = z.compress(b"x").unwrap();
        assert_eq!(block[1] & 0x20, 0x20, "FDICT set");
        assert_eq!(u32::from_be_bytes([block[2], block[3], block[4], block[5]]), (b << 16) | a);
    }

    #[test]
    fn frames_round_trip() {
        let h = |pairs: &[(&str, &str)]| pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<Headers>();
        let frames = vec![
            Frame::SynStream {
                stream: 1,
                associated: 0,
                priority: 0,
                flags: 0,
                headers: h(&[("streamtype", "error")]),
            },
            Frame::SynStream {
                stream: 3,
                associated: 0,
                priority: 7,
                flags: FLAG_FIN | FLAG_UNIDIRECTIONAL,
                headers: h(&[("streamtype", "stdin"), ("port", "8080"), ("requestid", "0")]),
            },
            Frame::SynReply { stream: 1, flags: 0, headers: vec![] },
            Frame::Headers { stream: 3, flags: FLAG_FIN, headers: h(&[("a", "b\0c")]) },
            Frame::Data { stream: 3, flags: 0, data: Bytes::from_static(b"hello\n") },
            Frame::Data { stream: 3, flags: FLAG_FIN, data: Bytes::new() },
            Frame::RstStream { stream: 5, status: RST_CANCEL },
            Frame::Settings { flags: 1, entries: vec![(0, SETTINGS_INITIAL_WINDOW_SIZE, 1 << 20), (1, 4, 100)] },
            Frame::Ping { id: 2 },
            Frame::GoAway { last_good: 7, status: GOAWAY_OK },
            Frame::WindowUpdate { stream: 0, delta: 32768 },
            Frame::WindowUpdate { stream: 3, delta: 0x7fff_ffff },
        ];
        assert_eq!(roundtrip(&frames), frames);
    }

    #[test]
    fn wire_layout() {
        let mut z = HeaderCompressor::new().unwrap();
        let mut out = BytesMut::new();
        Frame::Data { stream: 3, flags: FLAG_FIN, data: Bytes::from_static(b"ab") }.encode(&mut z, &mut out).unwrap();
        assert_eq!(&out[..], b"\0\0\0\x03\x01\0\0\x02ab");
        out.clear();
        Frame::Ping { id: 1 }.encode(&mut z, &mut out).unwrap();
        assert_eq!(&out[..], b"\x80\x03\0\x06\0\0\0\x04\0\0\0\x01");
        out.clear();
        Frame::WindowUpdate { stream: 1, delta: 10 }.encode(&mut z, &mut out).unwrap();
        assert_eq!(&out[..], b"\x80\x03\0\x09\0\0\0\x08\0\0\0\x01\0\0\0\x0a");
        // An unknown control type is skipped whole; a wrong version is an error.
        let mut d = HeaderDecompressor::default();
        let mut buf = BytesMut::from(&b"\x80\x03\0\x0a\0\0\0\x02xyZZ"[..]);
        assert_eq!(Frame::decode(&mut buf, &mut d).unwrap(), Some(Frame::Unknown { kind: 10 }));
        assert_eq!(&buf[..], b"ZZ");
        let mut buf = BytesMut::from(&b"\x80\x02\0\x06\0\0\0\x04\0\0\0\x01"[..]);
        assert!(Frame::decode(&mut buf, &mut d).is_err());
    }

    #[test]
    fn header_blocks_share_one_zlib_stream_per_direction() {
        let mut z = HeaderCompressor::new().unwrap();
        let mut d = HeaderDecompressor::default();
        let blocks: Vec<Vec<u8>> = (0..5)
            .map(|i| {
                encode_headers(&vec![("streamtype".into(), format!("stdout{i}")), ("x".into(), "y".repeat(i * 100))])
            })
            .collect();
        let mut sizes = Vec::new();
        for b in &blocks {
            let c = z.compress(b).unwrap();
            sizes.push(c.len());
            // A sync flush ends every block with an empty stored block.
            assert!(c.ends_with(&[0, 0, 0xff, 0xff]), "{c:?}");
            assert_eq!(&d.decompress(&c).unwrap(), b);
        }
        // The second block reuses the first one's history: no zlib header, fewer bytes.
        assert!(sizes[1] < sizes[0], "{sizes:?}");
        // A fresh decompressor cannot read a later block alone.
        let mut z2 = HeaderCompressor::new().unwrap();
        let _ = z2.compress(&blocks[0]).unwrap();
        let second = z2.compress(&blocks[1]).unwrap();
        assert!(HeaderDecompressor::default().decompress(&second).is_err());
        // A big block comes back whole.
        let big = encode_headers(&vec![("big".into(), "z".repeat(200_000))]);
        assert_eq!(d.decompress(&z.compress(&big).unwrap()).unwrap(), big);
    }

    #[test]
    fn windows() {
        let mut w = Windows::default();
        // Not enforced until the peer shows flow control.
        assert_eq!(w.allowance(1), usize::MAX);
        w.sent(1, 70000);
        w.window_update(1, 10000);
        // stream: 65536 - 70000 + 10000 = 5536; session: 65536 - 70000 < 0.
        assert_eq!(w.allowance(1), 0);
        w.window_update(0, 10000);
        assert_eq!(w.allowance(1), 5536);
        assert_eq!(w.allowance(3), 5536);
        w.initial_window(1 << 20);
        assert_eq!(w.allowance(1), 5536);
        w.window_update(0, 1 << 20);
        assert_eq!(w.allowance(1), (1 << 20) + 10000 - 70000);
        assert_eq!(w.allowance(3), 1 << 20);
        // Acknowledgements once half a window is owed.
        assert!(w.consumed(2, 20000).is_empty());
        assert_eq!(
            w.consumed(2, 20000),
            vec![Frame::WindowUpdate { stream: 2, delta: 40000 }, Frame::WindowUpdate { stream: 0, delta: 40000 }]
        );
        assert!(w.consumed(4, 100).is_empty());
    }
}
