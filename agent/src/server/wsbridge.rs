//! WebSocket clients of exec, attach and port-forward, served by the agent itself in front of
//! the runtime's SPDY-only streaming server.
//!
//! - `v5.channel.k8s.io` (exec, attach): the agent opens a SPDY/3.1 `v4.channel.k8s.io`
//!   session with the runtime, creating the streams upstream's SPDY client creates (`error`
//!   first, then `stdin`, `stdout`, `stderr`, `resize` as asked), and translates: a WebSocket
//!   message on channel 0 is stdin data, 4 a resize; v5's close message `[255, 0]` half-closes
//!   the stdin stream (FIN); data of the stdout, stderr and error streams becomes messages on
//!   channels 1, 2 and 3 (the error stream carries the v4 `Status` JSON, which v5 sends on
//!   channel 3 as well). When the runtime has closed the output streams (or the connection),
//!   the agent sends a close frame; when the client goes away, it closes the SPDY session.
//! - `SPDY/3.1+portforward.k8s.io` (port-forward): the client speaks SPDY inside WebSocket
//!   binary messages; the agent upgrades to the runtime with plain SPDY and moves the bytes
//!   both ways without reading them.

use std::collections::{HashMap, HashSet, VecDeque};
use std::time::Duration;

use bytes::{BufMut as _, Bytes, BytesMut};
use futures::{SinkExt as _, StreamExt as _};
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _, WriteHalf};
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

use super::spdy::{self, Frame, SpdyError, Windows};
use super::stream::StreamOptions;

/// The WebSocket subprotocol the agent terminates for exec and attach.
pub const V5: &str = "v5.channel.k8s.io";
/// The subprotocol of SPDY tunnelled in WebSocket (port-forward).
pub const PORT_FORWARD_TUNNEL: &str = "SPDY/3.1+portforward.k8s.io";
/// What the agent asks the runtime for.
pub const SPDY_V4: &str = "v4.channel.k8s.io";

pub const CH_STDIN: u8 = 0;
pub const CH_STDOUT: u8 = 1;
pub const CH_STDERR: u8 = 2;
pub const CH_ERROR: u8 = 3;
pub const CH_RESIZE: u8 = 4;
/// v5: `[255, channel]` closes `channel`.
pub const CH_CLOSE: u8 = 255;

/// How long the client may take to answer the agent's close frame.
const CLOSE_WAIT: Duration = Duration::from_secs(5);
/// RST_STREAM status: REFUSED_STREAM (the agent accepts no server-initiated stream).
const RST_REFUSED: u32 = 3;

#[derive(Debug, thiserror::Error)]
pub enum BridgeError {
    #[error(transparent)]
    Spdy(#[from] SpdyError),
    #[error("the runtime's streaming server reset the {0} stream")]
    Refused(&'static str),
    #[error("the runtime's streaming server closed the connection while the streams were set up")]
    Closed,
}

/// The SPDY streams of one exec/attach session.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Streams {
    pub error: u32,
    pub stdin: Option<u32>,
    pub stdout: Option<u32>,
    pub stderr: Option<u32>,
    pub resize: Option<u32>,
}

impl Streams {
    /// The streams upstream's SPDY client creates for `opts`, in its order, with the ids a
    /// fresh client connection gives them.
    pub fn plan(opts: &StreamOptions) -> (Streams, Vec<(u32, &'static str)>) {
        let mut next = 1;
        let mut take = |want: bool, kind: &'static str, list: &mut Vec<(u32, &'static str)>| {
            want.then(|| {
                let id = next;
                next += 2;
                list.push((id, kind));
                id
            })
        };
        let mut list = Vec::new();
        let error = take(true, "error", &mut list).unwrap_or(1);
        let stdin = take(opts.stdin, "stdin", &mut list);
        let stdout = take(opts.stdout, "stdout", &mut list);
        let stderr = take(opts.stderr && !opts.tty, "stderr", &mut list);
        let resize = take(opts.tty, "resize", &mut list);
        (Streams { error, stdin, stdout, stderr, resize }, list)
    }

