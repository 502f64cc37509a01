//! Lingering close: when carapace closes a connection, it first stops sending, then reads and
//! discards what the caller is still sending until the caller closes too, for at most
//! [`LINGER_TIME`] and [`LINGER_MAX_BYTES`].
//!
//! Closing a socket with unread data in it makes the kernel answer with a reset, and a reset
//! destroys the answer the caller has not read yet. A caller that writes its whole request
//! before reading (most HTTP/1 clients) would then see a broken connection instead of the
//! `413` or `429` it was sent. This is what nginx calls `lingering_close`. Only the orderly
//! close path lingers; a connection closed for being idle, too slow or evicted is dropped.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use pin_project_lite::pin_project;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Sleep;

/// The longest a closing connection keeps reading what the caller still sends.
pub const LINGER_TIME: Duration = Duration::from_secs(5);
/// The most it reads and discards meanwhile.
pub const LINGER_MAX_BYTES: usize = 16 << 20;

pin_project! {
    /// A transport whose shutdown lingers (see the module docs).
    #[derive(Debug)]
    pub struct Lingering<T> {
        #[pin]
        io: T,
        linger: Option<Linger>,
    }
}

#[derive(Debug)]
struct Linger {
    deadline: Pin<Box<Sleep>>,
    left: usize,
}

impl<T> Lingering<T> {
    pub fn new(io: T) -> Self {
        Lingering { io, linger: None }
    }

    pub fn get_ref(&self) -> &T {
        &self.io
    }
}

impl<T: AsyncRead> AsyncRead for Lingering<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        self.project().io.poll_read(cx, buf)
    }
}

impl<T: AsyncRead + AsyncWrite> AsyncWrite for Lingering<T> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, b: &[u8]) -> Poll<io::Result<usize>> {
        self.project().io.poll_write(cx, b)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.project().io.poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.project().io.poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let mut this = self.project();
        if this.linger.is_none() {
            ready!(this.io.as_mut().poll_shutdown(cx))?;
            *this.linger = Some(Linger {
                deadline: Box::pin(tokio::time::sleep(LINGER_TIME)),
                left: LINGER_MAX_BYTES,
            });
        }
        let linger = this.linger.as_mut().expect("set above");
        let mut scratch = [0u8; 4096];
        loop {
            if linger.left == 0 || linger.deadline.as_mut().poll(cx).is_ready() {
                return Poll::Ready(Ok(()));
            }
            let mut buf = ReadBuf::new(&mut scratch);
            match ready!(this.io.as_mut().poll_read(cx, &mut buf)) {
                Ok(()) if buf.filled().is_empty() => return Poll::Ready(Ok(())),
                Ok(()) => linger.left = linger.left.saturating_sub(buf.filled().len()),
                // The caller is gone: nothing left to protect.
                Err(_) => return Poll::Ready(Ok(())),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn shutdown_reads_until_the_other_side_closes() {
        let (a, mut b) = tokio::io::duplex(64);
        let mut a = Lingering::new(a);
        let closer = tokio::spawn(async move {
            a.shutdown().await.unwrap();
        });
        // The other side sees end of stream, may still write, then closes.
        let mut buf = [0u8; 8];
        assert_eq!(b.read(&mut buf).await.unwrap(), 0);
        b.write_all(&[7u8; 1000]).await.unwrap();
        assert!(!closer.is_finished());
        drop(b);
        tokio::time::timeout(Duration::from_secs(5), closer)
            .await
            .expect("shutdown ends when the other side closes")
            .unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn shutdown_gives_up_after_the_linger_time() {
        let (a, _b) = tokio::io::duplex(64);
        let mut a = Lingering::new(a);
        let started = tokio::time::Instant::now();
        a.shutdown().await.unwrap();
        assert!(started.elapsed() >= LINGER_TIME);
    }
}
