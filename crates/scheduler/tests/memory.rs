//! The scheduler's memory with the tiny random model: the KV budget holds requests back until
//! memory frees, and a reused KV cache answers as a fresh one.

mod support;

use std::time::Duration;

use hearth_infer::TextModel;
use hearth_scheduler::SchedulerConfig;
use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kv_budget_holds_back_a_request_until_memory_frees() {
    let model = TextModel::tiny_random(7);
    let per_token = model.info().kv_bytes_per_token as u64;
    // The first stream is not read until the end, so with two events of room it pauses and
    // keeps its cache however fast the machine (it once finished within the 50 ms below).
    let sched = tiny(SchedulerConfig {
        kv_budget_bytes: per_token * 120,
        channel_capacity: 2,
        ..config("tiny")
    });
    let ids = prompt(&sched, "Hi");
    let need = ids.len() + 60;
    assert!(
        need * 2 > 120 && need <= 120,
        "test prompt of {} tokens does not suit",
        ids.len()
    );
    let first = sched.submit(long(ids.clone(), 60, "a")).await.unwrap();
    let s = sched.clone();
    let second =
        tokio::spawn(async move { s.submit(long(ids, 60, "b")).await.unwrap().collect().await });
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(
        sched.metrics().active,
        1,
        "both fit although the budget holds one"
    );
    // The running sequence's cache is counted, within the budget.
    let in_use = sched.metrics().kv_bytes_in_use;
    assert!(
        in_use >= need as u64 * per_token && in_use <= per_token * 120,
        "KV bytes in use {in_use}, one sequence of {need} tokens needs {}",
        need as u64 * per_token
    );
    let _ = first.collect().await;
    let second = tokio::time::timeout(Duration::from_secs(60), second)
        .await
        .unwrap()
        .unwrap();
    assert!(second.usage.completion_tokens > 0);
    // Both ended: nothing in use (the engine stores it just after sending the final event).
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while sched.metrics().kv_bytes_in_use != 0 && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(sched.metrics().kv_bytes_in_use, 0);
}

/// The engine keeps ended sequences' KV caches and hands them to later requests of a similar
/// size, full of the earlier request's keys and values: the later request must not see them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_on_a_reused_kv_cache_answers_as_on_a_fresh_one() {
    let short = "Say yes.";
    let fresh = {
        let sched = tiny(config("fresh"));
        let ids = prompt(&sched, short);
        run(&sched, ids, greedy(40), "fresh").await
    };
    let sched = tiny(config("reused"));
    let ids = prompt(&sched, short);
    // A longer prompt first, whose cache (prompt + 40 positions, all written: end-of-sequence
    // ignored) is close enough in size to be handed to the short request.
    let before = prompt(&sched, "Say no, twice.");
    assert!(before.len() > ids.len() && before.len() - ids.len() < 10);
    let first = sched
        .submit(long(before, 40, "first"))
        .await
        .unwrap()
        .collect()
        .await;
    assert_eq!(first.usage.completion_tokens, 40);
    let reused = run(&sched, ids, greedy(40), "reused").await;
    assert_eq!(reused.text, fresh.text);
    assert_eq!(reused.usage, fresh.usage);
}
