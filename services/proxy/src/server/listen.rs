//! Listening: one acceptor on the caller's runtime hands each connection, in turn, to one of
//! N worker threads; each worker is a current-thread runtime serving its connections, each
//! from a task of its own ([`super::conn`]). State a worker makes for itself (the egress pool)
//! never crosses threads, and a request's futures need not be `Send`.
//!
//! Not actix-web's server (issue 33): on a 148 KB agent request actix grew its read buffer by
//! doubling and handed the body over in chunks to be gathered again, ~12 µs of CPU a request
//! more than hyper reading the same body (`bench/ingress`). Nor hyper's since: the
//! connection's own loop takes ~3,200 instructions a small request less (−3.7 %) and, with a
//! body handed over whole, ~7,500 less a 148 KB one (`bench/instructions.py`).
//!
//! A client that half-closes its side after a request (`shutdown(SHUT_WR)`) is taken as gone:
//! its pending answer is dropped, as is the upstream call behind it (unless it sent further
//! requests before closing: those are answered). That is what stops an abandoned call at
//! once; HTTP clients do not half-close.

use std::cell::Cell;
use std::future::Future;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, mpsc, watch};

use super::{Payload, Response, conn};

/// How the server listens and stops.
#[derive(Clone, Copy, Debug)]
pub struct Settings {
    pub workers: usize,
    /// Connections the kernel queues before they are accepted.
    pub backlog: u32,
    /// Connections open at once; past it, accepting waits for one to close.
    pub max_connections: usize,
    /// How long a connection may sit between requests, or take to send a request's head,
    /// before it is closed (it runs from the end of the last answer).
    pub idle: Duration,
}

/// How a stop goes: how long requests in flight (streams among them) may take to end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stop {
    pub drain: Duration,
}

/// The first stop signal, and how long requests in flight may take to end: SIGTERM (an
/// orchestrator's stop) 30 s, within a pod's default grace period; SIGINT (ctrl-c at a
/// terminal) 5 s.
pub async fn stop_signal() -> Stop {
    let drain = match next_signal().await {
        Some(Signal::Interrupt) => Duration::from_secs(5),
        Some(Signal::Terminate) => Duration::from_secs(30),
        None => {
            tracing::warn!("cannot listen for stop signals; the proxy stops when its process is killed");
            std::future::pending().await
        }
    };
    Stop { drain }
}

/// A second SIGINT or SIGTERM while stopping: what is still in flight is cut off.
pub async fn second_signal() {
    if next_signal().await.is_none() {
        std::future::pending().await
    }
}

enum Signal {
    Interrupt,
    Terminate,
}

/// The next SIGINT or SIGTERM; `None` at once when they cannot be listened for.
async fn next_signal() -> Option<Signal> {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut interrupt), Ok(mut terminate)) = (signal(SignalKind::interrupt()), signal(SignalKind::terminate()))
    else {
        return None;
    };
    Some(tokio::select! {
        _ = interrupt.recv() => Signal::Interrupt,
        _ = terminate.recv() => Signal::Terminate,
    })
}

/// Binds every address `addr` resolves to (`localhost:8080`: IPv4 and IPv6).
pub fn bind(addr: &str, backlog: u32) -> std::io::Result<Vec<tokio::net::TcpListener>> {
    let mut listeners = Vec::new();
    let mut last_error = None;
    for address in std::net::ToSocketAddrs::to_socket_addrs(addr)? {
        let socket = match address {
            SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
            SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
        };
        socket.set_reuseaddr(true)?;
        match socket.bind(address).and_then(|()| socket.listen(backlog)) {
            Ok(listener) => listeners.push(listener),
            Err(err) => last_error = Some(err),
        }
    }
    match (listeners.is_empty(), last_error) {
        (true, Some(err)) => Err(err),
        (true, None) => Err(std::io::Error::other(format!("`{addr}` names no address to listen on"))),
        (false, _) => Ok(listeners),
    }
}

/// Serves `listeners` until `stop` tells how to stop, then lets what is in flight end within
/// the drain it names, or at once when `cut` completes first (a second signal). `make` runs
/// once on each worker thread and makes its handler.
pub async fn serve<M, H, F>(
    listeners: Vec<tokio::net::TcpListener>,
    settings: Settings,
    make: M,
    stop: impl Future<Output = Stop>,
    cut: impl Future<Output = ()>,
) -> std::io::Result<()>
where
    M: Fn() -> H + Send + Sync + 'static,
    H: Fn(http::Request<Payload>, SocketAddr) -> F + 'static,
    F: Future<Output = Response> + 'static,
{
    let make = Arc::new(make);
    let (stopping, stopped) = watch::channel(None::<Stop>);
    let workers = (0..settings.workers.max(1))
        .map(|index| Worker::start(index, make.clone(), settings, stopped.clone()))
        .collect::<std::io::Result<Vec<_>>>()?;
    let open = Arc::new(Semaphore::new(settings.max_connections.max(1)));
    let next = Cell::new(0usize);
    let accepting =
        futures_util::future::join_all(listeners.into_iter().map(|l| accept(l, &workers, &next, open.clone())));
    let how = tokio::select! {
        _ = accepting => Stop { drain: Duration::ZERO },
        how = stop => how,
    };
    tracing::info!("proxy stopping: requests in flight may take up to {} s", how.drain.as_secs());
    // The listeners are closed (dropped with `accepting`); each worker, its queue closed,
    // ends its connections gracefully.
    let _ = stopping.send(Some(how));
    let threads: Vec<_> = workers.into_iter().map(|w| w.thread).collect();
    let joined = tokio::task::spawn_blocking(move || {
        for thread in threads {
            if thread.join().is_err() {
                tracing::error!("a proxy worker thread panicked");
            }
        }
    });
    tokio::select! {
        _ = joined => {}
        () = cut => {
            tracing::warn!("stopping at once: requests still in flight are cut off");
            let _ = stopping.send(Some(Stop { drain: Duration::ZERO }));
        }
    }
    Ok(())
}

