//! Graceful shutdown: every connection is told to finish the request it is serving and close,
//! and the stop waits until they have.
//!
//! A connection does not poll its [`DrainWatch`] itself: its watch task does, and tells the
//! connection when draining began. Polled with the connection, the watch would take the lock
//! of its channel's waiters at every poll of the connection, several times per request.

use tokio::sync::watch;

/// Tells every [`DrainWatch`] made from it that draining began, then waits for them to go.
#[derive(Debug)]
pub struct Drain {
    tx: watch::Sender<()>,
}

impl Default for Drain {
    fn default() -> Self {
        Drain {
            tx: watch::channel(()).0,
        }
    }
}

impl Drain {
    /// A connection's watch, held until the connection has ended.
    pub fn watch(&self) -> DrainWatch {
        DrainWatch {
            rx: self.tx.subscribe(),
        }
    }

    /// Begin draining, and wait until every watch has been dropped.
    pub async fn shutdown(self) {
        let _ = self.tx.send(());
        self.tx.closed().await;
    }
}

/// One connection's view of a [`Drain`]: the drain waits for it to be dropped.
#[derive(Debug)]
pub struct DrainWatch {
    rx: watch::Receiver<()>,
}

impl DrainWatch {
    /// Ready once draining began (or the drain itself is gone).
    pub async fn began(&mut self) {
        let _ = self.rx.changed().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::Future;
    use std::pin::pin;
    use std::task::{Context, Poll, Waker};

    fn poll<F: Future>(f: std::pin::Pin<&mut F>) -> Poll<F::Output> {
        f.poll(&mut Context::from_waker(Waker::noop()))
    }

    #[test]
    fn a_watch_learns_that_draining_began_and_the_drain_waits_for_it() {
        let drain = Drain::default();
        let mut watch = drain.watch();
        {
            let mut began = pin!(watch.began());
            assert!(poll(began.as_mut()).is_pending(), "not draining yet");
        }
        let mut shutdown = pin!(drain.shutdown());
        assert!(poll(shutdown.as_mut()).is_pending(), "a watch is held");
        assert!(poll(pin!(watch.began())).is_ready());
        assert!(poll(shutdown.as_mut()).is_pending(), "began, still held");
        drop(watch);
        assert!(poll(shutdown.as_mut()).is_ready());
    }

    #[test]
    fn without_watches_shutdown_is_at_once() {
        assert!(poll(pin!(Drain::default().shutdown())).is_ready());
    }
}
