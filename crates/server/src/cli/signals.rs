//! Ctrl-C and SIGTERM (shut down) and SIGHUP (reload the model table) for `hearth serve`.

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

/// Reloads the model table on every SIGHUP until `stop` (what `hearth models reload` does; a
/// table with an error is logged and changes nothing).
pub(super) fn reload_on_hangup(hub: crate::models::Hub, stop: tokio_util::sync::CancellationToken) {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let mut hangups = match signal(SignalKind::hangup()) {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "cannot listen for SIGHUP: reload with `hearth models reload`");
                return;
            }
        };
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    got = hangups.recv() => if got.is_none() { return },
                }
                tracing::info!("SIGHUP: reloading the model table");
                match hub.reload().await {
                    Ok(changes) => tracing::info!(?changes, "SIGHUP: model table applied"),
                    Err(e) => {
                        tracing::error!(error = %e, "SIGHUP: the model table has an error; every model stays as it was")
                    }
                }
            }
        });
    }
    #[cfg(not(unix))]
    let _ = (hub, stop);
}
