//! Serving one listener: our own accept loop on hyper's HTTP/1 connection, so that every
//! connection is held to the `[server]` limits. A connection must send its request headers
//! within `header_read_timeout` of waiting for them (on a kept-alive connection that wait begins
//! after the last response, so this is also the idle timeout); a request body must keep the
//! [`Pace`] of `body_read_timeout` and `body_min_bytes_per_sec`, or the request is answered 408;
//! at most `max_connections` are open at once (past it, accepting waits and new clients queue in
//! the kernel's backlog). On shutdown the loop stops accepting, asks every connection to finish
//! its request in flight and close, and drops whatever is still open after `shutdown_timeout`.

mod body;
mod config;

pub use body::{BodyTimeout, Pace, TimedBody};
pub use config::{RawServerConfig, ServerConfig};

use axum::http::{header, HeaderValue, Request};
use axum::response::Response;
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// Renders the answer to a request whose body timed out, in a service's own error shape; the
/// server sends it with status 408 and `Connection: close`.
pub type TimeoutResponse = fn(&BodyTimeout) -> Response;

/// One listener's router and limits.
pub struct Listener {
    pub tcp: TcpListener,
    pub router: Router,
    pub config: ServerConfig,
    pub on_body_timeout: TimeoutResponse,
}

/// Serves `listener` until `shutdown` is cancelled, then drains its connections for at most
/// `shutdown_timeout` and returns.
pub async fn serve(listener: Listener, shutdown: CancellationToken) {
    let Listener {
        tcp,
        router,
        config,
        on_body_timeout,
    } = listener;
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(config.header_read_timeout);
    let conn = Arc::new(Conn {
        http,
        router,
        pace: Pace {
            frame_timeout: config.body_read_timeout,
            min_bytes_per_sec: config.body_min_bytes_per_sec,
        },
        on_body_timeout,
    });
    let slots = Arc::new(Semaphore::new(config.max_connections));
    let mut open = JoinSet::new();
    loop {
        let slot = tokio::select! {
            _ = shutdown.cancelled() => break,
            slot = slots.clone().acquire_owned() => slot.expect("the semaphore is never closed"),
        };
        let accepted = tokio::select! {
            _ = shutdown.cancelled() => break,
            accepted = tcp.accept() => accepted,
        };
        // Forget connections that have ended, so the set holds only open ones.
        while open.try_join_next().is_some() {}
        match accepted {
            Ok((stream, peer)) => {
                open.spawn(conn.clone().run(stream, peer, slot, shutdown.clone()));
            }
            Err(e) if is_connection_error(&e) => {}
            Err(e) => {
                // Out of file descriptors and the like: wait rather than spin.
                tracing::error!(error = %e, "accept failed; retrying in 1 s");
                tokio::select! {
                    _ = shutdown.cancelled() => break,
                    _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                }
            }
        }
    }
    drop(tcp);
    drain(open, config.shutdown_timeout).await;
}

/// Waits for the open connections (already told to finish) until `deadline`, then drops them.
async fn drain(mut open: JoinSet<()>, deadline: Duration) {
    let all_closed = async { while open.join_next().await.is_some() {} };
    if tokio::time::timeout(deadline, all_closed).await.is_err() {
        tracing::warn!(
            connections = open.len(),
            "shutdown deadline passed; dropping open connections"
        );
        open.shutdown().await;
    }
}

fn is_connection_error(e: &std::io::Error) -> bool {
    use std::io::ErrorKind as K;
    matches!(
        e.kind(),
        K::ConnectionRefused | K::ConnectionAborted | K::ConnectionReset
    )
}

/// What every connection of one listener shares.
struct Conn {
    http: hyper::server::conn::http1::Builder,
    router: Router,
    pace: Pace,
    on_body_timeout: TimeoutResponse,
}

impl Conn {
    async fn run(
        self: Arc<Self>,
        stream: TcpStream,
        peer: SocketAddr,
        _slot: OwnedSemaphorePermit,
        shutdown: CancellationToken,
    ) {
        // Token events are small writes: without TCP_NODELAY, Nagle's algorithm holds a
        // stream's first event back until the client's delayed ACK (~20-40 ms of TTFT).
        if let Err(e) = stream.set_nodelay(true) {
            tracing::warn!(error = %e, "cannot set TCP_NODELAY on a connection");
        }
        let this = self.clone();
        let service = hyper::service::service_fn(move |req| this.clone().handle(req));
        let connection = self
            .http
            .serve_connection(TokioIo::new(stream), service)
            .with_upgrades();
        let mut connection = std::pin::pin!(connection);
        let mut draining = false;
        let ended = loop {
            tokio::select! {
                ended = connection.as_mut() => break ended,
                _ = shutdown.cancelled(), if !draining => {
                    // Idle: closes now. Mid-request: answers it with `Connection: close`.
                    draining = true;
                    connection.as_mut().graceful_shutdown();
                }
            }
        };
        if let Err(e) = ended {
            tracing::debug!(%peer, error = %e, "connection ended with an error");
        }
    }

    async fn handle(self: Arc<Self>, req: Request<Incoming>) -> Result<Response, Infallible> {
        let tripped = body::Tripped::default();
        let req = req.map(|b| TimedBody::new(b, self.pace, tripped.clone()));
        let response = tower::Service::call(&mut self.router.clone(), req).await?;
        match tripped.get() {
            // The handler failed because the body timed out, whatever it made of that.
            Some(timeout) if !response.status().is_success() => {
                // Its status (408) comes from the service's error, like every other.
                let mut response = (self.on_body_timeout)(timeout);
                response
                    .headers_mut()
                    .insert(header::CONNECTION, HeaderValue::from_static("close"));
                Ok(response)
            }
            _ => Ok(response),
        }
    }
}