    /// The WebSocket channel of a stream the runtime writes to.
    fn channel(&self, stream: u32) -> Option<u8> {
        if stream == self.error {
            Some(CH_ERROR)
        } else if Some(stream) == self.stdout {
            Some(CH_STDOUT)
        } else if Some(stream) == self.stderr {
            Some(CH_STDERR)
        } else {
            None
        }
    }
}

/// An exec/attach session with the runtime, its streams set up.
pub struct Session<IO> {
    writer: spdy::Writer<WriteHalf<IO>>,
    frames: mpsc::Receiver<Result<Frame, SpdyError>>,
    reader: tokio::task::JoinHandle<()>,
    streams: Streams,
    /// Frames that arrived while the streams were set up.
    early: VecDeque<Frame>,
    windows: Windows,
}

impl<IO> Drop for Session<IO> {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

impl<IO: AsyncRead + AsyncWrite + Send + 'static> Session<IO> {
    /// Creates the streams on `io` (a connection the runtime upgraded to SPDY/3.1) and waits
    /// until the runtime replied to all of them (spdystream drops data on a stream it has not
    /// replied to yet).
    pub async fn open(io: IO, opts: &StreamOptions) -> Result<Session<IO>, BridgeError> {
        let (r, w) = tokio::io::split(io);
        let (tx, frames) = mpsc::channel(64);
        let reader = tokio::spawn(spdy::read_frames(r, tx));
        let mut s = Session {
            writer: spdy::Writer::new(w)?,
            frames,
            reader,
            streams: Streams::default(),
            early: VecDeque::new(),
            windows: Windows::default(),
        };
        let (streams, list) = Streams::plan(opts);
        s.streams = streams;
        let mut waiting: HashMap<u32, &'static str> = HashMap::new();
        for (id, kind) in list {
            let opened = s.writer.open();
            debug_assert_eq!(opened, id);
            let headers = vec![("streamtype".to_string(), kind.to_string())];
            s.writer.send(&Frame::SynStream { stream: id, associated: 0, priority: 0, flags: 0, headers }).await?;
            waiting.insert(id, kind);
        }
        while !waiting.is_empty() {
            let frame = match s.frames.recv().await {
                None => return Err(BridgeError::Closed),
                Some(Err(e)) => return Err(e.into()),
                Some(Ok(f)) => f,
            };
            match frame {
                Frame::SynReply { stream, .. } => {
                    waiting.remove(&stream);
                }
                Frame::RstStream { stream, .. } => {
                    if let Some(kind) = waiting.get(&stream) {
                        return Err(BridgeError::Refused(kind));
                    }
                    s.early.push_back(Frame::RstStream { stream, status: 0 });
                }
                Frame::GoAway { .. } => return Err(BridgeError::Closed),
                other => {
                    if !s.control(&other).await? {
                        s.early.push_back(other);
                    }
                }
            }
        }
        Ok(s)
    }

    /// Handles the connection-level frames (PING, SETTINGS, WINDOW_UPDATE, server-initiated
    /// streams); false for the others.
    async fn control(&mut self, frame: &Frame) -> Result<bool, SpdyError> {
        match frame {
            // Even ids are the server's pings; odd ones would be answers to ours.
            Frame::Ping { id } if id % 2 == 0 => self.writer.send(&Frame::Ping { id: *id }).await?,
            Frame::Ping { .. } => {}
            Frame::WindowUpdate { stream, delta } => self.windows.window_update(*stream, *delta),
            Frame::Settings { entries, .. } => {
                for (_, id, value) in entries {
                    if *id == spdy::SETTINGS_INITIAL_WINDOW_SIZE {
                        self.windows.initial_window(*value);
                    }
                }
            }
            Frame::SynStream { stream, .. } => {
                self.writer.send(&Frame::RstStream { stream: *stream, status: RST_REFUSED }).await?
            }
            Frame::Headers { .. } | Frame::Unknown { .. } => {}
            _ => return Ok(false),
        }
        Ok(true)
    }

