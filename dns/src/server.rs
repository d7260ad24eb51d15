//! The sockets, kept thin: UDP on blocking threads (a datagram in, the local answer out, no
//! task or allocation beyond the answer's; forwarded queries move to the tokio runtime), TCP
//! on tokio (RFC 7766: two-byte length prefix, several queries per connection, an idle
//! timeout, the connection closed after a FORMERR since the stream may be out of step).

use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpListener;

use crate::answer::{Outcome, Transport};
use crate::handler::Handler;

/// How long a TCP connection may sit idle between queries.
pub const TCP_IDLE: Duration = Duration::from_secs(10);
/// TCP connections served at once (more wait in the accept queue).
pub const MAX_TCP_CONNECTIONS: usize = 256;

/// Serves UDP on `threads` threads until `stop` is set (checked at least every 200 ms).
pub fn spawn_udp(
    sock: UdpSocket,
    threads: usize,
    handler: Arc<Handler>,
    rt: tokio::runtime::Handle,
    stop: Arc<AtomicBool>,
) -> std::io::Result<Vec<std::thread::JoinHandle<()>>> {
    sock.set_read_timeout(Some(Duration::from_millis(200)))?;
    let sock = Arc::new(sock);
    let mut out = Vec::new();
    for i in 0..threads.max(1) {
        let (sock, handler, rt, stop) = (sock.clone(), handler.clone(), rt.clone(), stop.clone());
        out.push(std::thread::Builder::new().name(format!("dns-udp-{i}")).spawn(move || udp_loop(&sock, &handler, &rt, &stop))?);
    }
    Ok(out)
}

fn udp_loop(sock: &Arc<UdpSocket>, handler: &Arc<Handler>, rt: &tokio::runtime::Handle, stop: &AtomicBool) {
    // EDNS clients may send up to their buffer size; 64 KiB holds any datagram
    let mut buf = vec![0u8; 65535];
    while !stop.load(Ordering::Relaxed) {
        let (n, peer) = match sock.recv_from(&mut buf) {
            Ok(x) => x,
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut | std::io::ErrorKind::Interrupted) => continue,
            Err(e) => {
                tracing::warn!(error = %e, "udp receive failed");
                continue;
            }
        };
        let request = &buf[..n];
        match handler.local(request, Transport::Udp) {
            Outcome::Reply(b) => send(sock, &b, peer),
            Outcome::Drop => {}
            other => {
                let (sock, handler, request) = (sock.clone(), handler.clone(), request.to_vec());
                rt.spawn(async move {
                    if let Some(b) = handler.complete(&request, Transport::Udp, other).await {
                        send(&sock, &b, peer);
                    }
                });
            }
        }
    }
}

fn send(sock: &UdpSocket, b: &[u8], peer: SocketAddr) {
    if let Err(e) = sock.send_to(b, peer) {
        tracing::debug!(error = %e, %peer, "udp send failed");
    }
}

/// Serves TCP connections until the task is dropped.
pub async fn serve_tcp(listener: TcpListener, handler: Arc<Handler>) {
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_TCP_CONNECTIONS));
    loop {
        let Ok(permit) = slots.clone().acquire_owned().await else { return };
        let (stream, peer) = match listener.accept().await {
            Ok(x) => x,
            Err(e) => {
                tracing::warn!(error = %e, "tcp accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let handler = handler.clone();
        tokio::spawn(async move {
            if let Err(e) = tcp_conn(stream, &handler).await {
                tracing::debug!(error = %e, %peer, "tcp connection ended");
            }
            drop(permit);
        });
    }
}

async fn tcp_conn(mut s: tokio::net::TcpStream, handler: &Handler) -> std::io::Result<()> {
    loop {
        let len = match tokio::time::timeout(TCP_IDLE, s.read_u16()).await {
            Ok(Ok(n)) => usize::from(n),
            // idle, or the client closed
            Ok(Err(_)) | Err(_) => return Ok(()),
        };
        let mut buf = vec![0u8; len];
        tokio::time::timeout(TCP_IDLE, s.read_exact(&mut buf))
            .await
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "query incomplete"))??;
        let Some(resp) = handler.handle(&buf, Transport::Tcp).await else { return Ok(()) };
        let Ok(n) = u16::try_from(resp.len()) else { return Ok(()) };
        let mut out = Vec::with_capacity(resp.len() + 2);
        out.extend(n.to_be_bytes());
        out.extend(&resp);
        s.write_all(&out).await?;
        // FORMERR: the stream may be out of step; close it (RFC 7766 section 6.2.4 allows it)
        if resp.len() >= 4 && resp[3] & 0x0f == 1 {
            s.shutdown().await?;
            return Ok(());
        }
    }
}
