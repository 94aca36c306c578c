//! The engine's side of OpenAI-style decoding with real models: grammar-constrained output,
//! stop strings, log-probabilities, and a failing constraint that costs only its own stream.

mod support;

use hearth_grammar::Grammars;
use hearth_infer::{
    ChatMessage, ConstraintError, Role, SamplingParams, TextModel, TokenConstraint, TokenMask,
};
use hearth_scheduler::{Outcome, Output, Request, Scheduler, SchedulerConfig, SchedulerHandle};
use hearth_types::{AbortReason, FinishReason, TokenEvent};
use serde_json::{json, Value};

fn smollm2() -> SchedulerHandle {
    Scheduler::spawn(support::smollm2_model(), config("smollm2")).expect("spawn")
}

fn tiny() -> SchedulerHandle {
    Scheduler::spawn(TextModel::tiny_random(7), config("tiny")).expect("spawn")
}

fn config(name: &str) -> SchedulerConfig {
    SchedulerConfig {
        name: name.into(),
        ..SchedulerConfig::default()
    }
}

fn prompt(sched: &SchedulerHandle, text: &str) -> Vec<u32> {
    let tok = sched.tokenizer();
    let rendered = tok
        .apply_chat_template(&[ChatMessage::new(Role::User, text)])
        .expect("template");
    tok.encode(&rendered).expect("encode")
}

fn request(ids: Vec<u32>, params: SamplingParams, id: &str) -> Request {
    Request {
        prompt_ids: ids,
        params,
        stream_id: id.into(),
        span: tracing::Span::none(),
        ignore_eos: false,
        constraint: None,
    }
}

fn greedy(max_tokens: usize) -> SamplingParams {
    SamplingParams {
        temperature: 0.0,
        max_tokens,
        ..SamplingParams::default()
    }
}