    async fn next_frame(&mut self) -> Option<Result<Frame, SpdyError>> {
        if let Some(f) = self.early.pop_front() {
            return Some(Ok(f));
        }
        self.frames.recv().await
    }
}

/// Why a bridge ended (for the log).
#[derive(Debug, PartialEq)]
pub enum End {
    /// The runtime closed the output streams or the connection: the process ended.
    Runtime,
    /// The client closed the WebSocket or went away.
    Client,
}

/// The client side of the state machine: what to do with one WebSocket message.
#[derive(Debug, PartialEq)]
pub enum FromClient {
    Stdin(Bytes),
    Resize(Bytes),
    CloseStdin,
    Ignore,
    Gone,
}

/// Classifies a client message (v5 channels).
pub fn from_client(msg: Option<Result<Message, tokio_tungstenite::tungstenite::Error>>) -> FromClient {
    match msg {
        Some(Ok(Message::Binary(b))) => match b.first() {
            Some(&CH_STDIN) if b.len() > 1 => FromClient::Stdin(b.slice(1..)),
            Some(&CH_RESIZE) if b.len() > 1 => FromClient::Resize(b.slice(1..)),
            Some(&CH_CLOSE) if b.get(1) == Some(&CH_STDIN) => FromClient::CloseStdin,
            _ => FromClient::Ignore,
        },
        Some(Ok(Message::Close(_))) | Some(Err(_)) | None => FromClient::Gone,
        Some(Ok(_)) => FromClient::Ignore,
    }
}

fn channel_message(ch: u8, data: &[u8]) -> Message {
    let mut b = BytesMut::with_capacity(1 + data.len());
    b.put_u8(ch);
    b.put_slice(data);
    Message::Binary(b.freeze())
}

/// Stdin waiting for the peer's window, and the half-close after it.
#[derive(Default)]
struct Stdin {
    pending: VecDeque<Bytes>,
    close_wanted: bool,
    closed: bool,
}

/// Runs a v5 session until the process ends or the client goes away.
pub async fn bridge<S, IO>(mut ws: WebSocketStream<S>, mut session: Session<IO>) -> End
where
    S: AsyncRead + AsyncWrite + Unpin,
    IO: AsyncRead + AsyncWrite + Send + 'static,
{
    let streams = session.streams.clone();
    let mut open: HashSet<u32> = [Some(streams.error), streams.stdout, streams.stderr].into_iter().flatten().collect();
    let mut stdin = Stdin { closed: streams.stdin.is_none(), ..Default::default() };
    let end = loop {
        if let Err(e) = pump_stdin(&mut session, &mut stdin).await {
            tracing::debug!(error = %e, "writing to the runtime failed");
            break End::Runtime;
        }
        if open.is_empty() {
            break End::Runtime;
        }
        tokio::select! {
            msg = ws.next(), if stdin.pending.is_empty() => {
                match from_client(msg) {
                    FromClient::Stdin(b) => {
                        if !stdin.closed && !stdin.close_wanted {
                            stdin.pending.push_back(b);
                        }
                    }
                    FromClient::CloseStdin => stdin.close_wanted = true,
                    FromClient::Resize(b) => {
                        if let Some(id) = streams.resize {
                            session.windows.sent(id, b.len());
                            if let Err(e) = session.writer.send(&Frame::Data { stream: id, flags: 0, data: b }).await {
                                tracing::debug!(error = %e, "writing to the runtime failed");
                                break End::Runtime;
                            }
                        }
                    }
                    FromClient::Ignore => {}
                    FromClient::Gone => break End::Client,
                }
            }
            frame = session.next_frame() => {
                let frame = match frame {
                    None => break End::Runtime,
                    Some(Err(e)) => {
                        tracing::debug!(error = %e, "reading from the runtime failed");
                        break End::Runtime;
                    }
                    Some(Ok(f)) => f,
                };
                match frame {
                    Frame::Data { stream, flags, data } => {
                        if let Some(ch) = streams.channel(stream) {
                            if !data.is_empty() && ws.send(channel_message(ch, &data)).await.is_err() {
                                break End::Client;
                            }
                        }
                        for update in session.windows.consumed(stream, data.len()) {
                            if session.writer.send(&update).await.is_err() {
                                break;
                            }
                        }
                        if flags & spdy::FLAG_FIN != 0 {
                            open.remove(&stream);
                        }
                    }
                    Frame::RstStream { stream, .. } => {
                        open.remove(&stream);
                        session.windows.remove(stream);
                        if Some(stream) == streams.stdin {
                            stdin.pending.clear();
                            stdin.closed = true;
                        }
                    }
                    // The runtime opens no new streams after GOAWAY; the open ones go on
                    // until they end or the connection closes.
                    Frame::GoAway { .. } | Frame::SynReply { .. } => {}
                    other => {
                        if let Err(e) = session.control(&other).await {
                            tracing::debug!(error = %e, "writing to the runtime failed");
                            break End::Runtime;
                        }
                    }
                }
            }
        }
    };
    session.writer.close().await;
    if end == End::Runtime {
        close(&mut ws).await;
    }
    end
}

/// The server's side of the closing handshake: a close frame (1000), the client's answer
/// (CLOSE_WAIT at most), then the end of the connection (for TLS, with close_notify).
async fn close<S: AsyncRead + AsyncWrite + Unpin>(ws: &mut WebSocketStream<S>) {
    let frame = CloseFrame { code: CloseCode::Normal, reason: "".into() };
    if ws.send(Message::Close(Some(frame))).await.is_ok() {
        let _ = tokio::time::timeout(CLOSE_WAIT, async { while let Some(Ok(_)) = ws.next().await {} }).await;
    }
    let _ = ws.get_mut().shutdown().await;
}

async fn pump_stdin<IO>(session: &mut Session<IO>, stdin: &mut Stdin) -> Result<(), SpdyError>
where
    IO: AsyncRead + AsyncWrite + Send + 'static,
{
    let Some(id) = session.streams.stdin else {
        return Ok(());
    };
    if stdin.closed {
        stdin.pending.clear();
        return Ok(());
    }
    while let Some(front) = stdin.pending.front_mut() {
        let allow = session.windows.allowance(id).min(spdy::MAX_DATA);
        if allow == 0 {
            return Ok(());
        }
        let chunk =
            if front.len() <= allow { stdin.pending.pop_front().unwrap_or_default() } else { front.split_to(allow) };
        session.windows.sent(id, chunk.len());
        session.writer.send(&Frame::Data { stream: id, flags: 0, data: chunk }).await?;
    }
    if stdin.close_wanted {
        session.writer.send(&Frame::Data { stream: id, flags: spdy::FLAG_FIN, data: Bytes::new() }).await?;
        stdin.closed = true;
    }
    Ok(())
}

/// Port-forward: moves the client's WebSocket binary payloads to the runtime's SPDY
/// connection and the runtime's bytes back as binary messages, until either side ends.
pub async fn tunnel<S, R>(mut ws: WebSocketStream<S>, mut runtime: R)
where
    S: AsyncRead + AsyncWrite + Unpin,
    R: AsyncRead + AsyncWrite + Unpin,
{
    let mut buf = vec![0u8; 32 * 1024];
    let runtime_ended = loop {
        tokio::select! {
            msg = ws.next() => match msg {
                Some(Ok(Message::Binary(b))) => {
                    if runtime.write_all(&b).await.is_err() {
                        break true;
                    }
                }
                Some(Ok(Message::Close(_))) | Some(Err(_)) | None => break false,
                Some(Ok(_)) => {}
            },
            n = runtime.read(&mut buf) => match n {
                Ok(0) | Err(_) => break true,
                Ok(n) => {
                    if ws.send(Message::Binary(Bytes::copy_from_slice(&buf[..n]))).await.is_err() {
                        break false;
                    }
                }
            },
        }
    };
    let _ = runtime.shutdown().await;
    if runtime_ended {
        close(&mut ws).await;
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn streams_follow_upstreams_order() {
        let o = |stdin, stdout, stderr, tty| StreamOptions { command: vec![], stdin, stdout, stderr, tty };
        let (s, list) = Streams::plan(&o(true, true, true, false));
        assert_eq!(list, [(1, "error"), (3, "stdin"), (5, "stdout"), (7, "stderr")]);
        assert_eq!(s, Streams { error: 1, stdin: Some(3), stdout: Some(5), stderr: Some(7), resize: None });
        let (s, list) = Streams::plan(&o(true, true, false, true));
        assert_eq!(list, [(1, "error"), (3, "stdin"), (5, "stdout"), (7, "resize")]);
        assert_eq!(s.channel(5), Some(CH_STDOUT));
        assert_eq!(s.channel(1), Some(CH_ERROR));
        assert_eq!(s.channel(7), None);
        let (_, list) = Streams::plan(&o(false, true, true, false));
        assert_eq!(list, [(1, "error"), (3, "stdout"), (5, "stderr")]);
    }

    #[test]
    fn client_messages() {
        let bin = |b: &'static [u8]| Some(Ok(Message::Binary(Bytes::from_static(b))));
        assert_eq!(from_client(bin(b"\x00hi")), FromClient::Stdin(Bytes::from_static(b"hi")));
        assert_eq!(from_client(bin(b"\x00")), FromClient::Ignore);
        assert_eq!(
            from_client(bin(b"\x04{\"Width\":80,\"Height\":24}")),
            FromClient::Resize(Bytes::from_static(b"{\"Width\":80,\"Height\":24}"))
        );
        assert_eq!(from_client(bin(b"\xff\x00")), FromClient::CloseStdin);
        assert_eq!(from_client(bin(b"\xff\x01")), FromClient::Ignore);
        assert_eq!(from_client(bin(b"\x01out")), FromClient::Ignore);
        assert_eq!(from_client(Some(Ok(Message::Ping(Bytes::new())))), FromClient::Ignore);
        assert_eq!(from_client(Some(Ok(Message::Close(None)))), FromClient::Gone);
        assert_eq!(from_client(None), FromClient::Gone);
        assert_eq!(channel_message(2, b"x"), Message::Binary(Bytes::from_static(b"\x02x")));
    }
}
