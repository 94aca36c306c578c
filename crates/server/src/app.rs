//! Start-up: [`start`] opens the store, loads the keys, builds the [`AppState`], binds one
//! listener per chosen service and serves them until [`Running::shutdown`]. `hearth serve` and
//! the integration tests both go through [`start`]; only the CLI imports this module.

use axum::response::IntoResponse;
use axum::Router;
use chrono::Utc;
use hearth_auth::{IdentityProvider, OidcIdp, ServiceTokens, SharedSecretIdp};
use hearth_billing::{Journal, JournalError, Meter};
use hearth_store::{Location, Store, StoreOptions};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tower_http::trace::{DefaultMakeSpan, TraceLayer};
use tracing::Level;

use crate::config::{Config, IdpChoice, StoreChoice};
use crate::error::{ApiError, ErrorKind, MarkdownError};
use crate::metrics::Metrics;
use crate::model_table::{self, RawModelTable, TableError};
use crate::serve::{self, BodyTimeout};
use crate::service::{ErrorShape, Service, ServiceInitError};
use crate::services;
use crate::state::{AdminKey, AppState, ServiceUrls};

/// Where things live in the data dir.
pub mod paths {
    use std::path::{Path, PathBuf};

    /// The sled database folder.
    pub fn store(data_dir: &Path) -> PathBuf {
        data_dir.join("db")
    }
    /// HS256 secret of service tokens (0600, created on first start).
    pub fn service_token_secret(data_dir: &Path) -> PathBuf {
        data_dir.join("service-token.secret")
    }
    /// HS256 secret of the built-in `shared-secret` identity provider (0600).
    pub fn idp_secret(data_dir: &Path) -> PathBuf {
        data_dir.join("idp.secret")
    }
    /// Key that authorizes the admin API on the auth listener (0600).
    pub fn admin_key(data_dir: &Path) -> PathBuf {
        data_dir.join("admin.key")
    }
    /// Written while a server runs on this data dir: its pid and the admin API's address, so
    /// that the CLI finds it whatever addresses it was started with.
    pub fn server(data_dir: &Path) -> PathBuf {
        data_dir.join("server.json")
    }
    /// This node's id on its holds, made at first start when `[store] node_id` is not set.
    pub fn node_id(data_dir: &Path) -> PathBuf {
        data_dir.join("node-id")
    }
    /// Settlements the store could not take yet, a file per hold (`hearth_billing::Journal`).
    pub fn journal(data_dir: &Path) -> PathBuf {
        data_dir.join("journal")
    }
}

