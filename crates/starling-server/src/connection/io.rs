//! The socket as hyper sees it: every byte read is counted (the idle timer reads the count),
//! and a write that makes no progress for too long fails the connection (a client that stopped
//! reading must not hold its connection, and its request, forever).

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Sleep;

/// Bytes read from one connection so far, shared with its idle timer.
#[derive(Debug, Default)]
pub struct ReadActivity {
    bytes_read: AtomicU64,
}

impl ReadActivity {
    /// Bytes read so far.
    pub fn bytes_read(&self) -> u64 {
        self.bytes_read.load(Ordering::Relaxed)
    }

    fn add(&self, bytes: usize) {
        self.bytes_read.fetch_add(bytes as u64, Ordering::Relaxed);
    }
}

/// A connection's byte stream with read accounting and a write-stall timeout.
pub struct ConnIo<T> {
    inner: T,
    activity: Arc<ReadActivity>,
    write_stall_timeout: Duration,
    /// Armed while a write is pending; reset by any progress.
    stall: Option<Pin<Box<Sleep>>>,
}

impl<T> ConnIo<T> {
    /// Wraps `inner`; writes pending for `write_stall_timeout` fail with `TimedOut`.
    pub fn new(inner: T, activity: Arc<ReadActivity>, write_stall_timeout: Duration) -> Self {
        ConnIo {
            inner,
            activity,
            write_stall_timeout,
            stall: None,
        }
    }

    /// Turns a pending write into an error once it has been pending for the stall timeout.
    fn check_stall<R>(
        &mut self,
        cx: &mut Context<'_>,
        polled: Poll<io::Result<R>>,
    ) -> Poll<io::Result<R>> {
        if polled.is_ready() {
            self.stall = None;
            return polled;
        }
        let timeout = self.write_stall_timeout;
        let stall = self
            .stall
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
        match stall.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("the client read nothing for {timeout:?}"),
            ))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for ConnIo<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.inner).poll_read(cx, buf);
        this.activity.add(buf.filled().len() - before);
        polled
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for ConnIo<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_write(cx, buf);
        this.check_stall(cx, polled)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        this.check_stall(cx, polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_flush(cx);
        this.check_stall(cx, polled)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_shutdown(cx);
        this.check_stall(cx, polled)
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    #[tokio::test]
    async fn a_write_the_peer_never_reads_fails_after_the_stall_timeout() {
        let (ours, mut theirs) = tokio::io::duplex(64);
        let activity = Arc::new(ReadActivity::default());
        let mut io = ConnIo::new(ours, activity, Duration::from_millis(100));
        let started = std::time::Instant::now();
        let err = io.write_all(&[7u8; 1024]).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        assert!(started.elapsed() >= Duration::from_millis(100));
        // A slow but steady reader is never cut off.
        let (ours, theirs2) = tokio::io::duplex(64);
        let mut io = ConnIo::new(
            ours,
            Arc::new(ReadActivity::default()),
            Duration::from_millis(100),
        );
        let reader = tokio::spawn(async move {
            let mut theirs2 = theirs2;
            let mut got = 0;
            let mut buf = [0u8; 16];
            while got < 1024 {
                tokio::time::sleep(Duration::from_millis(5)).await;
                got += theirs2.read(&mut buf).await.unwrap();
            }
        });
        io.write_all(&[1u8; 1024]).await.unwrap();
        reader.await.unwrap();
        drop(theirs.shutdown().await);
    }

    #[tokio::test]
    async fn reads_are_counted() {
        let (ours, mut theirs) = tokio::io::duplex(64);
        let activity = Arc::new(ReadActivity::default());
        let mut io = ConnIo::new(ours, activity.clone(), Duration::from_secs(1));
        theirs.write_all(b"hello").await.unwrap();
        let mut buf = [0u8; 5];
        io.read_exact(&mut buf).await.unwrap();
        assert_eq!(activity.bytes_read(), 5);
    }
}
