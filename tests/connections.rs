//! Every listener against slow and abusive clients (the `[server]` settings): headers that
//! trickle, bodies that stall or trickle, idle keep-alive connections, the connection cap, and a
//! shutdown that must end even while a client holds a request open. Raw TCP where the client
//! has to misbehave.

use crate::common::TestApp;
use hearth_server::serve::RawServerConfig;
use hearth_server::Service;
use serde_json::Value;
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio::time::{sleep, timeout};

async fn app_with(server: RawServerConfig) -> TestApp {
    TestApp::builder()
        .services(&[Service::Auth])
        .configure(|raw| raw.server = server)
        .spawn()
        .await
}

fn auth_addr(app: &TestApp) -> SocketAddr {
    app.running().addr(Service::Auth).expect("auth is running")
}

/// A response as read off the wire.
#[derive(Debug)]
struct Response {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Response {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).expect("a JSON body")
    }
}

/// One client connection spoken by hand, its halves apart so that a test can send and read at
/// once.
struct Raw {
    reader: BufReader<OwnedReadHalf>,
    writer: OwnedWriteHalf,
}

impl Raw {
    async fn connect(addr: SocketAddr) -> Self {
        let (read, writer) = TcpStream::connect(addr)
            .await
            .expect("connect")
            .into_split();
        Self {
            reader: BufReader::new(read),
            writer,
        }
    }

    /// Sends bytes; `false` once the server has closed the connection.
    async fn send(&mut self, bytes: &[u8]) -> bool {
        send(&mut self.writer, bytes).await
    }

    async fn response(&mut self) -> Option<Response> {
        read_response(&mut self.reader).await
    }

    /// Waits up to `limit` for the server to close the connection; `true` if it did.
    async fn closed_within(&mut self, limit: Duration) -> bool {
        let mut buf = [0u8; 1024];
        let read_to_end = async {
            loop {
                match self.reader.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {}
                }
            }
        };
        timeout(limit, read_to_end).await.is_ok()
    }
}

async fn send(writer: &mut OwnedWriteHalf, bytes: &[u8]) -> bool {
    writer.write_all(bytes).await.is_ok()
}

/// Reads one response with a Content-Length body; `None` when the connection closes first.
async fn read_response(reader: &mut BufReader<OwnedReadHalf>) -> Option<Response> {
    let mut line = String::new();
    if reader.read_line(&mut line).await.ok()? == 0 {
        return None;
    }
    let status = line.split(' ').nth(1)?.parse().ok()?;
    let mut headers = Vec::new();
    loop {
        line.clear();
        if reader.read_line(&mut line).await.ok()? == 0 {
            return None;
        }
        let Some((name, value)) = line.trim_end().split_once(':') else {
            break; // the blank line
        };
        headers.push((name.to_ascii_lowercase(), value.trim().to_string()));
    }
    let length = headers
        .iter()
        .find(|(n, _)| n == "content-length")
        .map_or(0, |(_, v)| v.parse().expect("a length"));
    let mut body = vec![0; length];
    reader.read_exact(&mut body).await.ok()?;
    Some(Response {
        status,
        headers,
        body,
    })
}

const HEALTH: &[u8] = b"GET / HTTP/1.1\r\nHost: hearth\r\n\r\n";
/// The sign-in page: unlike health, it writes nothing, so two connections may ask at once
/// (concurrent health checks of one store can report each other's stamp as a mismatch).
const PAGE: &[u8] = b"GET /ui HTTP/1.1\r\nHost: hearth\r\n\r\n";

/// A `POST /validate` whose body is `body`: the head, and the body to send separately.
fn validate_request(body: &str, content_length: usize) -> (String, Vec<u8>) {
    let head = format!(
        "POST /validate HTTP/1.1\r\nHost: hearth\r\nContent-Type: application/json\r\nContent-Length: {content_length}\r\n\r\n"
    );
    (head, body.as_bytes().to_vec())
}

fn secs(n: u64) -> Option<u64> {
    Some(n)
}

