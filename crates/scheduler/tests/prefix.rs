//! Prefix reuse with the real SmolLM2 weights: the next turn of a chat starts from the previous
//! turn's kept KV cache and prefills only its new tokens, and its greedy output is the same as
//! an engine without reuse gives; requests with different prompts (and other users) sharing only
//! a system prompt reuse that much and no more, from an ended sequence's cache or from a running
//! one's.

mod support;

use hearth_infer::{ChatMessage, Role};
use hearth_scheduler::{Output, Scheduler, SchedulerConfig, SchedulerHandle};
use support::*;

fn engine(name: &str, prefix_reuse: bool) -> SchedulerHandle {
    Scheduler::spawn(
        smollm2_model(),
        SchedulerConfig {
            prefix_reuse,
            ..config(name)
        },
    )
    .expect("spawn")
}

fn chat(sched: &SchedulerHandle, messages: &[ChatMessage]) -> Vec<u32> {
    let tok = sched.tokenizer();
    tok.encode(&tok.apply_chat_template(messages).unwrap())
        .unwrap()
}

/// A system prompt long enough that sharing it is worth a copy.
fn bakery_system() -> ChatMessage {
    ChatMessage::new(
        Role::System,
        "You are a careful assistant for a small bakery. Answer in one sentence, mention the \
         opening hours (7 to 18) when asked about visits, and never invent prices.",
    )
}

async fn answer(sched: &SchedulerHandle, messages: &[ChatMessage], id: &str) -> Output {
    run(sched, chat(sched, messages), greedy(24), id).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_next_turn_reuses_the_previous_one_and_answers_as_without_reuse() {
    let with = engine("reuse", true);
    let without = engine("fresh", false);
    let mut messages = vec![
        ChatMessage::new(
            Role::System,
            "You are a helpful assistant who answers briefly.",
        ),
        ChatMessage::new(Role::User, "What is the capital of France?"),
    ];
    let mut prompts = Vec::new();
    for (turn, next) in ["And of Italy?", "Which of the two is larger?", "Thanks!"]
        .into_iter()
        .enumerate()
    {
        let id = format!("turn-{turn}");
        let before = with.metrics().prefix_reused_tokens;
        let reused = answer(&with, &messages, &id).await;
        let fresh = answer(&without, &messages, &id).await;
        assert_eq!(reused.text, fresh.text, "turn {turn}");
        assert_eq!(reused.usage, fresh.usage, "turn {turn}");
        let saved = with.metrics().prefix_reused_tokens - before;
        let prompt = chat(&with, &messages);
        if turn == 0 {
            assert_eq!(saved, 0, "nothing to reuse on the first turn");
        } else {
            // At least the whole previous prompt (the history up to the last answer) is reused.
            let previous: &Vec<u32> = prompts.last().unwrap();
            assert!(
                saved as usize >= previous.len() && (saved as usize) < prompt.len(),
                "turn {turn}: reused {saved} of {} prompt tokens (previous prompt {})",
                prompt.len(),
                previous.len()
            );
        }
        prompts.push(prompt);
        messages.push(ChatMessage::new(Role::Assistant, reused.text.trim()));
        messages.push(ChatMessage::new(Role::User, next));
    }
    assert_eq!(
        without.metrics().prefix_reused_tokens,
        0,
        "reuse off means off"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_sharing_only_a_system_prompt_reuse_that_much() {
    let with = engine("shared-system", true);
    let without = engine("shared-system-fresh", false);
    let system = bakery_system();
    let questions = [
        "When can I come by?",
        "Do you bake rye bread?",
        "Is there parking?",
    ];
    let first = [system.clone(), ChatMessage::new(Role::User, questions[0])];
    let _ = answer(&with, &first, "q0").await;
    for (i, q) in questions.iter().enumerate().skip(1) {
        let messages = [system.clone(), ChatMessage::new(Role::User, *q)];
        let before = with.metrics().prefix_reused_tokens;
        let reused = answer(&with, &messages, &format!("q{i}")).await;
        let fresh = answer(&without, &messages, &format!("q{i}")).await;
        assert_eq!(reused.text, fresh.text, "question {i}");
        let saved = (with.metrics().prefix_reused_tokens - before) as usize;
        // The shared part: the tokens both prompts start with.
        let a = chat(&with, &first);
        let b = chat(&with, &messages);
        let common = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
        assert!(
            saved > 0 && saved <= common,
            "question {i}: reused {saved}, the prompts share {common}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_arriving_while_another_runs_copies_the_shared_start_from_it() {
    let with = engine("running", true);
    let without = engine("running-fresh", false);
    let system = bakery_system();
    let first = chat(
        &with,
        &[
            system.clone(),
            ChatMessage::new(Role::User, "Tell me about your bread."),
        ],
    );
    // The first request keeps running (end-of-sequence ignored) while the second arrives; the
    // engine is new, so no ended sequence's cache holds anything.
    let mut running = with
        .submit(long(first.clone(), 64, "running"))
        .await
        .expect("submit");
    read_tokens(&mut running, 2).await;
    let messages = [system, ChatMessage::new(Role::User, "Is there parking?")];
    let second = chat(&with, &messages);
    let common = first
        .iter()
        .zip(&second)
        .take_while(|(x, y)| x == y)
        .count();
    assert!(common >= 16, "the prompts share {common} tokens");

    let before = with.metrics().prefix_reused_tokens;
    let reused = answer(&with, &messages, "second").await;
    let saved = (with.metrics().prefix_reused_tokens - before) as usize;
    assert_eq!(
        saved, common,
        "the shared start is copied from the running sequence"
    );
    let fresh = answer(&without, &messages, "second").await;
    assert_eq!(reused.text, fresh.text);
    assert_eq!(reused.usage, fresh.usage);
    // The sequence it copied from is untouched and runs to its end.
    let out = running.collect().await;
    assert_eq!(out.usage.completion_tokens, 64);
}
