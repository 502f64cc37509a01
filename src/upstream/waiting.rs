//! The calls of one worker waiting on the app, and when a request to the app is written.
//!
//! A worker's event loop runs, in one turn, every connection whose caller sent something. A
//! call that writes its request to the app at once wakes the app, which shares the machine's
//! cores with carapace; when the app runs on the same core it takes the core there and then,
//! before the other calls of the turn have been read. So when other calls of this worker are
//! already waiting on the app (the worker is busy), a call lets the rest of the turn run
//! first (`tokio::task::yield_now`: it runs again after the tasks already ready and those the
//! next poll of the event loop's I/O wakes) and writes its request after them: the app is
//! woken once for the turn's requests, not once per request. When no other call of the pool
//! has an answer outstanding the request goes at once (no extra turn of the event loop).
//! Only the app's pools per worker count their calls: a remote target (a peer of the outbound
//! role, an EAT catalog or MCP server) does not share the core, and a pool every worker shares
//! (an outbound loopback skill) would make a call wait on another worker's; every call to
//! those goes at once.
//!
//! ```text
//! calls already waiting:  read A, read B, read C | write A, write B, write C | answers
//! none waiting:            read A, write A | the app answers A
//! ```

use std::sync::atomic::{AtomicUsize, Ordering};

/// How many calls of one worker are waiting on the app.
#[derive(Debug, Default)]
pub(super) struct WaitingCalls(AtomicUsize);

/// One call counted in [`WaitingCalls`] until it is dropped (answered, failed or cancelled).
#[derive(Debug)]
#[must_use = "the call is counted only while this lives"]
pub(super) struct Waiting<'a>(&'a WaitingCalls);

impl WaitingCalls {
    /// Count this call as waiting; when others were already waiting, first let the rest of
    /// the event loop's turn run.
    pub(super) async fn enter(&self) -> Waiting<'_> {
        // Relaxed: the count orders nothing else; it only decides whether to yield.
        let others = self.0.fetch_add(1, Ordering::Relaxed);
        // Counted before yielding, so a call dropped while it yields is uncounted.
        let waiting = Waiting(self);
        if others > 0 {
            tokio::task::yield_now().await;
        }
        waiting
    }

    #[cfg(test)]
    pub(super) fn count(&self) -> usize {
        self.0.load(Ordering::Relaxed)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0 .0.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::Future;
    use std::pin::pin;
    use std::task::{Context, Poll};

    fn poll_once<F: Future>(f: std::pin::Pin<&mut F>) -> Poll<F::Output> {
        f.poll(&mut Context::from_waker(std::task::Waker::noop()))
    }

    #[tokio::test]
    async fn the_only_waiting_call_goes_at_once() {
        let calls = WaitingCalls::default();
        let first = pin!(calls.enter());
        let Poll::Ready(waiting) = poll_once(first) else {
            panic!("an idle worker's call waited a turn");
        };
        assert_eq!(calls.count(), 1);
        drop(waiting);
        assert_eq!(calls.count(), 0);
    }

    #[tokio::test]
    async fn a_call_behind_another_waits_one_turn() {
        let calls = WaitingCalls::default();
        let _first = calls.enter().await;
        let mut second = pin!(calls.enter());
        assert!(
            poll_once(second.as_mut()).is_pending(),
            "went before the turn ended"
        );
        assert_eq!(calls.count(), 2);
        let _second = second.await;
        assert_eq!(calls.count(), 2);
    }

    #[tokio::test]
    async fn a_call_dropped_while_it_waits_is_no_longer_counted() {
        let calls = WaitingCalls::default();
        let first = calls.enter().await;
        {
            let mut second = pin!(calls.enter());
            assert!(poll_once(second.as_mut()).is_pending());
            assert_eq!(calls.count(), 2);
        }
        assert_eq!(calls.count(), 1);
        drop(first);
        assert_eq!(calls.count(), 0);
    }
}