/// Why the server could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("cannot open the store: {0}")]
    Store(#[from] hearth_store::Error),
    #[error(transparent)]
    Journal(#[from] JournalError),
    #[error("cannot load key material: {0}")]
    Keys(#[from] hearth_auth::Error),
    #[error("cannot listen for the {service} service on {addr}: {source}")]
    Bind {
        service: Service,
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error(transparent)]
    ModelTable(#[from] TableError),
    #[error(transparent)]
    Service(#[from] ServiceInitError),
}

/// A started server.
pub struct Running {
    /// Bound address of each running service.
    pub addrs: HashMap<Service, SocketAddr>,
    pub state: AppState,
    shutdown: CancellationToken,
    tasks: Vec<JoinHandle<()>>,
    /// Hands journaled settlements to the store; stopped after the listeners, once nothing can
    /// settle any more (`Journal::run`).
    journal: JournalTask,
}

struct JournalTask {
    stop: CancellationToken,
    task: JoinHandle<()>,
}

impl Running {
    pub fn addr(&self, service: Service) -> Option<SocketAddr> {
        self.addrs.get(&service).copied()
    }

    /// Public base URL of a service.
    pub fn url(&self, service: Service) -> &str {
        self.state.urls.get(service)
    }

    /// A handle that stops the server when cancelled.
    pub fn shutdown_token(&self) -> CancellationToken {
        self.shutdown.clone()
    }

    /// Stops accepting, lets requests in flight finish, and waits for every service to end:
    /// connections still open `server.shutdown_timeout` after the call are dropped, so this
    /// returns within about that deadline whatever the clients do.
    pub async fn shutdown(self) {
        self.shutdown.cancel();
        self.wait().await;
    }

    /// Waits until the server stops: at most `server.shutdown_timeout` after the shutdown token
    /// is cancelled.
    pub async fn wait(self) {
        for t in self.tasks {
            let _ = t.await;
        }
        // Every stream has settled: the journal makes its last pass and stops.
        self.journal.stop.cancel();
        let _ = self.journal.task.await;
        // Make sure every acknowledged write is on disk before the process goes.
        if let Err(e) = self.state.store.health_check().await {
            tracing::warn!(error = %e, "store not healthy at shutdown");
        }
        let file = paths::server(&self.state.config.data_dir);
        if read_server_file(&file).is_some_and(|s| s.pid == std::process::id()) {
            let _ = std::fs::remove_file(file);
        }
    }
}

async fn open_identity_provider(
    config: &Config,
    store: &Store,
) -> Result<IdentityProvider, StartError> {
    Ok(match &config.auth.identity_provider {
        IdpChoice::SharedSecret => {
            let secret = shared_secret(store, &paths::idp_secret(&config.data_dir)).await?;
            IdentityProvider::SharedSecret(SharedSecretIdp::new(secret.as_bytes()))
        }
        IdpChoice::Oidc(oidc) => IdentityProvider::Oidc(OidcIdp::new(oidc.clone())?),
    })
}

/// A secret every node must agree on (the service-token key, the built-in identity provider's
/// key), named by its file in the data dir. With the embedded store it is that file (0600,
/// made at first start). With a shared store it lives in the database's `meta` table under the
/// file's name, made by the first node to start, so every node signs and verifies alike; it is
/// stored as it is (whoever can write that database can already change balances).
pub async fn shared_secret(store: &Store, file: &Path) -> Result<String, StartError> {
    if !store.is_shared() {
        return Ok(hearth_auth::load_or_create_secret(file)?);
    }
    let key = file
        .file_name()
        .map_or_else(|| "secret".into(), |n| n.to_string_lossy().into_owned());
    Ok(store.shared_value(&key, hearth_auth::new_secret).await?)
}

/// Opens the configured store (sled in the data dir, or PostgreSQL) with the configured
/// initial balance, as this node.
pub async fn open_store(config: &Config) -> Result<Store, hearth_store::Error> {
    let location = match &config.store.choice {
        StoreChoice::Embedded => Location::Dir(paths::store(&config.data_dir)),
        StoreChoice::Postgres(url) => Location::Url(url.clone()),
    };
    let options = StoreOptions {
        initial_balance: config.billing.initial_balance,
        node_id: node_id(config)?,
        max_connections: config.store.max_connections,
        acquire_timeout: config.store.acquire_timeout,
    };
    Store::open_at(&location, options).await
}

/// `[store] node_id`, else the id kept in the data dir, made at first start.
fn node_id(config: &Config) -> Result<String, hearth_store::Error> {
    if let Some(id) = &config.store.node_id {
        return Ok(id.clone());
    }
    let path = paths::node_id(&config.data_dir);
    let io = |source| hearth_store::Error::Io {
        path: path.clone(),
        source,
    };
    match std::fs::read_to_string(&path) {
        Ok(id) if !id.trim().is_empty() => return Ok(id.trim().to_string()),
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io(e)),
    }
    std::fs::create_dir_all(&config.data_dir).map_err(io)?;
    let id = format!("node-{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
    std::fs::write(&path, format!("{id}\n")).map_err(io)?;
    Ok(id)
}

/// Starts the configured services and returns once every listener is bound and serving.
pub async fn start(config: Config) -> Result<Running, StartError> {
    let store = open_store(&config).await?;
    // Settlements this node promised while the store was unreachable go in before the holds of
    // its earlier life are released, so none of them turns into a free answer.
    let journal = Journal::open(paths::journal(&config.data_dir))?;
    let replayed = journal.replay(&store).await?;
    if replayed.left > 0 {
        return Err(hearth_store::Error::Unavailable {
            retry_after: hearth_store::RETRY_AFTER,
        }
        .into());
    }
    if replayed.applied + replayed.already_closed > 0 {
        tracing::warn!(
            applied = replayed.applied,
            already_closed = replayed.already_closed,
            "settlements journaled by an earlier life reached the store"
        );
    }
    store.release_stale_holds().await?;
    store.purge_expired(Utc::now()).await?;
    let secret = shared_secret(&store, &paths::service_token_secret(&config.data_dir)).await?;
    let tokens = ServiceTokens::new(
        secret.as_bytes(),
        config.auth.issuer.clone(),
        config.auth.audience.clone(),
    );
    let idp = open_identity_provider(&config, &store).await?;
    let admin_key = hearth_auth::load_or_create_secret(&paths::admin_key(&config.data_dir))?;

    // Bind everything first so that URLs derived from ephemeral ports are known to every page.
    let mut listeners = Vec::new();
    let mut addrs = HashMap::new();
    for &service in &config.services {
        let addr = service.addr(&config);
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|source| StartError::Bind {
                service,
                addr,
                source,
            })?;
        let bound = listener.local_addr().map_err(|source| StartError::Bind {
            service,
            addr,
            source,
        })?;
        addrs.insert(service, bound);
        listeners.push((service, listener));
    }
    let urls = Service::ALL
        .into_iter()
        .map(|s| {
            let url = s.public_url(&config).map_or_else(
                || {
                    format!(
                        "http://{}",
                        addrs.get(&s).copied().unwrap_or(s.addr(&config))
                    )
                },
                str::to_string,
            );
            (s, url)
        })
        .collect();

    // A service that only borrows from the table (the markdown service's `?chunks=`
    // tokenizers) reads it when the file is there; a missing table is no error for it.
    let borrows = config
        .services
        .iter()
        .any(|s| s.facts().borrows_model_table);
    let model_table = if config.services.iter().any(|s| s.facts().reads_model_table)
        || (borrows && config.models.exists())
    {
        model_table::load(&config.models)?
    } else {
        RawModelTable::default()
    };

    let shutdown = CancellationToken::new();
    let hub = crate::models::Hub::start(
        crate::models::HubConfig {
            budget: config.loading.budget.clone(),
            load_wait: config.loading.load_wait,
            keep_alive: config.loading.keep_alive,
            table: config.models.clone(),
        },
        shutdown.clone(),
    );
    let state = AppState {
        model_table: Arc::new(model_table),
        hub,
        billing: Meter::new(store.clone(), config.billing.default_margin)
            .with_journal(Arc::clone(&journal)),
        config: Arc::new(config),
        store,
        tokens: Arc::new(tokens),
        idp: Arc::new(idp),
        admin_key: AdminKey(admin_key.into()),
        urls: Arc::new(ServiceUrls(urls)),
        metrics: Metrics::default(),
        shutdown: shutdown.clone(),
    };

    let mut tasks = Vec::new();
    for (service, listener) in listeners {
        // The listener's money is counted under its service (`/metrics`).
        let own = AppState {
            billing: state.billing.for_service(service.name()),
            ..state.clone()
        };
        let router =
            with_common_layers(services::router(service, own.clone()).await?, &own, service);
        let addr = addrs[&service];
        tracing::info!(service = %service, addr = %addr, "listening");
        let listener = serve::Listener {
            tcp: listener,
            router,
            config: state.config.server.clone(),
            on_body_timeout: body_timeout_response(service),
        };
        tasks.push(tokio::spawn(serve::serve(listener, shutdown.clone())));
    }
    tasks.push(tokio::spawn(purge_loop(
        state.store.clone(),
        shutdown.clone(),
    )));
    let journal_stop = CancellationToken::new();
    let journal = JournalTask {
        task: tokio::spawn(
            journal.run(state.store.clone(), journal_stop.clone().cancelled_owned()),
        ),
        stop: journal_stop,
    };
    if let Some(&auth) = addrs.get(&Service::Auth) {
        write_server_file(&state.config.data_dir, auth);
    }
    Ok(Running {
        addrs,
        state,
        shutdown,
        tasks,
        journal,
    })
}

/// The 408 a request whose body timed out gets, in its service's error shape.
fn body_timeout_response(service: Service) -> serve::TimeoutResponse {
    match service.facts().errors {
        ErrorShape::Plain => {
            |timeout: &BodyTimeout| MarkdownError::BodyTimeout(timeout.to_string()).into_response()
        }
        ErrorShape::Api => |timeout: &BodyTimeout| {
            ApiError::new(ErrorKind::RequestTimeout, format!("body: {timeout}"))
                .with_details(serde_json::json!({ "field": "body" }))
                .into_response()
        },
    }
}

/// Layers every service shares: a request span, the body size limit, and the request series
/// of `/metrics` (outermost, so they time everything; added with `Router::layer`, so they run
/// after routing and see the matched route's template).
fn with_common_layers(router: Router, state: &AppState, service: Service) -> Router {
    let requests = state.metrics.http(service).clone();
    router
        .layer(axum::extract::DefaultBodyLimit::max(
            state.config.max_body_bytes,
        ))
        .layer(TraceLayer::new_for_http().make_span_with(DefaultMakeSpan::new().level(Level::INFO)))
        .layer(axum::middleware::from_fn_with_state(
            requests,
            crate::metrics::record,
        ))
}

/// Forgets revocations of tokens that have expired anyway, hourly.
async fn purge_loop(store: Store, shutdown: CancellationToken) {
    let mut tick = tokio::time::interval(Duration::from_secs(3600));
    tick.tick().await;
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => {
                match store.purge_expired(Utc::now()).await {
                    Ok(n) if n > 0 => tracing::info!(removed = n, "purged expired revocations"),
                    Ok(_) => {}
                    Err(e) => tracing::warn!(error = %e, "purging expired revocations failed"),
                }
            }
        }
    }
}

/// What `<data_dir>/server.json` says about the server running there.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct ServerFile {
    pub pid: u32,
    /// Base URL of the auth listener (the admin API), reachable from this machine.
    pub auth_url: String,
}

fn write_server_file(data_dir: &Path, auth: SocketAddr) {
    let mut addr = auth;
    if addr.ip().is_unspecified() {
        addr.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
    }
    let info = ServerFile {
        pid: std::process::id(),
        auth_url: format!("http://{addr}"),
    };
    let path = paths::server(data_dir);
    let text = serde_json::to_string(&info).unwrap_or_default();
    if let Err(e) = std::fs::write(&path, text) {
        tracing::warn!(path = %path.display(), error = %e, "cannot record the server's address for the CLI");
    }
}

/// The server recorded in `path`, if the file is there and readable.
pub fn read_server_file(path: &Path) -> Option<ServerFile> {
    serde_json::from_str(&std::fs::read_to_string(path).ok()?).ok()
}

/// Makes `path` absolute against the current directory (for messages and stable data dirs).
pub fn absolute(path: &Path) -> PathBuf {
    std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf())
}
