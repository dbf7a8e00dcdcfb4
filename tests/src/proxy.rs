//! A TCP proxy the tests control, to make a broker unreachable mid-run and bring it back without touching
//! the shared server: [`Proxy::cut`] kills every open connection and refuses new ones until
//! [`Proxy::restore`].

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use tokio::net::{TcpListener, TcpStream};
use tokio::task::AbortHandle;

struct State {
    up: AtomicBool,
    connections: Mutex<Vec<AbortHandle>>,
}

/// A proxy from a local port to `upstream`.
pub struct Proxy {
    addr: SocketAddr,
    state: Arc<State>,
    accept: AbortHandle,
}

impl Proxy {
    /// Starts a proxy on an ephemeral port of 127.0.0.1 forwarding to `upstream` (`host:port`).
    pub async fn start(upstream: &str) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let addr = listener.local_addr().expect("proxy address");
        let state = Arc::new(State { up: AtomicBool::new(true), connections: Mutex::new(Vec::new()) });
        let upstream = upstream.to_owned();
        let accept_state = state.clone();
        let accept = tokio::spawn(async move {
            loop {
                let Ok((mut client, _)) = listener.accept().await else { continue };
                if !accept_state.up.load(Ordering::SeqCst) {
                    drop(client);
                    continue;
                }
                let upstream = upstream.clone();
                let task = tokio::spawn(async move {
                    if let Ok(mut server) = TcpStream::connect(&upstream).await {
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                    }
                });
                accept_state.connections.lock().expect("proxy lock").push(task.abort_handle());
            }
        })
        .abort_handle();
        Proxy { addr, state, accept }
    }

    /// The local address clients connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The local port clients connect to.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// Drops every open connection and refuses new ones: the broker is unreachable.
    pub fn cut(&self) {
        self.state.up.store(false, Ordering::SeqCst);
        for connection in self.state.connections.lock().expect("proxy lock").drain(..) {
            connection.abort();
        }
    }

    /// Accepts connections again.
    pub fn restore(&self) {
        self.state.up.store(true, Ordering::SeqCst);
    }

    /// An outage of `duration`: [`cut`](Self::cut), wait, [`restore`](Self::restore).
    pub async fn outage(&self, duration: std::time::Duration) {
        self.cut();
        tokio::time::sleep(duration).await;
        self.restore();
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.cut();
    }
}

/// Whether a server answers at `addr` (`host:port`). When it does not: panics under `CI=true`, otherwise
/// prints why the test is skipped and returns `false`.
pub async fn server_available(name: &str, addr: &str) -> bool {
    match tokio::time::timeout(std::time::Duration::from_secs(2), TcpStream::connect(addr)).await {
        Ok(Ok(_)) => true,
        outcome => {
            let reason = format!("{name} at {addr} is unreachable: {outcome:?}");
            if std::env::var("CI").is_ok_and(|v| v == "true" || v == "1") {
                panic!("CI=true but {reason}");
            }
            eprintln!("skipping: {reason}");
            false
        }
    }
}
