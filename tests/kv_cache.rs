//! `kv_precision = "q8_0"` and `"q4_0"` over HTTP: a model row with llama.cpp's q8_0 or q4_0 KV
//! cache answers and bills, and its KV budget counts the cache's true size. SmolLM2 keeps 23,040
//! bytes a position in f16, 12,240 in q8_0 (34 bytes a block of 32) and 6,480 in q4_0 (18), so
//! under a 1 MiB budget a request of about 70 positions is refused at once with an f16 cache
//! (it could never fit) and answered with a q8_0 one, and one of about 130 is refused with q8_0
//! and answered with q4_0.

use crate::completion::{cost_of, dec, request, spawn_completion_with};

const PROMPT: &str = "Name three rivers of Europe, one per line.";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_q8_0_cache_fits_a_request_the_budget_refuses_in_f16_and_answers_it() {
    let q8 = spawn_completion_with("kv_precision = \"q8_0\"\nkv_budget_mb = 1", |_| {}).await;
    let f16 = spawn_completion_with("kv_precision = \"f16\"\nkv_budget_mb = 1", |_| {}).await;
    let (a, b) = (q8.user("kv8", "5").await, f16.user("kv16", "5").await);

    let (status, err) = f16.post("/", request(&b, PROMPT, 40)).await;
    assert_eq!(status, 400, "{err}");
    assert_eq!(err["error"]["type"], "InvalidRequest", "{err}");
    assert_eq!(err["error"]["details"]["field"], "maxOutputTokens", "{err}");
    let message = err["error"]["message"].as_str().unwrap();
    assert!(message.contains("KV cache"), "{message}");

    let (status, body) = q8.post("/", request(&a, PROMPT, 40)).await;
    assert_eq!(status, 200, "{body}");
    let output = body["output"].as_str().unwrap();
    assert!(!output.trim().is_empty(), "{body}");
    let cost = cost_of(&body);
    assert!(cost > dec("0"), "billed: {body}");
    assert_eq!(q8.store().balance("kv8").await.unwrap(), dec("5") - cost);

    // A request no cache of either kind could hold is refused on the q8_0 row too.
    let (status, err) = q8.post("/", request(&a, PROMPT, 200)).await;
    assert_eq!(status, 400, "{err}");
    assert_eq!(err["error"]["details"]["field"], "maxOutputTokens", "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_q4_0_cache_fits_a_request_the_budget_refuses_in_q8_0_and_answers_it() {
    let q4 = spawn_completion_with("kv_precision = \"q4_0\"\nkv_budget_mb = 1", |_| {}).await;
    let q8 = spawn_completion_with("kv_precision = \"q8_0\"\nkv_budget_mb = 1", |_| {}).await;
    let (a, b) = (q4.user("kv4", "5").await, q8.user("kv8b", "5").await);

    let (status, err) = q8.post("/", request(&b, PROMPT, 90)).await;
    assert_eq!(status, 400, "{err}");
    assert_eq!(err["error"]["details"]["field"], "maxOutputTokens", "{err}");

    let (status, body) = q4.post("/", request(&a, PROMPT, 90)).await;
    assert_eq!(status, 200, "{body}");
    assert!(
        !body["output"].as_str().unwrap().trim().is_empty(),
        "{body}"
    );
    let cost = cost_of(&body);
    assert!(cost > dec("0"), "billed: {body}");
    assert_eq!(q4.store().balance("kv4").await.unwrap(), dec("5") - cost);
}
