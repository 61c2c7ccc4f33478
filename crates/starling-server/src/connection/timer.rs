//! hyper's header-read timer, made idle-aware.
//!
//! hyper starts one timer whenever a connection is ready for a request head (at accept, and
//! after each response) and closes the connection when it fires before the head is complete.
//! This timer fires at that deadline (the header-read timeout) or, earlier, at the keep-alive
//! timeout if not a byte has arrived since it started: an idle connection goes quickly, a slow
//! request head gets the longer allowance.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use super::io::ReadActivity;

/// One connection's timer (it watches that connection's reads).
#[derive(Clone)]
pub struct IdleAwareTimer {
    activity: Arc<ReadActivity>,
    keep_alive_timeout: Duration,
}

impl IdleAwareTimer {
    /// A timer for the connection whose reads `activity` counts.
    pub fn new(activity: Arc<ReadActivity>, keep_alive_timeout: Duration) -> Self {
        IdleAwareTimer {
            activity,
            keep_alive_timeout,
        }
    }
}

impl hyper::rt::Timer for IdleAwareTimer {
    fn sleep(&self, duration: Duration) -> Pin<Box<dyn hyper::rt::Sleep>> {
        self.sleep_until(Instant::now() + duration)
    }

    fn sleep_until(&self, deadline: Instant) -> Pin<Box<dyn hyper::rt::Sleep>> {
        let idle_deadline = (Instant::now() + self.keep_alive_timeout).min(deadline);
        Box::pin(IdleAwareSleep {
            deadline,
            idle_deadline,
            bytes_at_start: self.activity.bytes_read(),
            activity: self.activity.clone(),
            timer: Box::pin(tokio::time::sleep_until(idle_deadline.into())),
        })
    }
}

/// Fires at `deadline`, or at `idle_deadline` when no byte was read since it was made.
struct IdleAwareSleep {
    deadline: Instant,
    idle_deadline: Instant,
    bytes_at_start: u64,
    activity: Arc<ReadActivity>,
    timer: Pin<Box<tokio::time::Sleep>>,
}

impl Future for IdleAwareSleep {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        loop {
            let idle = self.activity.bytes_read() == self.bytes_at_start;
            let wake_at = if idle {
                self.idle_deadline
            } else {
                self.deadline
            };
            if self.timer.deadline() != wake_at.into() {
                self.timer.as_mut().reset(wake_at.into());
            }
            if self.timer.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            let still_idle = self.activity.bytes_read() == self.bytes_at_start;
            if wake_at >= self.deadline || still_idle {
                return Poll::Ready(());
            }
            // The first bytes of a request came in while the idle timer ran: the head now has
            // until the full deadline.
        }
    }
}

impl hyper::rt::Sleep for IdleAwareSleep {}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper::rt::Timer;

    #[tokio::test]
    async fn idle_connections_time_out_at_the_keep_alive_timeout() {
        let activity = Arc::new(ReadActivity::default());
        let timer = IdleAwareTimer::new(activity, Duration::from_millis(50));
        let started = Instant::now();
        timer.sleep(Duration::from_secs(10)).await;
        let waited = started.elapsed();
        assert!(
            waited >= Duration::from_millis(50) && waited < Duration::from_secs(2),
            "{waited:?}"
        );
    }

    #[tokio::test]
    async fn a_started_request_head_gets_the_full_deadline() {
        let (ours, mut theirs) = tokio::io::duplex(64);
        let activity = Arc::new(ReadActivity::default());
        let mut io = super::super::io::ConnIo::new(ours, activity.clone(), Duration::from_secs(5));
        let timer = IdleAwareTimer::new(activity, Duration::from_millis(30));
        let started = Instant::now();
        let sleep = timer.sleep(Duration::from_millis(300));
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        theirs.write_all(b"GET").await.unwrap();
        let mut buf = [0u8; 3];
        io.read_exact(&mut buf).await.unwrap();
        sleep.await;
        let waited = started.elapsed();
        assert!(waited >= Duration::from_millis(300), "{waited:?}");
    }
}
