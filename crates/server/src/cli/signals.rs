//! Ctrl-C and SIGTERM for `hearth serve`.

/// Ctrl-C and SIGTERM, listened to from the start, so that none is missed between two waits.
pub(super) struct Signals {
    #[cfg(unix)]
    interrupt: Option<tokio::signal::unix::Signal>,
    #[cfg(unix)]
    terminate: Option<tokio::signal::unix::Signal>,
}

impl Signals {
    pub(super) fn new() -> Self {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            let listen = |kind| match signal(kind) {
                Ok(s) => Some(s),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot listen for a signal");
                    None
                }
            };
            Self {
                interrupt: listen(SignalKind::interrupt()),
                terminate: listen(SignalKind::terminate()),
            }
        }
        #[cfg(not(unix))]
        Self {}
    }

    /// Waits for the next Ctrl-C or SIGTERM.
    pub(super) async fn next(&mut self) {
        #[cfg(unix)]
        {
            async fn recv(s: &mut Option<tokio::signal::unix::Signal>) {
                match s {
                    Some(s) => {
                        s.recv().await;
                    }
                    None => std::future::pending::<()>().await,
                }
            }
            tokio::select! {
                _ = recv(&mut self.interrupt) => {},
                _ = recv(&mut self.terminate) => {},
            }
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