#[tokio::test]
async fn a_connection_trickling_its_headers_is_dropped_at_the_header_timeout() {
    let app = app_with(RawServerConfig {
        header_read_timeout_secs: secs(2),
        ..Default::default()
    })
    .await;
    let mut raw = Raw::connect(auth_addr(&app)).await;
    let started = Instant::now();
    let request = b"GET / HTTP/1.1\r\nHost: hearth\r\nX-Padding: a slow client sends this one byte a second\r\n\r\n";
    let mut closed_after = None;
    for byte in request.iter() {
        if !raw.send(&[*byte]).await || raw.closed_within(Duration::from_secs(1)).await {
            closed_after = Some(started.elapsed());
            break;
        }
    }
    let closed_after = closed_after.expect("the server waited for the whole trickled request");
    assert!(
        closed_after >= Duration::from_millis(1500) && closed_after <= Duration::from_secs(4),
        "closed after {closed_after:?}, the header timeout is 2 s"
    );
    // Everyone else is still served.
    let (status, _) = app.get(Service::Auth, "/").await;
    assert_eq!(status, 200);
}

#[tokio::test]
async fn a_stalled_body_is_answered_408_at_the_body_timeout_while_others_are_served() {
    let app = app_with(RawServerConfig {
        body_read_timeout_secs: secs(2),
        ..Default::default()
    })
    .await;
    let mut raw = Raw::connect(auth_addr(&app)).await;
    let (head, _) = validate_request("", 1000);
    assert!(raw.send(head.as_bytes()).await);
    assert!(raw.send(br#"{"serviceToken": ""#).await);
    let started = Instant::now();

    // Meanwhile the server answers others.
    let (status, body) = app.get(Service::Auth, "/").await;
    assert_eq!(status, 200, "{body}");

    let response = timeout(Duration::from_secs(10), raw.response())
        .await
        .expect("an answer within the body timeout")
        .expect("an answer rather than a closed connection");
    let answered_after = started.elapsed();
    assert_eq!(response.status, 408, "{response:?}");
    assert_eq!(response.header("connection"), Some("close"));
    let error = &response.json()["error"];
    assert_eq!(error["type"], "InvalidRequest", "{error}");
    assert_eq!(error["details"]["field"], "body", "{error}");
    assert!(
        error["message"]
            .as_str()
            .unwrap()
            .contains("no data arrived"),
        "{error}"
    );
    assert!(
        answered_after >= Duration::from_millis(1500) && answered_after <= Duration::from_secs(4),
        "answered after {answered_after:?}, the body timeout is 2 s"
    );
    assert!(raw.closed_within(Duration::from_secs(2)).await);
}

#[tokio::test]
async fn a_body_below_the_minimum_rate_is_cut_off_though_every_piece_comes_in_time() {
    let app = app_with(RawServerConfig {
        body_read_timeout_secs: secs(2),
        body_min_bytes_per_sec: Some(100),
        ..Default::default()
    })
    .await;
    let mut raw = Raw::connect(auth_addr(&app)).await;
    let (head, _) = validate_request("", 1000);
    assert!(raw.send(head.as_bytes()).await);
    let started = Instant::now();
    // 5 bytes every 0.5 s: 10 bytes/s, each piece well within the 2 s frame timeout. Reading
    // goes on at the same time, so that the answer is not lost to a reset.
    let Raw { reader, writer } = &mut raw;
    let trickle = async {
        while send(writer, b"     ").await {
            sleep(Duration::from_millis(500)).await;
        }
        std::future::pending::<()>().await;
    };
    let response = timeout(Duration::from_secs(10), async {
        tokio::select! {
            biased;
            response = read_response(reader) => response,
            _ = trickle => None,
        }
    })
    .await
    .expect("an answer")
    .expect("an answer rather than a closed connection");
    assert_eq!(response.status, 408, "{response:?}");
    let message = response.json()["error"]["message"].to_string();
    assert!(
        message.contains("below the minimum of 100 bytes/s"),
        "{message}"
    );
    let cut_after = started.elapsed();
    assert!(
        cut_after >= Duration::from_millis(1500) && cut_after <= Duration::from_secs(5),
        "cut off after {cut_after:?}, the first window is 2 s"
    );
}

#[tokio::test]
async fn an_idle_keep_alive_connection_is_closed_at_the_header_timeout_but_a_busy_one_is_not() {
    let app = app_with(RawServerConfig {
        header_read_timeout_secs: secs(2),
        ..Default::default()
    })
    .await;
    let addr = auth_addr(&app);

    // Busy: a request every second for 4 s, and one whose body takes 3 s, on one connection.
    let busy = async {
        let mut raw = Raw::connect(addr).await;
        for _ in 0..4 {
            assert!(raw.send(PAGE).await);
            let r = raw.response().await.expect("served on the same connection");
            assert_eq!(r.status, 200);
            sleep(Duration::from_secs(1)).await;
        }
        let body = r#"{"serviceToken": "not-a-token"}"#;
        let (head, body) = validate_request(body, body.len());
        assert!(raw.send(head.as_bytes()).await);
        for piece in body.chunks(body.len().div_ceil(6)) {
            sleep(Duration::from_millis(500)).await;
            assert!(raw.send(piece).await, "closed while sending the body");
        }
        let r = raw.response().await.expect("the slow body was answered");
        assert_eq!(r.status, 401, "{r:?}");
        raw
    };

    // Idle: one request, then nothing.
    let idle = async {
        let mut raw = Raw::connect(addr).await;
        assert!(raw.send(PAGE).await);
        assert_eq!(raw.response().await.expect("served").status, 200);
        let idle_since = Instant::now();
        assert!(
            raw.closed_within(Duration::from_secs(6)).await,
            "an idle connection stays open"
        );
        idle_since.elapsed()
    };
    let (mut busy, closed_after) = tokio::join!(busy, idle);
    assert!(
        closed_after >= Duration::from_millis(1500),
        "closed {closed_after:?} into idling, the timeout is 2 s"
    );
    // The busy connection still serves, and closes in turn once idle.
    assert!(busy.send(PAGE).await);
    assert_eq!(busy.response().await.expect("still open").status, 200);
    assert!(busy.closed_within(Duration::from_secs(6)).await);
}

#[tokio::test]
async fn past_the_connection_cap_a_client_waits_until_a_connection_closes() {
    let app = app_with(RawServerConfig {
        max_connections: Some(2),
        header_read_timeout_secs: secs(60),
        ..Default::default()
    })
    .await;
    let addr = auth_addr(&app);
    let mut first = Raw::connect(addr).await;
    let mut second = Raw::connect(addr).await;
    for raw in [&mut first, &mut second] {
        assert!(raw.send(HEALTH).await);
        assert_eq!(raw.response().await.expect("served").status, 200);
    }

    let mut third = Raw::connect(addr).await; // the kernel's backlog completes the handshake
    assert!(third.send(HEALTH).await);
    let early = timeout(Duration::from_millis(1500), third.response()).await;
    assert!(early.is_err(), "served past the cap: {early:?}");

    drop(first);
    let late = timeout(Duration::from_secs(5), third.response())
        .await
        .expect("served once a connection closed")
        .expect("a response");
    assert_eq!(late.status, 200);
    assert!(second.send(HEALTH).await);
    assert_eq!(second.response().await.expect("still served").status, 200);

    drop((second, third));
    let (status, _) = timeout(Duration::from_secs(5), app.get(Service::Auth, "/"))
        .await
        .expect("a new client is served once connections closed");
    assert_eq!(status, 200);
}

#[tokio::test]
async fn shutdown_ends_at_its_deadline_while_a_client_holds_a_request_open() {
    let app = app_with(RawServerConfig {
        shutdown_timeout_secs: secs(2),
        body_read_timeout_secs: secs(600),
        header_read_timeout_secs: secs(600),
        ..Default::default()
    })
    .await;
    let addr = auth_addr(&app);
    let mut raw = Raw::connect(addr).await;
    let (head, _) = validate_request("", 1000);
    assert!(raw.send(head.as_bytes()).await);
    assert!(raw.send(b"{").await);
    sleep(Duration::from_millis(200)).await; // the handler is now waiting for the body

    let started = Instant::now();
    timeout(Duration::from_secs(10), app.stop())
        .await
        .expect("shutdown ends although the request never completes");
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(1500),
        "shutdown did not wait for the request in flight ({took:?})"
    );
    assert!(raw.closed_within(Duration::from_secs(2)).await);
    assert!(TcpStream::connect(addr).await.is_err(), "still accepting");
}

#[tokio::test]
async fn shutdown_lets_a_request_in_flight_finish_and_closes_its_connection() {
    let app = app_with(RawServerConfig {
        shutdown_timeout_secs: secs(30),
        ..Default::default()
    })
    .await;
    let addr = auth_addr(&app);
    let mut raw = Raw::connect(addr).await;
    let body = r#"{"serviceToken": "not-a-token"}"#;
    let (head, body) = validate_request(body, body.len());
    assert!(raw.send(head.as_bytes()).await);
    assert!(raw.send(&body[..5]).await);
    sleep(Duration::from_millis(200)).await;

    let stopping = tokio::spawn(app.stop());
    sleep(Duration::from_millis(300)).await;
    assert!(TcpStream::connect(addr).await.is_err(), "still accepting");
    assert!(raw.send(&body[5..]).await);
    let response = raw
        .response()
        .await
        .expect("the request in flight is answered");
    assert_eq!(response.status, 401, "{response:?}");
    assert_eq!(response.header("connection"), Some("close"));
    assert!(raw.closed_within(Duration::from_secs(2)).await);
    timeout(Duration::from_secs(10), stopping)
        .await
        .expect("shutdown ends once no request is left, well before its deadline")
        .unwrap();
}

#[tokio::test]
async fn a_markdown_upload_that_stalls_is_answered_408_in_the_markdown_error_shape() {
    let app = TestApp::builder()
        .services(&[Service::Markdown])
        .configure(|raw| {
            raw.server = RawServerConfig {
                body_read_timeout_secs: secs(2),
                ..Default::default()
            }
        })
        .spawn()
        .await;
    let addr = app
        .running()
        .addr(Service::Markdown)
        .expect("markdown runs");
    let mut raw = Raw::connect(addr).await;
    let part = "--XX\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.txt\"\r\nContent-Type: text/plain\r\n\r\nhello";
    let head = format!(
        "POST / HTTP/1.1\r\nHost: hearth\r\nContent-Type: multipart/form-data; boundary=XX\r\nContent-Length: {}\r\n\r\n",
        part.len() + 1000
    );
    assert!(raw.send(head.as_bytes()).await);
    assert!(raw.send(part.as_bytes()).await);
    let started = Instant::now();
    let response = timeout(Duration::from_secs(10), raw.response())
        .await
        .expect("an answer within the body timeout")
        .expect("an answer rather than a closed connection");
    let answered_after = started.elapsed();
    assert_eq!(response.status, 408, "{response:?}");
    let body = response.json();
    let message = body["error"]
        .as_str()
        .expect("markdown's {\"error\": \"...\"}");
    assert!(message.contains("no data arrived"), "{body}");
    assert!(
        answered_after >= Duration::from_millis(1500) && answered_after <= Duration::from_secs(4),
        "answered after {answered_after:?}, the body timeout is 2 s"
    );
}

#[test]
fn a_second_signal_ends_a_waiting_shutdown_at_once_with_status_130() {
    use crate::common::process::ServerProcess;
    use std::io::Write;

    let dir = tempfile::tempdir().unwrap();
    let models = dir.path().join("models.toml");
    std::fs::write(&models, "").unwrap();
    let mut server = ServerProcess::start(
        &["auth"],
        &models,
        &[
            ("HEARTH_SERVER_SHUTDOWN_TIMEOUT_SECS", "60"),
            ("HEARTH_SERVER_BODY_READ_TIMEOUT_SECS", "600"),
        ],
    );
    // A request in flight that never completes its body keeps a graceful shutdown waiting.
    let addr = server.url("auth").trim_start_matches("http://").to_string();
    let mut client = std::net::TcpStream::connect(&addr).unwrap();
    let (head, _) = validate_request("", 1000);
    client.write_all(head.as_bytes()).unwrap();
    client.write_all(b"{").unwrap();
    std::thread::sleep(Duration::from_millis(300));

    server.signal("TERM");
    assert!(
        server.exit_within(Duration::from_secs(2)).is_none(),
        "the first signal waits for the request in flight"
    );
    let started = Instant::now();
    server.signal("INT");
    let status = server
        .exit_within(Duration::from_secs(5))
        .expect("the second signal ends the process at once");
    assert_eq!(status.code(), Some(130), "{status:?}");
    assert!(started.elapsed() < Duration::from_secs(2));
}
