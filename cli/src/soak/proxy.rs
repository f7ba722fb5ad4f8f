//! A TCP proxy between workers and nodes, the way a load balancer sits there: each
//! connection goes to the next node that accepts it. `cut` resets every open
//! connection at once (a network cut as both ends see it), and new connections
//! are taken again right away.

use std::{
    net::SocketAddr,
    sync::{Arc, Mutex},
};

use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

pub struct Proxy {
    pub addr: SocketAddr,
    shared: Arc<Shared>,
    stop: CancellationToken,
}

struct Shared {
    backends: Vec<SocketAddr>,
    /// Cancelled to reset every connection open now; replaced by a fresh one.
    generation: Mutex<CancellationToken>,
}

impl Proxy {
    pub async fn start(backends: Vec<SocketAddr>) -> std::io::Result<Proxy> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            backends,
            generation: Mutex::new(CancellationToken::new()),
        });
        let stop = CancellationToken::new();
        tokio::spawn(accept(listener, shared.clone(), stop.clone()));
        Ok(Proxy { addr, shared, stop })
    }

    /// Resets every connection open now.
    pub fn cut(&self) {
        if let Ok(mut generation) = self.shared.generation.lock() {
            generation.cancel();
            *generation = CancellationToken::new();
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.cancel();
        self.cut();
    }
}

async fn accept(listener: TcpListener, shared: Arc<Shared>, stop: CancellationToken) {
    let mut next = 0usize;
    loop {
        let inbound = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(_) => continue,
            },
            _ = stop.cancelled() => return,
        };
        let generation = match shared.generation.lock() {
            Ok(g) => g.clone(),
            Err(_) => return,
        };
        let backends = shared.backends.clone();
        let first = next;
        next = next.wrapping_add(1);
        tokio::spawn(async move {
            // The next node that accepts; a client whose nodes are all down sees
            // its connection closed, as behind a real balancer.
            for i in 0..backends.len() {
                let backend = backends[(first + i) % backends.len()];
                if let Ok(outbound) = TcpStream::connect(backend).await {
                    relay(inbound, outbound, generation).await;
                    return;
                }
            }
        });
    }
}

async fn relay(mut inbound: TcpStream, mut outbound: TcpStream, cut: CancellationToken) {
    let _ = inbound.set_nodelay(true);
    let _ = outbound.set_nodelay(true);
    tokio::select! {
        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
        _ = cut.cancelled() => {
            // A zero linger turns the close into a reset on both sides.
            let _ = inbound.set_zero_linger();
            let _ = outbound.set_zero_linger();
        }
    }
}
