//! The metadata probe that guards hf-hub against hostile headers: before hf-hub touches the disk,
//! the same metadata question hf-hub 0.4.3 will ask (`GET` with `Range: bytes=0-0`, relative
//! redirects followed, then the absolute one), with the answers hf-hub would mishandle refused:
//! an etag or commit that is not a plain name, a redirect without a usable `Location`, endless
//! relative redirects, a missing or non-numeric `Content-Range`. The token goes to the hub's own
//! origin only.

use std::time::Duration;

use super::names::check_name;
use super::{bad, status_failure, HubClient, PullFailure};

/// Relative redirects the probe follows before it calls the server broken.
const MAX_REDIRECTS: usize = 10;
const PROBE_CONNECT_TIMEOUT: Duration = Duration::from_secs(30);
const PROBE_READ_TIMEOUT: Duration = Duration::from_secs(60);
const USER_AGENT: &str = concat!("hearth-infer/", env!("CARGO_PKG_VERSION"));

/// What the probe learnt: the names hf-hub will use and the size it will expect.
#[derive(Debug)]
pub(super) struct Probe {
    pub(super) etag: String,
    pub(super) commit: String,
    pub(super) size: u64,
}

impl HubClient {
    fn agent(&self, redirects: u32) -> ureq::Agent {
        ureq::AgentBuilder::new()
            .try_proxy_from_env(true)
            .redirects(redirects)
            .timeout_connect(PROBE_CONNECT_TIMEOUT)
            .timeout_read(PROBE_READ_TIMEOUT)
            .build()
    }

    /// hf-hub's metadata request (`Api::metadata` in 0.4.3), asked first and checked: the
    /// etag, commit and size hf-hub will use, or why its answer would be unusable.
    pub(super) fn probe(&self, url: &str) -> Result<Probe, PullFailure> {
        let hub_origin = origin(url).ok_or_else(|| PullFailure::InvalidRequest {
            what: "endpoint",
            reason: format!("{url:?} is not an http(s) URL"),
        })?;
        let direct = self.agent(0);
        let mut response = self.probe_get(&direct, url, hub_origin)?;
        let mut hops = 0;
        while matches!(response.status(), 301 | 302 | 303 | 307 | 308) {
            let Some(location) = response.header("Location") else {
                break;
            };
            if !is_relative(location) {
                break;
            }
            hops += 1;
            if hops > MAX_REDIRECTS {
                return Err(bad(format!("more than {MAX_REDIRECTS} redirects")));
            }
            let next = format!("{hub_origin}{location}");
            response = self.probe_get(&direct, &next, hub_origin)?;
        }
        let etag = response
            .header("x-linked-etag")
            .or_else(|| response.header("etag"))
            .ok_or_else(|| bad("no ETag header"))?
            .replace('"', "");
        check_name(&etag, "ETag")?;
        let commit = response
            .header("x-repo-commit")
            .ok_or_else(|| bad("no X-Repo-Commit header"))?
            .to_string();
        check_name(&commit, "X-Repo-Commit")?;
        let response = if (300..400).contains(&response.status()) {
            let location = response
                .header("Location")
                .ok_or_else(|| bad(format!("HTTP {} without a Location", response.status())))?;
            if origin(location).is_none() {
                return Err(bad(format!("redirect to {location:?}")));
            }
            self.probe_get(&self.agent(5), location, hub_origin)?
        } else {
            response
        };
        let range = response
            .header("Content-Range")
            .ok_or_else(|| bad("no Content-Range header"))?;
        let size = range
            .rsplit('/')
            .next()
            .and_then(|total| total.trim().parse::<u64>().ok())
            .ok_or_else(|| bad(format!("Content-Range {range:?} has no size")))?;
        Ok(Probe { etag, commit, size })
    }

    fn probe_get(
        &self,
        agent: &ureq::Agent,
        url: &str,
        endpoint_origin: &str,
    ) -> Result<ureq::Response, PullFailure> {
        let mut request = agent
            .get(url)
            .set("Range", "bytes=0-0")
            .set("User-Agent", USER_AGENT);
        // The token goes to the hub only, never to the storage a redirect points at.
        if let (Some(token), true) = (&self.token, origin(url) == Some(endpoint_origin)) {
            request = request.set("Authorization", &format!("Bearer {token}"));
        }
        let response = request.call().map_err(|e| match e {
            ureq::Error::Status(status, _) => status_failure(status),
            ureq::Error::Transport(t) => PullFailure::Transport {
                reason: t.to_string(),
                partial: 0,
            },
        })?;
        if !(100..600).contains(&response.status()) {
            return Err(bad(format!("HTTP status {}", response.status())));
        }
        Ok(response)
    }
}

/// `scheme://authority` of an http(s) URL.
fn origin(url: &str) -> Option<&str> {
    let rest = url
        .strip_prefix("https://")
        .or_else(|| url.strip_prefix("http://"))?;
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    if authority.is_empty() {
        return None;
    }
    Some(&url[..url.len() - rest.len() + authority.len()])
}

/// A `Location` hf-hub follows itself, against the hub's origin: an absolute path.
fn is_relative(location: &str) -> bool {
    location.starts_with('/') && !location.starts_with("//")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origins_and_relative_locations() {
        assert_eq!(
            origin("http://127.0.0.1:8080/a/b"),
            Some("http://127.0.0.1:8080")
        );
        assert_eq!(origin("https://hf.co"), Some("https://hf.co"));
        assert_eq!(origin("https://hf.co?x"), Some("https://hf.co"));
        assert_eq!(origin("ftp://hf.co/a"), None);
        assert_eq!(origin("http:///a"), None);
        assert!(is_relative("/api/resolve-cache/x"));
        assert!(!is_relative("//evil/x"));
        assert!(!is_relative("x/y"));
    }
}
