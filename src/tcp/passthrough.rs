//! TLS passthrough (`docs/tcp.md`, "TLS passthrough"): on the HTTPS listener, a
//! connection's ClientHello is read before any handshake — peeked, not taken, so the
//! bytes stay in the socket — and a server name of `[[tls_passthrough]]` sends the
//! whole connection, as it came, to a TCP pool; any other is terminated as before.

use std::io::{self, ErrorKind};
use std::os::fd::AsRawFd;
use std::time::Duration;

use tokio::io::Interest;
use tokio::net::TcpStream;

use super::hello::{server_name, Hello, MAX_HELLO};
use crate::config::tcp::PassthroughSpec;

/// How long the ClientHello may take to come whole.
pub(crate) const HELLO_TIMEOUT: Duration = Duration::from_secs(5);

/// What becomes of a TLS connection.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Through {
    /// Passed through to this TCP pool.
    Pass(String),
    /// Terminated here, as any TLS connection.
    Terminate,
    /// Closed: its ClientHello did not come whole within the limits.
    Close,
}

/// The pool of the first entry of `names` whose name `sni` matches (an exact name, or
/// one below a `*.SUFFIX`).
pub(crate) fn pool_for<'a>(names: &'a [PassthroughSpec], sni: &str) -> Option<&'a str> {
    names
        .iter()
        .find(|p| p.sni.takes(sni))
        .map(|p| p.pool.as_str())
}

/// Reads `stream`'s ClientHello without taking it, within [`HELLO_TIMEOUT`] and
/// [`MAX_HELLO`] bytes, and says what becomes of the connection.
pub(crate) async fn classify(stream: &TcpStream, names: &[PassthroughSpec]) -> Through {
    let read = tokio::time::timeout(HELLO_TIMEOUT, peek_hello(stream)).await;
    // The reads after this one (the handshake's, the copy's) want every byte at once.
    low_water(stream, 1);
    match read {
        Ok(Ok(Hello::Name(Some(sni)))) => match pool_for(names, &sni) {
            Some(pool) => Through::Pass(pool.to_string()),
            None => Through::Terminate,
        },
        Ok(Ok(Hello::Name(None) | Hello::NotTls)) => Through::Terminate,
        Ok(Ok(Hello::TooLong | Hello::More(_))) | Ok(Err(_)) | Err(_) => Through::Close,
    }
}

/// Peeks at the socket's received bytes until they hold a ClientHello whole (or show
/// they never will). Each step waits until the bytes it needs have all come: the
/// socket's low-water mark (`SO_RCVLOWAT`) is set to them, so the kernel does not wake
/// this task for every segment of a client that sends a byte at a time, and each peek
/// copies at most what is needed. A client that ends its side before its hello is
/// whole is closed at once: the end of the stream is always readable, and would
/// otherwise wake the loop for ever.
async fn peek_hello(stream: &TcpStream) -> io::Result<Hello> {
    let mut buf = Vec::new();
    let mut need = 5;
    loop {
        buf.resize(need, 0);
        low_water(stream, need);
        let ready = stream.ready(Interest::READABLE).await?;
        tokio::task::coop::consume_budget().await;
        let got = stream.try_io(Interest::READABLE, || match peek(stream, &mut buf)? {
            0 => Err(ErrorKind::UnexpectedEof.into()),
            n if n < need => Err(ErrorKind::WouldBlock.into()),
            n => Ok(n),
        });
        let seen = match got {
            Ok(n) => n,
            Err(e) if e.kind() == ErrorKind::WouldBlock && ready.is_read_closed() => {
                return Err(ErrorKind::UnexpectedEof.into())
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        };
        match server_name(&buf[..seen]) {
            Hello::More(more) if more > seen => need = more,
            Hello::More(_) => return Ok(Hello::TooLong),
            verdict => return Ok(verdict),
        }
    }
}

/// Sets the bytes the socket must hold before it reads as ready (at least 1).
fn low_water(stream: &TcpStream, bytes: usize) {
    let value = bytes.clamp(1, MAX_HELLO) as libc::c_int;
    // SAFETY: setsockopt reads one int from the pointer given, which lives across the
    // call; the descriptor is the stream's own. socket2 has no setter for this option.
    unsafe {
        libc::setsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVLOWAT,
            (&value as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        );
    }
}

/// The bytes waiting on `stream`, left there (`MSG_PEEK`).
fn peek(stream: &TcpStream, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: recv writes at most `buf.len()` bytes into `buf`, which lives across the
    // call; the descriptor is the stream's own, open while it is borrowed.
    let n = unsafe {
        libc::recv(
            stream.as_raw_fd(),
            buf.as_mut_ptr().cast(),
            buf.len(),
            libc::MSG_PEEK | libc::MSG_DONTWAIT,
        )
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n as usize)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::route::HostPattern;

    fn names() -> Vec<PassthroughSpec> {
        [("db.example.com", "pg"), ("*.mq.example.com", "mq")]
            .into_iter()
            .map(|(n, p)| PassthroughSpec {
                sni: HostPattern::parse(n).unwrap(),
                pool: p.into(),
            })
            .collect()
    }

    #[test]
    fn names_match_exactly_or_below_a_wildcard() {
        let n = names();
        assert_eq!(pool_for(&n, "db.example.com"), Some("pg"));
        assert_eq!(pool_for(&n, "a.mq.example.com"), Some("mq"));
        assert_eq!(pool_for(&n, "a.b.mq.example.com"), Some("mq"));
        assert_eq!(pool_for(&n, "mq.example.com"), None);
        assert_eq!(pool_for(&n, "x.db.example.com"), None);
    }
}
