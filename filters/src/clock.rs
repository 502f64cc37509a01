//! The clocks as read by a request's handling: each read at most once per poll of the task
//! that serves the request's connection.
//!
//! A forwarded call reads the time about ten times: when the front starts it, when the
//! envelope starts timing it, when its timeout is set, when its replay window is checked, when
//! the app connection it borrows is checked for idleness and returned, and again for each of
//! these when it ends. Each read is a `clock_gettime` of 20 to 30 ns. nginx and HAProxy read
//! the clock once per turn of their event loop and let every request handled in that turn share
//! it; [`Scoped`] does the same per poll of a connection's task. Within a scoped poll, the
//! first [`now`] (or [`unix_now_ms`]) reads the clock and every later one in the same poll
//! returns that reading, so a reading is at most one poll old (microseconds: a poll does not
//! wait). Outside a scoped poll every call reads the clock.
//!
//! ```
//! use carapace_filters::clock;
//!
//! # let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
//! # rt.block_on(async {
//! // A connection's task, as a worker spawns it.
//! let took = clock::Scoped::new(async {
//!     let started = clock::now();
//!     // Work that does not wait, while the clock moves on.
//!     let t = std::time::Instant::now();
//!     while std::time::Instant::now() <= t {}
//!     clock::elapsed(started)
//! })
//! .await;
//! assert_eq!(took, std::time::Duration::ZERO, "one poll, one reading");
//! # });
//! ```

use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use pin_project_lite::pin_project;
use tokio::time::Instant;

/// The clocks as first read in a scoped poll.
#[derive(Clone, Copy, Default)]
struct Readings {
    monotonic: Option<Instant>,
    unix_ms: Option<u64>,
}

thread_local! {
    /// This thread's readings in the scoped poll it is in; `None` outside one, where every
    /// call reads the clock.
    static READINGS: Cell<Option<Readings>> = const { Cell::new(None) };
}

/// The monotonic time: tokio's clock (so paused in tests that pause it), read once per scoped
/// poll.
pub fn now() -> Instant {
    reading(|r| &mut r.monotonic, read_monotonic)
}

/// The time since `earlier`, by [`now`] (zero if `earlier` is later).
pub fn elapsed(earlier: Instant) -> Duration {
    now().saturating_duration_since(earlier)
}

/// Milliseconds since the Unix epoch from the system clock, read once per scoped poll.
pub fn unix_now_ms() -> u64 {
    reading(|r| &mut r.unix_ms, read_unix_ms)
}

/// The scoped poll's reading in `slot`, taken with `read` if it has none yet; outside a
/// scoped poll, `read`'s.
fn reading<T: Copy>(slot: fn(&mut Readings) -> &mut Option<T>, read: fn() -> T) -> T {
    READINGS.with(|cell| {
        let Some(mut readings) = cell.get() else {
            return read();
        };
        if let Some(t) = *slot(&mut readings) {
            return t;
        }
        let t = read();
        *slot(&mut readings) = Some(t);
        cell.set(Some(readings));
        t
    })
}

fn read_monotonic() -> Instant {
    #[cfg(test)]
    tests::counted(|c| c.0 += 1);
    Instant::now()
}

fn read_unix_ms() -> u64 {
    #[cfg(test)]
    tests::counted(|c| c.1 += 1);
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

pin_project! {
    /// A future whose every poll reads each clock at most once: see the [module](self).
    /// Meant for a connection's task, whose polls each handle what one wake-up brought and do
    /// not wait.
    pub struct Scoped<F> {
        #[pin]
        inner: F,
    }
}

impl<F> Scoped<F> {
    /// Scope each poll of `inner`.
    pub fn new(inner: F) -> Self {
        Scoped { inner }
    }
}

impl<F: Future> Future for Scoped<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let _scope = Scope::enter();
        self.project().inner.poll(cx)
    }
}

/// One scoped poll: fresh readings on entry, the thread's previous state restored on exit
/// (even by a panic), so a scope nested in another, or a task polled after it, never sees
/// this poll's readings.
struct Scope(Option<Readings>);

impl Scope {
    fn enter() -> Scope {
        Scope(READINGS.with(|r| r.replace(Some(Readings::default()))))
    }
}

impl Drop for Scope {
    fn drop(&mut self) {
        READINGS.with(|r| r.set(self.0));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    thread_local! {
        /// Reads of the monotonic and the Unix clock on this thread.
        static READS: Cell<(u32, u32)> = const { Cell::new((0, 0)) };
    }

    pub(super) fn counted(f: impl FnOnce(&mut (u32, u32))) {
        READS.with(|r| {
            let mut reads = r.get();
            f(&mut reads);
            r.set(reads);
        });
    }

    /// The reads of each clock `f` made (each test runs on a thread of its own).
    async fn reads<T>(f: impl Future<Output = T>) -> (T, (u32, u32)) {
        let before = READS.with(Cell::get);
        let out = f.await;
        let after = READS.with(Cell::get);
        (out, (after.0 - before.0, after.1 - before.1))
    }

    fn both() -> (Instant, u64) {
        (now(), unix_now_ms())
    }

    /// A future polled twice (it wakes itself once), `each` called in each poll.
    fn twice<T>(mut each: impl FnMut() -> T) -> impl Future<Output = (T, T)> {
        let mut first = None;
        std::future::poll_fn(move |cx| match first.take() {
            None => {
                first = Some(each());
                cx.waker().wake_by_ref();
                Poll::Pending
            }
            Some(a) => Poll::Ready((a, each())),
        })
    }

    #[tokio::test]
    async fn within_a_scoped_poll_each_clock_is_read_once() {
        let ((first, later), n) = reads(Scoped::new(async {
            let first = both();
            let _ = (both(), elapsed(first.0));
            (first, both())
        }))
        .await;
        assert_eq!(n, (1, 1));
        assert_eq!(first, later);
    }

    #[tokio::test]
    async fn each_scoped_poll_reads_the_clocks_again() {
        let (_, n) = reads(Scoped::new(twice(|| (both(), both())))).await;
        assert_eq!(n, (2, 2));
    }

    #[tokio::test]
    async fn outside_a_scope_every_call_reads_the_clocks() {
        let (_, n) = reads(async { (both(), both(), elapsed(now())) }).await;
        assert_eq!(n, (4, 2));
        // A scope's readings do not outlive its poll.
        let (_, n) = reads(async {
            Scoped::new(async { both() }).await;
            both()
        })
        .await;
        assert_eq!(n, (2, 2));
    }

    #[tokio::test]
    async fn a_nested_scope_reads_afresh_and_leaves_the_outer_readings() {
        let (_, n) = reads(Scoped::new(async {
            let outer = both();
            let (_, inner) = reads(Scoped::new(async { both() })).await;
            assert_eq!(inner, (1, 1));
            assert_eq!(both(), outer);
        }))
        .await;
        assert_eq!(n, (2, 2));
    }

    #[tokio::test(start_paused = true)]
    async fn the_monotonic_clock_is_tokios_and_pauses_with_it() {
        let t = now();
        tokio::time::advance(Duration::from_secs(60)).await;
        assert_eq!(elapsed(t), Duration::from_secs(60));
        let (took, _) = Scoped::new(twice(now)).await;
        assert_eq!(elapsed(took), Duration::ZERO, "paused, no time passes");
    }
}
