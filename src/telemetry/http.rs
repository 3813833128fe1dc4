//! The HTTP endpoint of `loopwarden run`: `/metrics` (Prometheus text format),
//! `/healthz` (200 unless a state store write has been in progress for longer than
//! `state.write_stall_secs`, then 503) and `/readyz` (200 once assigned
//! partitions are restored and consuming, 503 before, during a restore and while
//! shutting down).
//!
//! Guarantees: the address is bound before `serve` returns, so a port already in use is
//! a clear start-up error, not a later surprise; the server lives on its own thread and
//! runtime and stops when the shutdown token fires.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;

use super::{Liveness, Telemetry};
use crate::shutdown::Shutdown;

/// Why the HTTP endpoint could not start (fatal at start-up).
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    #[error("cannot listen on {addr} (telemetry.http_listen): {source}")]
    Bind {
        addr: String,
        source: std::io::Error,
    },
    #[error("cannot start the HTTP server's thread: {0}")]
    Thread(std::io::Error),
}

/// A running HTTP endpoint.
pub struct HttpServer {
    pub local_addr: SocketAddr,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl HttpServer {
    /// Waits for the server to stop (after the shutdown token fired).
    pub fn join(mut self) {
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[derive(Clone)]
struct AppState {
    telemetry: Arc<Telemetry>,
    shutdown: Shutdown,
}

async fn metrics(State(s): State<AppState>) -> impl IntoResponse {
    let t = &s.telemetry;
    let longest = t.liveness.longest_write(Instant::now()).unwrap_or_default();
    t.metrics
        .store_write_in_progress_seconds
        .set(longest.as_secs() as i64);
    (
        [(header::CONTENT_TYPE, prometheus::TEXT_FORMAT)],
        t.metrics.render(),
    )
}

async fn healthz(State(s): State<AppState>) -> impl IntoResponse {
    health(&s.telemetry.liveness, Instant::now())
}

/// `/healthz` at `now`: alive unless a store write has been in progress for longer than
/// the bound (then the orchestrator's liveness probe restarts the process, which
/// restores from the changelog and the stored offsets; waiting would not end it).
fn health(liveness: &Liveness, now: Instant) -> (StatusCode, String) {
    match liveness.stalled_write(now) {
        None => (StatusCode::OK, "ok\n".to_string()),
        Some(stalled) => {
            let bound = liveness.write_stall().as_secs();
            tracing::error!(
                in_progress_secs = stalled.as_secs(),
                write_stall_secs = bound,
                "state store write stuck; reporting not live"
            );
            (
                StatusCode::SERVICE_UNAVAILABLE,
                format!(
                    "not live: a state store write has been in progress for {} s, longer than \
                     state.write_stall_secs ({bound} s); a restart restores from the changelog \
                     and the stored offsets\n",
                    stalled.as_secs()
                ),
            )
        }
    }
}

async fn readyz(State(s): State<AppState>) -> impl IntoResponse {
    let r = &s.telemetry.readiness;
    if r.is_ready() && !s.shutdown.is_triggered() {
        (StatusCode::OK, "ready\n".to_string())
    } else {
        let why = if s.shutdown.is_triggered() {
            "shutting down"
        } else {
            r.describe()
        };
        (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {why}\n"),
        )
    }
}

/// Binds `addr` and serves the endpoints until `shutdown` fires.
pub fn serve(
    addr: &str,
    telemetry: Arc<Telemetry>,
    shutdown: Shutdown,
) -> Result<HttpServer, HttpError> {
    let bind_error = |source| HttpError::Bind {
        addr: addr.to_string(),
        source,
    };
    let listener = std::net::TcpListener::bind(addr).map_err(bind_error)?;
    listener.set_nonblocking(true).map_err(bind_error)?;
    let local_addr = listener.local_addr().map_err(bind_error)?;
    let app = Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(AppState {
            telemetry,
            shutdown: shutdown.clone(),
        });
    let thread = std::thread::Builder::new()
        .name("lw-http".into())
        .spawn(move || {
            let runtime = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(r) => r,
                Err(error) => {
                    tracing::error!(%error, "cannot start the HTTP server's runtime");
                    return;
                }
            };
            runtime.block_on(async move {
                let listener = match tokio::net::TcpListener::from_std(listener) {
                    Ok(l) => l,
                    Err(error) => {
                        tracing::error!(%error, "cannot serve HTTP");
                        return;
                    }
                };
                let stop = async move {
                    while !shutdown.is_triggered() {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                };
                if let Err(error) = axum::serve(listener, app)
                    .with_graceful_shutdown(stop)
                    .await
                {
                    tracing::error!(%error, "HTTP server stopped");
                }
            });
        })
        .map_err(HttpError::Thread)?;
    tracing::info!(addr = %local_addr, "serving /metrics, /healthz and /readyz");
    Ok(HttpServer {
        local_addr,
        thread: Some(thread),
    })
}
