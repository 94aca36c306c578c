//! What the HTTP load generators (`loadgen`, `chat_turns`) share: reading server-sent events,
//! refusing any target but this machine, and their `main`.

use futures::StreamExt;

/// Reads a server-sent-events body, calling `on_data` with each `data:` payload as it arrives;
/// `on_data` returns false to stop.
pub async fn read_sse(
    response: reqwest::Response,
    mut on_data: impl FnMut(&str) -> bool,
) -> Result<(), String> {
    let mut body = response.bytes_stream();
    let mut buf: Vec<u8> = Vec::new();
    while let Some(chunk) = body.next().await {
        buf.extend_from_slice(&chunk.map_err(|e| format!("body: {e}"))?);
        while let Some(end) = buf.windows(2).position(|w| w == b"\n\n") {
            let event: Vec<u8> = buf.drain(..end + 2).collect();
            let text = String::from_utf8_lossy(&event);
            for line in text.lines() {
                if let Some(data) = line.strip_prefix("data:") {
                    if !on_data(data.trim_start()) {
                        return Ok(());
                    }
                }
            }
        }
    }
    Ok(())
}

/// `url` without a trailing slash, if it is `http://` on a loopback host.
pub fn loopback(url: &str) -> Result<String, String> {
    let url = url.trim_end_matches('/');
    let host = url
        .strip_prefix("http://")
        .and_then(|rest| rest.split(['/', ':']).next())
        .ok_or("--url must be http://127.0.0.1:PORT (loopback only)")?;
    if host == "localhost" || host.starts_with("127.") || host == "[" {
        Ok(url.to_string())
    } else {
        Err(format!(
            "--url host {host}: only loopback targets are allowed"
        ))
    }
}

/// A load generator's `main`: `run(args)` on a one-worker runtime (the server under test keeps
/// the cores); exits 2 on bad arguments and 1 when the run fails, with the message on stderr.
pub fn main_with<A, F>(name: &str, args: Result<A, String>, run: impl FnOnce(A) -> F)
where
    F: std::future::Future<Output = Result<(), String>>,
{
    let args = args.unwrap_or_else(|e| {
        eprintln!("{name}: {e}");
        std::process::exit(2);
    });
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("tokio runtime");
    if let Err(e) = runtime.block_on(run(args)) {
        eprintln!("{name}: {e}");
        std::process::exit(1);
    }
}

/// Sends `request`, a streamed POST to `url`; the response, or an error naming the url with the
/// status and body of a refusal.
pub async fn send(
    request: reqwest::RequestBuilder,
    url: &str,
) -> Result<reqwest::Response, String> {
    let response = request.send().await.map_err(|e| format!("{url}: {e}"))?;
    if !response.status().is_success() {
        let status = response.status();
        return Err(format!(
            "{url}: {status}: {}",
            response.text().await.unwrap_or_default()
        ));
    }
    Ok(response)
}
