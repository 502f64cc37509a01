//! The event loops that serve connections, one per worker, shared-nothing as nginx and
//! HAProxy run theirs.
//!
//! Worker 0 is the runtime [`start`](super::start) runs on: it accepts every connection and
//! runs the background tasks. Each further worker is a current-thread runtime on its own
//! thread. The acceptor hands each new connection to the next worker in turn, re-registering
//! its socket with that worker's reactor, so the connection's I/O, its requests and (through
//! the per-worker app pool) its calls to the app stay on one thread. State that must be global
//! (nonces, limits, the kill-switch, the catalog, peers) is shared; nothing else is.

use std::cell::Cell;
use std::future::Future;
use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::thread::JoinHandle;
use std::time::Duration;

use carapace_filters::clock;
use tokio::runtime::Handle;
use tokio::sync::oneshot;

thread_local! {
    static INDEX: Cell<usize> = const { Cell::new(0) };
}

/// The worker the calling thread runs (0 on any thread that is not a worker's).
pub fn index() -> usize {
    INDEX.with(Cell::get)
}

/// One worker on its own thread.
struct Worker {
    handle: Handle,
    stop: oneshot::Sender<()>,
    thread: JoinHandle<()>,
}

/// The workers serving connections: the current runtime, and more event loops on their own
/// threads.
pub struct Workers {
    extra: Vec<Handle>,
    /// Stopped after the drain.
    running: Mutex<Vec<(oneshot::Sender<()>, JoinHandle<()>)>>,
    next: AtomicUsize,
}

impl Workers {
    /// One worker: the runtime [`start`](super::start) runs on serves every connection.
    pub fn one() -> Workers {
        Workers {
            extra: Vec::new(),
            running: Mutex::new(Vec::new()),
            next: AtomicUsize::new(0),
        }
    }

    /// `count` workers: the runtime [`start`](super::start) runs on, and `count - 1` event
    /// loops (tokio current-thread runtimes) on threads of their own.
    pub fn spawn(count: usize) -> io::Result<Workers> {
        let mut workers = Vec::new();
        for i in 1..count.max(1) {
            workers.push(spawn_worker(i)?);
        }
        Ok(Workers {
            extra: workers.iter().map(|w| w.handle.clone()).collect(),
            running: Mutex::new(workers.into_iter().map(|w| (w.stop, w.thread)).collect()),
            next: AtomicUsize::new(0),
        })
    }

    /// How many workers serve connections.
    pub fn count(&self) -> usize {
        1 + self.extra.len()
    }

    /// Serve a new connection on the next worker: `serve(socket)` runs on that worker's
    /// runtime, the socket registered with its reactor.
    pub(crate) fn serve<S, F, Fut>(&self, socket: S, serve: F)
    where
        S: Socket,
        F: FnOnce(S) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.count();
        // Each poll of a connection's task handles what one wake-up brought: its requests
        // share one reading of each clock.
        let Some(handle) = i.checked_sub(1).map(|i| &self.extra[i]) else {
            tokio::spawn(clock::Scoped::new(serve(socket)));
            return;
        };
        let socket = match socket.into_std() {
            Ok(s) => s,
            Err(e) => return tracing::warn!("cannot hand a connection to a worker: {e}"),
        };
        handle.spawn(clock::Scoped::new(async move {
            match S::from_std(socket) {
                Ok(socket) => serve(socket).await,
                Err(e) => tracing::warn!("a worker cannot take a connection: {e}"),
            }
        }));
    }

    /// Stop the workers on their own threads (after the drain: what is left is dropped).
    pub(crate) async fn stop(&self) {
        let running = std::mem::take(&mut *self.running.lock().unwrap_or_else(|e| e.into_inner()));
        for (stop, thread) in running {
            let _ = stop.send(());
            let joined = tokio::task::spawn_blocking(move || thread.join()).await;
            if !matches!(joined, Ok(Ok(()))) {
                tracing::error!("a worker thread panicked");
            }
        }
    }
}

