//! A TCP proxy between workers and nodes, the way a load balancer sits there: each
//! connection goes to the next node that accepts it. `cut` resets every open
//! connection at once (a network cut as both ends see it); `down` refuses new
//! connections until `up`; `stall` black-holes the connections open now (their
//! bytes are held, nothing is closed: a dead NAT entry) until a cut, while new
//! connections flow; `hold_upstream` holds what clients send (every connection,
//! now and later) until `release_upstream`, while what the nodes send flows: a
//! message in flight towards a node for as long as a test needs.
//!
//! The soak (`spool soak`) and the session-resume tests use it.

use std::{
    net::SocketAddr,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
};

use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
    sync::watch,
};
use tokio_util::sync::CancellationToken;

pub struct Proxy {
    pub addr: SocketAddr,
    shared: Arc<Shared>,
    stop: CancellationToken,
}

struct Shared {
    backends: Vec<SocketAddr>,
    /// What a cut cancels (every connection since the last cut), and the
    /// connections opened since the last cut or stall.
    generation: Mutex<(CancellationToken, Generation)>,
    /// New connections are reset at once while set.
    down: AtomicBool,
    /// The backend the next connection tries first (then the ones after it).
    next: std::sync::atomic::AtomicUsize,
    /// What clients send is held while set (see [`Proxy::hold_upstream`]).
    upstream_held: watch::Sender<bool>,
}

#[derive(Clone)]
struct Generation {
    /// Cancelled to reset the connections (a cut resets every generation).
    cut: CancellationToken,
    /// The connections relay nothing once true. Shared with each connection, which
    /// must keep it alive after a new generation replaces this one.
    stalled: Arc<watch::Sender<bool>>,
}

impl Generation {
    /// A generation reset when `root` is cancelled.
    fn under(root: &CancellationToken) -> Self {
        Self {
            cut: root.child_token(),
            stalled: Arc::new(watch::Sender::new(false)),
        }
    }
}

impl Proxy {
    pub async fn start(backends: Vec<SocketAddr>) -> std::io::Result<Proxy> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            backends,
            generation: Mutex::new({
                let root = CancellationToken::new();
                let first = Generation::under(&root);
                (root, first)
            }),
            down: AtomicBool::new(false),
            next: std::sync::atomic::AtomicUsize::new(0),
            upstream_held: watch::Sender::new(false),
        });
        let stop = CancellationToken::new();
        tokio::spawn(accept(listener, shared.clone(), stop.clone()));
        Ok(Proxy { addr, shared, stop })
    }

    /// Resets every connection open now, stalled ones included.
    pub fn cut(&self) {
        if let Ok(mut generation) = self.shared.generation.lock() {
            generation.0.cancel();
            let root = CancellationToken::new();
            let next = Generation::under(&root);
            *generation = (root, next);
        }
    }

    /// Refuses (resets) every new connection until [`Proxy::up`].
    pub fn down(&self) {
        self.shared.down.store(true, Ordering::SeqCst);
    }

    /// A network cut: refuses new connections (until [`Proxy::up`]) and resets
    /// those open now.
    pub fn cut_off(&self) {
        self.down();
        self.cut();
    }

    /// Sends the next connection to backend `index` first.
    pub fn send_next_to(&self, index: usize) {
        self.shared.next.store(index, Ordering::SeqCst);
    }

    /// Takes new connections again.
    pub fn up(&self) {
        self.shared.down.store(false, Ordering::SeqCst);
    }

    /// Holds every byte of the connections open now, closing nothing; new
    /// connections flow. A later cut resets the stalled ones too.
    pub fn stall(&self) {
        if let Ok(mut generation) = self.shared.generation.lock() {
            generation.1.stalled.send_replace(true);
            generation.1 = Generation::under(&generation.0);
        }
    }

    /// Holds every byte clients send, on every connection, until
    /// [`Proxy::release_upstream`]; the nodes' bytes still reach the clients.
    pub fn hold_upstream(&self) {
        self.shared.upstream_held.send_replace(true);
    }

    /// Sends on what [`Proxy::hold_upstream`] held, in order.
    pub fn release_upstream(&self) {
        self.shared.upstream_held.send_replace(false);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.cancel();
        self.cut();
    }
}

async fn accept(listener: TcpListener, shared: Arc<Shared>, stop: CancellationToken) {
    loop {
        let inbound = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(_) => continue,
            },
            _ = stop.cancelled() => return,
        };
        if shared.down.load(Ordering::SeqCst) {
            let _ = inbound.set_zero_linger();
            continue;
        }
        let generation = match shared.generation.lock() {
            Ok(g) => g.1.clone(),
            Err(_) => return,
        };
        let backends = shared.backends.clone();
        let Generation {
            cut: generation,
            stalled: stall_sender,
        } = generation;
        let stalled = stall_sender.subscribe();
        let held = shared.upstream_held.subscribe();
        let first = shared.next.fetch_add(1, Ordering::SeqCst);
        tokio::spawn(async move {
            // The next node that accepts; a client whose nodes are all down sees
            // its connection closed, as behind a real balancer.
            for i in 0..backends.len() {
                let backend = backends[(first + i) % backends.len()];
                if let Ok(outbound) = TcpStream::connect(backend).await {
                    relay(inbound, outbound, generation, stalled, held).await;
                    drop(stall_sender);
                    return;
                }
            }
        });
    }
}

async fn relay(
    inbound: TcpStream,
    outbound: TcpStream,
    cut: CancellationToken,
    stalled: watch::Receiver<bool>,
    held: watch::Receiver<bool>,
) {
    let _ = inbound.set_nodelay(true);
    let _ = outbound.set_nodelay(true);
    let (mut in_read, mut in_write) = inbound.into_split();
    let (mut out_read, mut out_write) = outbound.into_split();
    tokio::select! {
        _ = pump(&mut in_read, &mut out_write, stalled.clone(), Some(held)) => {}
        _ = pump(&mut out_read, &mut in_write, stalled, None) => {}
        _ = cut.cancelled() => {}
    }
    // A zero linger turns the close into a reset on both sides.
    if let (Ok(a), Ok(b)) = (in_read.reunite(in_write), out_read.reunite(out_write)) {
        let _ = a.set_zero_linger();
        let _ = b.set_zero_linger();
    }
}

/// Copies one direction, holding what it read while the proxy is stalled (or,
/// for clients' bytes, `held`).
async fn pump(
    from: &mut tokio::net::tcp::OwnedReadHalf,
    to: &mut tokio::net::tcp::OwnedWriteHalf,
    mut stalled: watch::Receiver<bool>,
    mut held: Option<watch::Receiver<bool>>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if stalled.wait_for(|s| !*s).await.is_err() {
            return;
        }
        if let Some(held) = held.as_mut()
            && held.wait_for(|h| !*h).await.is_err()
        {
            return;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}
