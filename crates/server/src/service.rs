//! The services Hearth runs, each on its own listener, and the one table of what differs
//! between them ([`Facts`]): name, where its address and public URL are configured, the shape of
//! its error bodies, how its health answers fail, and its page's labels. A leaf: it imports no
//! service, so every service, page and the start-up can read it.
//!
//! Adding a service: a variant of [`Service`] and its row in [`Service::facts`] (here), its
//! `[name]` section of `hearth.toml` (`config/`), its module `services/<name>.rs` with
//! `router(AppState)`, and its arm in `services::router`. Nothing else names services one by one
//! (ARCHITECTURE.md, "Adding a service").

use std::fmt;
use std::net::SocketAddr;
use std::str::FromStr;

use axum::http::StatusCode;

use crate::config::Config;

/// A service Hearth can run; each gets its own listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Service {
    Auth,
    Completion,
    Markdown,
    Imagine,
}

/// How a service's errors look on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorShape {
    /// `{"error": {"type", "message", "details"}}` ([`crate::ApiError`]).
    Api,
    /// `{"error": "<message>"}` (spec section 7 for the markdown service).
    Plain,
}

/// The money a service moves, exported under its name in `/metrics`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MoneyMoved {
    /// Holds placed, charged and released (the paid services).
    Holds,
    /// Credits and debits by the admin API.
    AdminCredits,
    Nothing,
}

/// Everything that differs from one service to the next.
pub struct Facts {
    /// The name in `services = [...]`, `/metrics` labels and logs.
    pub name: &'static str,
    /// Where it listens (`[name] addr`).
    pub addr: fn(&Config) -> SocketAddr,
    /// Its public base URL, when configured (`[name] public_url`).
    pub public_url: fn(&Config) -> Option<&str>,
    pub errors: ErrorShape,
    /// Health's `status` word and HTTP status when a check fails (spec 3.3).
    pub unhealthy: (&'static str, StatusCode),
    pub money: MoneyMoved,
    /// Whether it serves models of the model table (`models.toml`, read once at start).
    pub reads_model_table: bool,
    /// Reads the model table when the file is there, and runs without it (the markdown
    /// service, for `?chunks=`'s tokenizers).
    pub borrows_model_table: bool,
    /// The page header's link to its `/ui`.
    pub nav_label: &'static str,
    /// The sign-in page's link onward to it, for the services a user goes on to.
    pub onward_label: Option<&'static str>,
}

impl Service {
    /// Every service, in start order (and the header's link order); the default of `services`.
    pub const ALL: [Service; 4] = [
        Service::Auth,
        Service::Completion,
        Service::Markdown,
        Service::Imagine,
    ];

    /// The one table of per-service facts.
    pub fn facts(self) -> &'static Facts {
        match self {
            Service::Auth => &Facts {
                name: "auth",
                reads_model_table: false,
                borrows_model_table: false,
                money: MoneyMoved::AdminCredits,
                addr: |c| c.auth.addr,
                public_url: |c| c.auth.public_url.as_deref(),
                errors: ErrorShape::Api,
                unhealthy: ("unhealthy", StatusCode::SERVICE_UNAVAILABLE),
                nav_label: "Account",
                onward_label: None,
            },
            Service::Completion => &Facts {
                name: "completion",
                reads_model_table: true,
                borrows_model_table: false,
                money: MoneyMoved::Holds,
                addr: |c| c.completion.addr,
                public_url: |c| c.completion.public_url.as_deref(),
                errors: ErrorShape::Api,
                unhealthy: ("failing", StatusCode::INTERNAL_SERVER_ERROR),
                nav_label: "Chat",
                onward_label: Some("Chat"),
            },
            Service::Markdown => &Facts {
                name: "markdown",
                reads_model_table: false,
                borrows_model_table: true,
                money: MoneyMoved::Nothing,
                addr: |c| c.markdown.addr,
                public_url: |c| c.markdown.public_url.as_deref(),
                errors: ErrorShape::Plain,
                unhealthy: ("degraded", StatusCode::SERVICE_UNAVAILABLE),
                nav_label: "Documents",
                onward_label: Some("Convert documents"),
            },
            Service::Imagine => &Facts {
                name: "imagine",
                reads_model_table: true,
                borrows_model_table: false,
                money: MoneyMoved::Holds,
                addr: |c| c.imagine.addr,
                public_url: |c| c.imagine.public_url.as_deref(),
                errors: ErrorShape::Api,
                unhealthy: ("failing", StatusCode::INTERNAL_SERVER_ERROR),
                nav_label: "Images",
                onward_label: Some("Make images"),
            },
        }
    }

