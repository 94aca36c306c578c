//! Behaviour of the scheduler with a real model: the deterministic tiny random llama
//! (`TextModel::tiny_random`) for speed, and the real SmolLM2 weights for the greedy-equality
//! check (fetched by `scripts/fetch-weights.sh`).

use std::future::Future;
use std::time::Duration;

mod support;

use hearth_infer::TextModel;
use hearth_scheduler::{Error, Outcome, Scheduler, SchedulerConfig, SchedulerHandle};
use hearth_types::{AbortReason, FinishReason, TokenEvent};
use support::*;

const PROMPTS: [&str; 8] = [
    "Hi",
    "What is the capital of France?",
    "Write a haiku about the sea, the wind and an old lighthouse keeper.",
    "List three prime numbers.",
    "Explain in detail how a hash map handles collisions, with open addressing and chaining, and compare them.",
    "Say yes.",
    "Translate 'good morning' into German, Spanish and Italian, one per line.",
    "Why is the sky blue? Answer like a physicist talking to a child who keeps asking why.",
];

async fn alone_then_together(make: impl Fn() -> SchedulerHandle, max_tokens: usize) {
    let sched = make();
    let prompts: Vec<Vec<u32>> = PROMPTS.iter().map(|p| prompt(&sched, p)).collect();
    let mut alone = Vec::new();
    for (i, ids) in prompts.iter().enumerate() {
        alone.push(
            run(
                &sched,
                ids.clone(),
                greedy(max_tokens),
                &format!("alone-{i}"),
            )
            .await,
        );
    }
    // Together: started at different times, measured in engine steps: a pacer stream runs
    // throughout and request i is submitted after the pacer's 3·i-th token, so each joins a
    // batch already running, some while others are still prefilling.
    let pacer_ids = prompt(&sched, "Tell me everything.");
    let mut pacer = sched.submit(long(pacer_ids, 1_000, "pacer")).await.unwrap();
    let mut tasks = Vec::new();
    for (i, ids) in prompts.iter().enumerate() {
        let s = sched.clone();
        let ids = ids.clone();
        let params = greedy(max_tokens);
        tasks.push(tokio::spawn(async move {
            let generation = s
                .submit(request(ids, params, &format!("together-{i}")))
                .await
                .unwrap();
            generation.collect().await
        }));
        let _ = read_tokens(&mut pacer, 3).await;
    }
    for (i, task) in tasks.into_iter().enumerate() {
        let together = task.await.expect("task");
        assert_eq!(together, alone[i], "prompt {i} differs when batched");
        assert!(together.usage.completion_tokens > 0);
        assert_eq!(together.usage.prompt_tokens, prompts[i].len());
    }
    let metrics = sched.metrics();
    assert!(
        metrics.batch_rows.max >= 4.0,
        "requests never shared a step: {:?}",
        metrics.batch_rows
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn greedy_output_alone_equals_output_alongside_seven_others() {
    alone_then_together(|| tiny(config("tiny")), 24).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn greedy_output_alone_equals_output_alongside_seven_others_with_smollm2() {
    let handle = Scheduler::spawn(smollm2_model(), config("smollm2")).expect("spawn");
    alone_then_together(move || handle.clone(), 16).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_ends_with_length_after_max_tokens_and_reports_usage() {
    let sched = tiny(config("tiny"));
    let ids = prompt(&sched, "Count to ten.");
    let n = ids.len();
    let out = run(&sched, ids, greedy(5), "s").await;
    assert!(out.usage.completion_tokens <= 5);
    assert_eq!(out.usage.prompt_tokens, n);
    match out.outcome {
        Outcome::Finished(FinishReason::Length) => assert_eq!(out.usage.completion_tokens, 5),
        Outcome::Finished(FinishReason::Stop) => assert!(out.usage.completion_tokens < 5),
        other => panic!("unexpected outcome {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_arriving_together_at_an_idle_engine_start_in_one_step() {
    let sched = tiny(SchedulerConfig {
        name: "gather".into(),
        gather_window: Duration::from_millis(50),
        ..SchedulerConfig::default()
    });
    let ids = prompt(&sched, "Say something.");
    // `submit` returns once its request is admitted, so the four are sent from their own tasks,
    // a few milliseconds apart as parallel HTTP requests reach the scheduler: far longer than a
    // step of the tiny model, so without the gather window the first would run alone.
    let mut tasks = Vec::new();
    for i in 0..4 {
        tasks.push(spawn_long(&sched, ids.clone(), 3, format!("g{i}")));
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    for t in tasks {
        assert_eq!(t.await.expect("stream task"), 3);
    }
    let m = sched.metrics();
    // One step prefills all four prompts (and samples their first tokens), two more decode.
    assert_eq!(m.steps, 3, "steps: {m:?}");
    assert_eq!(m.batch_rows.max, 4.0);
}

/// A request announced by its caller (still being tokenized and billed over HTTP) holds an idle
/// engine's first step for it, even when it comes later than the gather window after the last
/// arrival; without announcements the first request runs alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_announced_request_joins_the_first_step_of_a_burst() {
    for announce in [true, false] {
        let sched = tiny(SchedulerConfig {
            name: "announce".into(),
            gather_window: Duration::from_millis(5),
            ..SchedulerConfig::default()
        });
        let ids = prompt(&sched, "Say something.");
        let announced = announce.then(|| sched.announce());
        let first = spawn_long(&sched, ids.clone(), 3, "first".into());
        // Four gather windows later: well past the window, well within the gather limit.
        tokio::time::sleep(Duration::from_millis(20)).await;
        drop(announced);
        let second = sched.submit(long(ids, 3, "second")).await.expect("submit");
        assert_eq!(second.collect().await.usage.completion_tokens, 3);
        assert_eq!(first.await.expect("stream task"), 3);
        let m = sched.metrics();
        if announce {
            // One step prefills both prompts, two more decode.
            assert_eq!((m.steps, m.batch_rows.max), (3, 2.0), "{m:?}");
        } else {
            assert!(m.steps > 3, "the first request ran alone first: {m:?}");
        }
    }
}

/// Once the waiting prompts fill the first step's token budget, later requests could not join
/// that step anyway: the engine starts at once instead of waiting for announced ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_first_step_starts_without_waiting_for_announced_requests() {
    let sched = tiny(SchedulerConfig {
        name: "full".into(),
        // 25 windows of 1 s: a gather that waited for the announcement would take 25 s.
        gather_window: Duration::from_secs(1),
        ..config("full")
    });
    let ids = prompt(&sched, "Say something.");
    assert!(ids.len() >= 8, "each prompt fills a prefill chunk of 8");
    let _announced = sched.announce();
    // Three chunks of 8 tokens fill the 24-token step.
    let tasks: Vec<_> = (0..3)
        .map(|i| spawn_long(&sched, ids.clone(), 2, format!("f{i}")))
        .collect();
    for t in tasks {
        let tokens = tokio::time::timeout(Duration::from_secs(5), t)
            .await
            .expect("the engine waited for the announced request")
            .expect("stream task");
        assert_eq!(tokens, 2);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_by_handle_frees_the_slot_and_leaves_others_unchanged() {
    let sched = tiny(SchedulerConfig {
        max_active: 2,
        ..config("tiny")
    });
    let other_ids = prompt(&sched, PROMPTS[2]);
    let expected_other = run(&sched, other_ids.clone(), greedy(20), "ref").await;

    let victim_ids = prompt(&sched, PROMPTS[4]);
    // temperature 0 with a stop-free budget far beyond what we read
    let mut victim = sched.submit(long(victim_ids, 400, "victim")).await.unwrap();
    let other = sched
        .submit(request(other_ids, greedy(20), "other"))
        .await
        .unwrap();
    // Both slots are taken: a third request waits until the victim's slot frees.
    let third_ids = prompt(&sched, PROMPTS[0]);
    let s = sched.clone();
    let third = tokio::spawn(async move { run(&s, third_ids, greedy(4), "third").await });

    let _ = read_tokens(&mut victim, 3).await;
    victim.cancel();
    let mut end = None;
    while let Some(event) = victim.next().await {
        if !matches!(event, TokenEvent::Token { .. }) {
            end = Some(event);
        }
    }
    match end {
        Some(TokenEvent::Aborted {
            usage,
            reason: AbortReason::Cancelled,
        }) => {
            assert!(
                usage.completion_tokens >= 3 && usage.completion_tokens < 400,
                "{usage:?}"
            );
        }
        other => panic!("expected Aborted(Cancelled), got {other:?}"),
    }
    let third = tokio::time::timeout(Duration::from_secs(60), third)
        .await
        .expect("third admitted")
        .unwrap();
    assert!(third.usage.completion_tokens > 0);
    assert_eq!(other.collect().await, expected_other);
    assert_eq!(sched.metrics().aborted, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_receiver_stops_the_stream_and_frees_its_slot() {
    let sched = tiny(SchedulerConfig {
        max_active: 1,
        ..config("tiny")
    });
    let mut gone = sched
        .submit(long(prompt(&sched, "Go on"), 400, "gone"))
        .await
        .unwrap();
    let _ = read_tokens(&mut gone, 2).await;
    drop(gone);
    // With one slot, this only runs once the dropped stream left the batch.
    let next = tokio::time::timeout(
        Duration::from_secs(60),
        run(&sched, prompt(&sched, "Hi"), greedy(3), "next"),
    )
    .await
    .expect("slot freed");
    assert!(next.usage.completion_tokens > 0);
    let m = sched.metrics();
    assert_eq!(m.aborted, 1);
    assert!(
        m.generated_tokens < 400,
        "the dropped stream went on generating"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_handle_kept_elsewhere_stops_a_running_stream() {
    let sched = tiny(config("tiny"));
    let mut g = sched
        .submit(long(prompt(&sched, "Hello"), 400, "abc"))
        .await
        .unwrap();
    // What the server's map of live streams keeps: a clone, cancelled from another task.
    let handle = g.cancel_handle();
    let _ = read_tokens(&mut g, 1).await;
    tokio::spawn(async move { handle.cancel() }).await.unwrap();
    let out = g.collect().await;
    assert!(
        matches!(out.outcome, Outcome::Aborted(AbortReason::Cancelled)),
        "{out:?}"
    );
    assert!(out.usage.completion_tokens < 400);
    assert_eq!(sched.metrics().aborted, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_refuses_at_once_with_overloaded_and_the_configured_retry_after() {
    let retry_after = Duration::from_secs(7);
    let sched = tiny(SchedulerConfig {
        max_active: 1,
        max_queued: 1,
        retry_after,
        ..config("tiny")
    });
    let _running = sched
        .submit(long(prompt(&sched, "One"), 400, "1"))
        .await
        .unwrap();
    let s = sched.clone();
    let ids = prompt(&sched, "Two");
    let _queued =
        tokio::spawn(async move { s.submit(request(ids, greedy(4), "2")).await.map(|_| ()) });
    // Let the second request reach the queue.
    while sched.metrics().queue_depth < 1 {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let err = sched
        .submit(request(prompt(&sched, "Three"), greedy(4), "3"))
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::Overloaded {
                waiting: 1,
                limit: 1,
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(err.retry_after(), Some(retry_after));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_that_waits_past_the_queue_timeout_is_refused() {
    let retry_after = Duration::from_secs(3);
    let sched = tiny(SchedulerConfig {
        max_active: 1,
        queue_timeout: Duration::from_millis(100),
        retry_after,
        ..config("tiny")
    });
    let _running = sched
        .submit(long(prompt(&sched, "One"), 400, "1"))
        .await
        .unwrap();
    let err = sched
        .submit(request(prompt(&sched, "Two"), greedy(4), "2"))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::QueueTimeout { .. }), "{err:?}");
    assert_eq!(err.retry_after(), Some(retry_after));
    assert_eq!(
        sched.metrics().queue_depth,
        0,
        "the timed-out request stayed queued"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_that_can_never_fit_are_refused_with_typed_errors() {
    let model = TextModel::tiny_random(7);
    let per_token = model.info().kv_bytes_per_token as u64;
    let context = model.info().context_length;
    let sched = Scheduler::spawn(
        model,
        SchedulerConfig {
            kv_budget_bytes: per_token * 64,
            ..config("tiny")
        },
    )
    .unwrap();
    let err = sched
        .submit(request(vec![1; 10], greedy(100), "big"))
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::ExceedsKvBudget {
                prompt_tokens: 10,
                max_tokens: 100,
                ..
            }
        ),
        "{err:?}"
    );
    let err = sched
        .submit(request(vec![], greedy(4), "empty"))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::EmptyPrompt));
    let err = sched
        .submit(request(vec![1; context], greedy(4), "long"))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::PromptTooLong { .. }), "{err:?}");
    assert_eq!(err.retry_after(), None, "not a refusal for load");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_reader_pauses_only_its_own_stream() {
    let sched = tiny(SchedulerConfig {
        channel_capacity: 2,
        ..config("tiny")
    });
    let ids = prompt(&sched, PROMPTS[1]);
    let expected = run(&sched, ids.clone(), greedy(30), "ref").await;
    // Nobody reads this one for now: its channel fills and it pauses.
    let slow = sched
        .submit(request(ids.clone(), greedy(30), "slow"))
        .await
        .unwrap();
    let fast = tokio::time::timeout(
        Duration::from_secs(60),
        run(&sched, prompt(&sched, PROMPTS[3]), greedy(40), "fast"),
    )
    .await
    .expect("the fast stream was stalled by the slow one");
    assert!(fast.usage.completion_tokens > 0);
    if expected.usage.completion_tokens > 3 {
        assert!(
            slow.generated_tokens() < expected.usage.completion_tokens,
            "a full channel did not pause"
        );
        assert_eq!(sched.metrics().paused, 1);
    }
    // Reading it now resumes it, with the same output it has alone.
    assert_eq!(slow.collect().await, expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_refuses_new_work_and_aborts_streams_after_the_grace_period() {
    let figure = Duration::from_secs(4);
    let sched = tiny(SchedulerConfig {
        shutdown_grace: Duration::from_millis(100),
        retry_after: figure,
        ..config("tiny")
    });
    let mut running = sched
        .submit(long(prompt(&sched, "Go"), 400, "r"))
        .await
        .unwrap();
    let _ = read_tokens(&mut running, 1).await;
    let during = prompt(&sched, "During");
    let reader = tokio::spawn(async move { running.collect().await });
    // The first poll of `shutdown` starts the drain; the engine lives on through the grace.
    let mut stopping = std::pin::pin!(sched.shutdown());
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    assert!(stopping.as_mut().poll(&mut cx).is_pending());
    // Draining: refused for load, with the engine's figure.
    let err = sched
        .submit(request(during, greedy(4), "during"))
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::ShuttingDown { retry_after } if retry_after == figure),
        "{err:?}"
    );
    tokio::time::timeout(Duration::from_secs(30), stopping)
        .await
        .expect("engine exits");
    let out = reader.await.unwrap();
    assert_eq!(
        out.outcome,
        Outcome::Aborted(AbortReason::Shutdown {
            retry_after: figure
        }),
        "{out:?}"
    );
    assert!(out.usage.completion_tokens >= 1);
    let err = sched
        .submit(request(prompt(&sched, "Late"), greedy(4), "late"))
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::ShuttingDown { .. } | Error::EngineUnavailable(_)
        ),
        "{err:?}"
    );
}