/// Accepts connections on `listener`, each once a connection slot is free, and hands them to
/// the workers in turn.
async fn accept(listener: tokio::net::TcpListener, workers: &[Worker], next: &Cell<usize>, open: Arc<Semaphore>) {
    loop {
        let Ok(slot) = open.clone().acquire_owned().await else { return };
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(err) => {
                // Out of file descriptors or memory: wait a little rather than spin. Anything
                // else is one connection's failure (it went before it was accepted).
                let exhausted =
                    matches!(err.raw_os_error(), Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM));
                tracing::warn!(error = %err, "could not accept a connection");
                if exhausted {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                continue;
            }
        };
        let Ok(stream) = stream.into_std() else { continue };
        hand(workers, next, (stream, peer, slot));
    }
}

/// Hands a connection to the next worker in turn; a worker whose thread is gone cannot take
/// it, and the one after it does.
fn hand(workers: &[Worker], next: &Cell<usize>, accepted: Accepted) {
    let mut connection = accepted;
    for _ in 0..workers.len() {
        let index = next.get() % workers.len();
        next.set(index + 1);
        let Some(worker) = workers.get(index) else { return };
        match worker.connections.send(connection) {
            Ok(()) => return,
            Err(mpsc::error::SendError(back)) => {
                tracing::error!(worker = index, "a proxy worker is gone; its connections go to the others");
                connection = back;
            }
        }
    }
}

type Accepted = (std::net::TcpStream, SocketAddr, OwnedSemaphorePermit);

struct Worker {
    connections: mpsc::UnboundedSender<Accepted>,
    thread: std::thread::JoinHandle<()>,
}

impl Worker {
    fn start<M, H, F>(
        index: usize,
        make: Arc<M>,
        settings: Settings,
        mut stopped: watch::Receiver<Option<Stop>>,
    ) -> std::io::Result<Worker>
    where
        M: Fn() -> H + Send + Sync + 'static,
        H: Fn(http::Request<Payload>, SocketAddr) -> F + 'static,
        F: Future<Output = Response> + 'static,
    {
        let (connections, mut accepted) = mpsc::unbounded_channel::<Accepted>();
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        let thread = std::thread::Builder::new().name(format!("shield-proxy-{index}")).spawn(move || {
            let local = tokio::task::LocalSet::new();
            local.block_on(&runtime, async move {
                let handler = Rc::new(make());
                let open = Rc::new(Open::default());
                while let Some((stream, peer, slot)) = accepted.recv().await {
                    let Ok(stream) = tokio::net::TcpStream::from_std(stream) else { continue };
                    // Small SSE writes go out at once: without this, Nagle holds a chunk until
                    // the client ACKs the previous one (tens of ms with delayed ACKs).
                    let _ = stream.set_nodelay(true);
                    let (handler, stopped, held) = (handler.clone(), stopped.clone(), Held::new(&open));
                    tokio::task::spawn_local(async move {
                        conn::serve(stream, peer, &*handler, settings.idle, stopped).await;
                        drop((held, slot));
                    });
                }
                // The acceptor stopped: idle connections close, requests in flight end within
                // the drain (or at once, when a second signal cuts it).
                let drain = stopped.borrow().map_or(Duration::ZERO, |s| s.drain);
                let cut = stopped.wait_for(|s| s.is_some_and(|s| s.drain.is_zero()));
                tokio::select! {
                    () = open.closed() => {}
                    () = tokio::time::sleep(drain) => {
                        tracing::warn!("requests still in flight after {} s are cut off", drain.as_secs());
                    }
                    _ = cut => {}
                }
            });
        })?;
        Ok(Worker { connections, thread })
    }
}

/// How many of a worker's connections are open, and a wake for when the last one closes.
#[derive(Default)]
struct Open {
    count: Cell<usize>,
    closed: Notify,
}

impl Open {
    async fn closed(&self) {
        while self.count.get() > 0 {
            self.closed.notified().await;
        }
    }
}

/// One open connection, counted until it is dropped.
struct Held(Rc<Open>);

impl Held {
    fn new(open: &Rc<Open>) -> Held {
        open.count.set(open.count.get() + 1);
        Held(open.clone())
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.0.count.set(self.0.count.get().saturating_sub(1));
        self.0.closed.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connections_are_handed_to_the_workers_in_turn_and_past_a_gone_one() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let slots = Arc::new(Semaphore::new(16));
        let (mut queues, mut workers) = (Vec::new(), Vec::new());
        for _ in 0..3 {
            let (connections, queue) = mpsc::unbounded_channel();
            queues.push(queue);
            workers.push(Worker { connections, thread: std::thread::spawn(|| {}) });
        }
        // The third worker's thread is gone: its queue is closed.
        drop(queues.pop());
        let next = Cell::new(0);
        for _ in 0..6 {
            let stream = std::net::TcpStream::connect(addr).unwrap();
            hand(&workers, &next, (stream, addr, slots.clone().try_acquire_owned().unwrap()));
        }
        let counts: Vec<usize> = queues.iter_mut().map(|q| std::iter::from_fn(|| q.try_recv().ok()).count()).collect();
        assert_eq!(counts, vec![3, 3], "in turn, the gone worker's share to the others");
    }
}
