//! `?chunks=` on the markdown service: the spec's answer untouched, and beside it the Markdown in
//! chunks of at most N tokens of the embedding model's tokenizer (all-MiniLM-L6-v2's, the model
//! table's first embedding row), cut on the document's structure, long tables with their header
//! repeated, each with its headings and offsets; and the query's errors.

use hearth_server::Service;
use reqwest::StatusCode;
use serde_json::Value;

use crate::common::TestApp;

async fn app() -> TestApp {
    TestApp::builder()
        .services(&[Service::Markdown])
        .spawn()
        .await
}

async fn upload(app: &TestApp, query: &str, name: &str, bytes: &[u8]) -> (StatusCode, Value) {
    crate::markdown::upload_to(app, &format!("/{query}"), name, bytes.to_vec()).await
}

fn guide() -> String {
    let mut html =
        String::from("<html><body><h1>Harbour guide</h1><p>The harbour office opens at seven.</p>");
    for _ in 0..6 {
        html.push_str(
            "<p>Clerks record every arrival in a ledger kept beside the window, and the \
             harbour master signs each page before noon.</p>",
        );
    }
    html.push_str("<h2>Timetable</h2><table><tr><th>day</th><th>ferry</th><th>time</th></tr>");
    for day in 0..40 {
        html.push_str(&format!(
            "<tr><td>day {day}</td><td>island ferry {day}</td><td>{:02}:15</td></tr>",
            day % 24
        ));
    }
    html.push_str("</table><h2>Café</h2><p>Crème at the kiosk — à bientôt.</p></body></html>");
    html
}

fn tokens(text: &str) -> usize {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("weights/all-MiniLM-L6-v2/tokenizer.json");
    let tokenizer = hearth_embed::open_tokenizer(&path).expect("scripts/fetch-weights.sh minilm");
    tokenizer.encode(text, true).unwrap().len()
}

#[tokio::test]
async fn chunks_come_beside_the_spec_answer_within_the_token_limit() {
    let app = app().await;
    let html = guide();
    let (status, plain) = upload(&app, "", "guide.html", html.as_bytes()).await;
    assert_eq!(status, StatusCode::OK, "{plain}");
    // Without ?chunks the answer is the spec's, exactly.
    let keys: Vec<&String> = plain.as_object().unwrap().keys().collect();
    assert_eq!(keys, ["markdown", "original_filename"]);

    let (status, body) = upload(&app, "?chunks=64", "guide.html", html.as_bytes()).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["markdown"], plain["markdown"]);
    assert_eq!(body["original_filename"], "guide.html");
    let markdown: Vec<char> = body["markdown"].as_str().unwrap().chars().collect();
    let chunks = body["chunks"].as_array().unwrap();
    assert!(chunks.len() >= 4, "{} chunks", chunks.len());
    let mut table_rows = 0;
    let mut last_end = 0;
    for chunk in chunks {
        let text = chunk["text"].as_str().unwrap();
        let n = tokens(text);
        assert!(n <= 64, "a chunk of {n} tokens: {text}");
        let (start, end) = (
            chunk["start"].as_u64().unwrap() as usize,
            chunk["end"].as_u64().unwrap() as usize,
        );
        assert!(
            start >= last_end && end > start && end <= markdown.len(),
            "{chunk}"
        );
        last_end = end;
        let own: String = markdown[start..end].iter().collect();
        if text.contains("island ferry") {
            // A piece of the long table: its header and delimiter rows, then its own rows.
            let mut lines = text.lines();
            let header = lines.next().unwrap();
            assert!(header.contains("day") && header.contains("ferry"), "{text}");
            assert!(lines.next().unwrap().starts_with("| ---"), "{text}");
            let rows: Vec<&str> = lines.collect();
            assert!(own.ends_with(rows.last().unwrap()), "{own}");
            table_rows += rows.len();
            assert_eq!(
                chunk["headings"],
                serde_json::json!(["Harbour guide", "Timetable"])
            );
        } else {
            assert_eq!(own, text);
        }
    }
    assert_eq!(table_rows, 40);
    assert_eq!(chunks[0]["headings"], serde_json::json!(["Harbour guide"]));
    let last = chunks.last().unwrap();
    assert!(
        last["text"].as_str().unwrap().contains("à bientôt."),
        "{last}"
    );
}

#[tokio::test]
async fn bad_chunk_queries_are_400_naming_the_problem() {
    let app = app().await;
    for (query, says) in [
        ("?chunks=5", "chunks must be a number of tokens from 16"),
        ("?chunks=lots", "chunks must be"),
        ("?chunks=100000", "65536"),
        ("?tokenizer=all-minilm-l6-v2", "?chunks=, which is missing"),
        ("?chunks=64&tokenizer=nope", "known: all-minilm-l6-v2"),
    ] {
        let (status, body) = upload(&app, query, "a.csv", b"a,b\n1,2\n").await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{query}: {body}");
        let error = body["error"].as_str().unwrap();
        assert!(error.contains(says), "{query}: {error}");
    }
    // A tokenizer named explicitly counts as the default does.
    let (status, body) = upload(
        &app,
        "?chunks=64&tokenizer=all-minilm-l6-v2",
        "a.csv",
        b"a,b\n1,2\n",
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        body["chunks"][0]["text"],
        "| a | b |\n| --- | --- |\n| 1 | 2 |"
    );
}

#[tokio::test]
async fn the_markdown_service_runs_without_a_model_table_and_then_has_no_tokenizer() {
    let app = TestApp::builder()
        .services(&[Service::Markdown])
        .configure(|raw| raw.models = Some("/nonexistent/models.toml".into()))
        .spawn()
        .await;
    let (status, body) = upload(&app, "", "a.csv", b"a,b\n1,2\n").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, body) = upload(&app, "?chunks=64", "a.csv", b"a,b\n1,2\n").await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    let error = body["error"].as_str().unwrap();
    assert!(
        error.contains("no [embedding] or [rerank] model"),
        "{error}"
    );
}