async fn run(sched: &SchedulerHandle, request: Request) -> Output {
    sched.submit(request).await.expect("submit").collect().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schema_constrained_greedy_generation_finishes_with_valid_json() {
    let sched = smollm2();
    let grammars = Grammars::new(&sched.tokenizer()).expect("token table");
    let schema = json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 30},
            "age": {"type": "integer", "minimum": 0, "maximum": 40},
            "colours": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 4}
        },
        "required": ["name", "age", "colours"],
        "additionalProperties": false
    });
    let ids = prompt(
        &sched,
        "Describe a cat as JSON with its name, age and colours.",
    );
    let out = run(
        &sched,
        Request {
            constraint: Some(grammars.json_schema(&schema).expect("compiles")),
            ..request(ids, greedy(200), "json")
        },
    )
    .await;
    assert_eq!(
        out.outcome,
        Outcome::Finished(FinishReason::Stop),
        "{out:?}"
    );
    let v: Value = serde_json::from_str(&out.text).unwrap_or_else(|e| panic!("{e}: {}", out.text));
    assert!(
        v["name"].as_str().is_some_and(|n| n.chars().count() <= 30),
        "{v}"
    );
    assert!(
        v["age"].as_i64().is_some_and(|a| (0..=40).contains(&a)),
        "{v}"
    );
    let colours = v["colours"].as_array().expect("colours");
    assert!(
        colours.len() <= 4 && colours.iter().all(Value::is_string),
        "{v}"
    );
    sched.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_string_ends_the_stream_before_it_and_is_never_emitted() {
    let sched = tiny();
    let ids = prompt(&sched, "hello, how are you today?");
    let free = Request {
        ignore_eos: true,
        ..request(ids.clone(), greedy(40), "free")
    };
    let full = run(&sched, free).await.text;
    let chars: Vec<char> = full.chars().collect();
    assert!(chars.len() > 20, "{full:?}");
    // A stop string from the middle of the greedy output, spanning several tokens.
    let stop: String = chars[12..16].iter().collect();
    let expected = &full[..full.find(&stop).expect("occurs")];
    let params = SamplingParams {
        stop: vec!["never-generated".into(), stop.clone()],
        ..greedy(40)
    };
    let mut generation = sched
        .submit(Request {
            ignore_eos: true,
            ..request(ids, params, "stopped")
        })
        .await
        .expect("submit");
    let mut text = String::new();
    let outcome = loop {
        match generation.next().await.expect("a terminal event") {
            TokenEvent::Token { text: piece, .. } => {
                text.push_str(&piece);
                assert!(!text.contains(&stop), "emitted the stop string: {text:?}");
            }
            TokenEvent::Finished { reason, .. } => break Ok(reason),
            TokenEvent::Aborted { reason, .. } => break Err(reason),
        }
    };
    // Which stop string it was: the second of the request's list.
    assert_eq!(outcome, Ok(FinishReason::StopString(1)));
    assert_eq!(text, expected);
    sched.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_generated_token_reports_its_logprobs_once() {
    let sched = tiny();
    let ids = prompt(&sched, "what is the model?");
    let params = SamplingParams {
        logprobs: Some(3),
        ..greedy(30)
    };
    let mut generation = sched
        .submit(Request {
            ignore_eos: true,
            ..request(ids, params, "lp")
        })
        .await
        .expect("submit");
    let mut entries = Vec::new();
    let mut text = String::new();
    let usage = loop {
        match generation.next().await.expect("a terminal event") {
            TokenEvent::Token {
                text: piece,
                logprobs,
                ..
            } => {
                text.push_str(&piece);
                entries.extend(logprobs);
            }
            TokenEvent::Finished { usage, .. } => break usage,
            other => panic!("{other:?}"),
        }
    };
    assert_eq!(entries.len(), usage.completion_tokens);
    // In order, one per token: the ids decode to the text streamed.
    let tok = sched.tokenizer();
    let ids: Vec<u32> = entries.iter().map(|e| e.id).collect();
    assert_eq!(tok.decode(&ids).unwrap(), text);
    for e in &entries {
        assert_eq!(e.bytes, tok.token_bytes(e.id));
    }
    for e in &entries {
        assert_eq!(e.top.len(), 3);
        assert!(e.logprob <= 0.0 && e.top.windows(2).all(|w| w[0].logprob >= w[1].logprob));
        // Greedy: the chosen token is the most likely one.
        assert_eq!(e.top[0].id, e.id);
        assert_eq!(e.top[0].logprob, e.logprob);
    }
    sched.shutdown().await;
}

/// Allows every token, then fails at its third commit.
struct FailsAtThirdToken {
    mask: TokenMask,
    commits: usize,
}

impl TokenConstraint for FailsAtThirdToken {
    fn allowed(&mut self) -> Result<&TokenMask, ConstraintError> {
        Ok(&self.mask)
    }
    fn commit(&mut self, token: u32) -> Result<(), ConstraintError> {
        self.commits += 1;
        if self.commits == 3 {
            return Err(ConstraintError::Rejected {
                token,
                reason: "test".into(),
            });
        }
        Ok(())
    }
    fn is_finished(&self) -> bool {
        false
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_constraint_aborts_its_own_stream_only() {
    let sched = tiny();
    let ids = prompt(&sched, "hello");
    let vocab = sched.tokenizer().vocab_size();
    let failing = Request {
        ignore_eos: true,
        constraint: Some(Box::new(FailsAtThirdToken {
            mask: TokenMask::all(vocab),
            commits: 0,
        })),
        ..request(ids.clone(), greedy(20), "failing")
    };
    let healthy = Request {
        ignore_eos: true,
        ..request(ids, greedy(20), "healthy")
    };
    let (a, b) = tokio::join!(run(&sched, failing), run(&sched, healthy));
    match a.outcome {
        Outcome::Aborted(AbortReason::EngineFailure(message)) => {
            assert!(message.contains("rejected token"), "{message}")
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(a.usage.completion_tokens, 2);
    assert_eq!(b.outcome, Outcome::Finished(FinishReason::Length));
    assert_eq!(b.usage.completion_tokens, 20);
    sched.shutdown().await;
}