fn spawn_worker(i: usize) -> io::Result<Worker> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let handle = rt.handle().clone();
    let (stop, stopped) = oneshot::channel::<()>();
    let thread = std::thread::Builder::new()
        .name(format!("carapace-worker-{i}"))
        .spawn(move || {
            INDEX.with(|c| c.set(i));
            rt.block_on(async {
                let _ = stopped.await;
            });
            // Connections the drain left open close with their tasks.
            rt.shutdown_timeout(Duration::from_secs(1));
        })?;
    Ok(Worker {
        handle,
        stop,
        thread,
    })
}

/// An accepted socket that can move to another runtime's reactor.
pub(crate) trait Socket: Sized + Send + 'static {
    type Std: Send + 'static;
    fn into_std(self) -> io::Result<Self::Std>;
    fn from_std(s: Self::Std) -> io::Result<Self>;
}

impl Socket for tokio::net::TcpStream {
    type Std = std::net::TcpStream;
    fn into_std(self) -> io::Result<Self::Std> {
        tokio::net::TcpStream::into_std(self)
    }
    fn from_std(s: Self::Std) -> io::Result<Self> {
        tokio::net::TcpStream::from_std(s)
    }
}

impl Socket for tokio::net::UnixStream {
    type Std = std::os::unix::net::UnixStream;
    fn into_std(self) -> io::Result<Self::Std> {
        tokio::net::UnixStream::into_std(self)
    }
    fn from_std(s: Self::Std) -> io::Result<Self> {
        tokio::net::UnixStream::from_std(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::TcpStream;

    /// Serve `n` loopback connections on `workers`, each with `serve`: what each reported.
    async fn served<T, F, Fut>(workers: &Workers, n: usize, serve: F) -> Vec<T>
    where
        T: Send + 'static,
        F: Fn(TcpStream) -> Fut + Clone + Send + 'static,
        Fut: Future<Output = T> + Send + 'static,
    {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let mut clients = Vec::new();
        for _ in 0..n {
            clients.push(TcpStream::connect(addr).await.unwrap());
            let (socket, _) = listener.accept().await.unwrap();
            let (tx, serve) = (tx.clone(), serve.clone());
            workers.serve(socket, move |socket| async move {
                let _ = tx.send(serve(socket).await);
            });
        }
        drop(tx);
        let mut seen = Vec::new();
        while let Some(s) = rx.recv().await {
            seen.push(s);
        }
        seen
    }

    #[tokio::test]
    async fn connections_go_to_each_worker_in_turn_and_stay_on_its_thread() {
        let workers = Workers::spawn(3).unwrap();
        assert_eq!(workers.count(), 3);
        let seen = served(&workers, 6, |mut socket| async move {
            use tokio::io::AsyncWriteExt;
            // The socket works on the worker's reactor.
            let wrote = socket.write_all(b"x").await.is_ok();
            (index(), std::thread::current().id(), wrote)
        })
        .await;
        let mut indices: Vec<usize> = seen.iter().map(|s| s.0).collect();
        indices.sort_unstable();
        assert_eq!(indices, vec![0, 0, 1, 1, 2, 2]);
        assert!(seen.iter().all(|s| s.2), "every socket was writable");
        let threads: std::collections::HashSet<_> = seen.iter().map(|s| s.1).collect();
        assert_eq!(threads.len(), 3, "three workers, three threads");
        workers.stop().await;
        assert!(workers.running.lock().unwrap().is_empty());
    }

    /// A connection's task, on any worker, shares one reading of the clock per poll; between
    /// its polls the clock is read again.
    #[tokio::test]
    async fn a_connections_task_reads_the_clock_once_per_poll() {
        let workers = Workers::spawn(2).unwrap();
        let mut seen = served(&workers, 2, |_socket| async move {
            let first = clock::now();
            // Until the clock has moved on.
            while std::time::Instant::now() <= first.into_std() {
                std::hint::spin_loop();
            }
            let same_poll = clock::now();
            tokio::task::yield_now().await;
            let next_poll = clock::now();
            (index(), first == same_poll, next_poll > first)
        })
        .await;
        seen.sort_unstable();
        assert_eq!(seen, vec![(0, true, true), (1, true, true)]);
        workers.stop().await;
    }
}