    pub fn name(self) -> &'static str {
        self.facts().name
    }

    /// Where this service listens, as configured.
    pub fn addr(self, config: &Config) -> SocketAddr {
        (self.facts().addr)(config)
    }

    /// This service's configured public base URL, if any.
    pub fn public_url(self, config: &Config) -> Option<&str> {
        (self.facts().public_url)(config)
    }

    /// Health's `status` word and HTTP status (spec 3.3): `healthy` and 200, or the service's
    /// failing word and status.
    pub fn health(self, healthy: bool) -> (&'static str, StatusCode) {
        if healthy {
            ("healthy", StatusCode::OK)
        } else {
            self.facts().unhealthy
        }
    }
}

impl fmt::Display for Service {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown service {name:?}: expected {}", Service::ALL.map(Service::name).join(", "), name = .0)]
pub struct UnknownService(pub String);

impl FromStr for Service {
    type Err = UnknownService;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Service::ALL
            .into_iter()
            .find(|svc| svc.name() == s.trim())
            .ok_or_else(|| UnknownService(s.to_string()))
    }
}

/// A service failed to get ready (a model would not load, say).
#[derive(Debug, thiserror::Error)]
#[error("{service} service failed to start: {source}")]
pub struct ServiceInitError {
    pub service: Service,
    #[source]
    pub source: Box<dyn std::error::Error + Send + Sync>,
}

impl ServiceInitError {
    pub fn new(
        service: Service,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        Self {
            service,
            source: source.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_service_parses_from_its_name_and_nothing_else_does() {
        for s in Service::ALL {
            assert_eq!(s.name().parse::<Service>(), Ok(s));
        }
        let err = "teleport".parse::<Service>().unwrap_err().to_string();
        assert!(err.contains("auth, completion, markdown, imagine"), "{err}");
    }

    #[test]
    fn names_and_labels_are_unique() {
        let mut names: Vec<_> = Service::ALL.map(Service::name).to_vec();
        let mut labels: Vec<_> = Service::ALL.map(|s| s.facts().nav_label).to_vec();
        names.sort();
        names.dedup();
        labels.sort();
        labels.dedup();
        assert_eq!((names.len(), labels.len()), (4, 4));
    }

    #[test]
    fn health_fails_with_the_spec_status_of_each_service() {
        use StatusCode as S;
        let failing: Vec<_> = Service::ALL.map(|s| s.health(false)).to_vec();
        assert_eq!(
            failing,
            [
                ("unhealthy", S::SERVICE_UNAVAILABLE),
                ("failing", S::INTERNAL_SERVER_ERROR),
                ("degraded", S::SERVICE_UNAVAILABLE),
                ("failing", S::INTERNAL_SERVER_ERROR),
            ]
        );
        assert!(Service::ALL
            .iter()
            .all(|s| s.health(true) == ("healthy", S::OK)));
    }

    /// What the module comment promises, checked as an engineer would check it: reading the
    /// source. A service's variant is named here, in `services::router`'s arm, and in its own
    /// module; elsewhere only the auth service is, as the home of sign-in (the pages' link) and
    /// of the admin API (the CLI's `server.json`). Anything else that names a service one by one
    /// belongs in the table.
    #[test]
    fn services_are_named_one_by_one_only_in_the_table_the_router_and_their_own_modules() {
        let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut files = vec![src.clone()];
        let mut offenders = Vec::new();
        while let Some(path) = files.pop() {
            if path.is_dir() {
                files.extend(std::fs::read_dir(&path).unwrap().map(|e| e.unwrap().path()));
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let rel = path
                .strip_prefix(&src)
                .unwrap()
                .to_string_lossy()
                .replace('\\', "/");
            let text = std::fs::read_to_string(&path).unwrap();
            // Tests may name any service: only the code counts.
            let text = text.split("#[cfg(test)]").next().unwrap_or_default();
            if rel.ends_with("tests.rs") || rel.contains("/tests/") {
                continue;
            }
            for service in Service::ALL {
                let variant = format!("Service::{service:?}");
                let own = |m: &str| {
                    rel == format!("services/{m}.rs") || rel.starts_with(&format!("services/{m}/"))
                };
                let allowed = rel == "service.rs"
                    || rel == "services/mod.rs"
                    || own(service.name())
                    || (service == Service::Auth
                        && (own("admin") || rel == "app.rs" || rel == "pages/mod.rs"));
                for (i, line) in text.lines().enumerate() {
                    let named = line.match_indices(&variant).any(|(at, _)| {
                        !line[at + variant.len()..].starts_with(|c: char| c.is_alphanumeric())
                    });
                    if named && !allowed {
                        offenders.push(format!("{rel}:{}: {}", i + 1, line.trim()));
                    }
                }
            }
        }
        assert!(
            offenders.is_empty(),
            "services named outside the table:\n{}",
            offenders.join("\n")
        );
    }
}
