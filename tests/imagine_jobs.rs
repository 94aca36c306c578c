//! Images as jobs (`POST /stream`, `POST /jobs/shutdown`, `GET /jobs/{id}`), on the tiny
//! SDXL-shaped model: a job's event sequence with previews and its billed answer; a job stopped
//! by id and one whose client goes away, each within one step, paying nothing and holding
//! nothing; a waiting job told its place as the jobs ahead finish; and two users' jobs taking
//! turns.

use std::time::Duration;

use futures::StreamExt;
use hearth_server::Service;
use rust_decimal::Decimal;
use serde_json::{json, Value};

use crate::imagine::ImagineApp;

/// A job that takes a while on the tiny model (512², 8 steps: seconds on two cores).
fn slow(token: &str, seed: u64) -> Value {
    json!({"serviceToken": token, "prompt": "x", "width": 512, "height": 512, "steps": 8, "seed": seed})
}

/// An open job stream: its id and its events as they come.
struct Job {
    id: String,
    events: futures::stream::BoxStream<'static, Value>,
}

impl Job {
    /// Reads the events until the first step is reported.
    async fn first_step(&mut self) {
        while self.events.next().await.unwrap().get("step").is_none() {}
    }
}

async fn start(img: &ImagineApp, body: Value) -> Job {
    let response = img
        .app
        .client
        .post(format!("{}/stream", img.app.url(Service::Imagine)))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let id = response.headers()["x-job-id"].to_str().unwrap().to_string();
    let bytes = response.bytes_stream();
    let events =
        futures::stream::unfold((bytes, String::new()), |(mut bytes, mut buf)| async move {
            loop {
                if let Some(end) = buf.find("\n\n") {
                    let event: String = buf.drain(..end + 2).collect();
                    if let Some(data) = event.lines().find_map(|l| l.strip_prefix("data:")) {
                        let value: Value = serde_json::from_str(data.trim()).unwrap();
                        return Some((value, (bytes, buf)));
                    }
                    continue;
                }
                let chunk = bytes.next().await?.ok()?;
                buf.push_str(&String::from_utf8_lossy(&chunk));
            }
        })
        .boxed();
    Job { id, events }
}

async fn state(img: &ImagineApp, id: &str) -> Value {
    let url = format!("{}/jobs/{id}", img.app.url(Service::Imagine));
    img.app
        .client
        .get(url)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

async fn balance(img: &ImagineApp, user: &str) -> Decimal {
    img.app.running().state.store.balance(user).await.unwrap()
}

async fn no_holds(img: &ImagineApp, user: &str) {
    let store = img.app.running().state.store.clone();
    for _ in 0..600 {
        if store.holds(user).await.unwrap().is_empty() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{user} still has a hold");
}

#[tokio::test]
async fn a_job_streams_its_place_its_steps_with_previews_and_its_billed_image() {
    let img = ImagineApp::start("1", "").await;
    let token = img.app.token("jo").await;
    let mut body = json!({"serviceToken": token, "prompt": "a lighthouse", "width": 256,
        "height": 256, "steps": 4, "seed": 5});
    body["previewEvery"] = json!(2);
    let mut job = start(&img, body.clone()).await;
    let mut events = Vec::new();
    while let Some(event) = job.events.next().await {
        events.push(event);
    }
    assert_eq!(events[0], json!({"queued": {"position": 0}}), "{events:?}");
    let steps: Vec<&Value> = events.iter().filter_map(|e| e.get("step")).collect();
    assert_eq!(steps.len(), 4);
    for (i, step) in steps.iter().enumerate() {
        assert_eq!(step["step"], i + 1);
        assert_eq!(step["steps"], 4);
        // A preview every second step: a small PNG (an eighth of the image's size).
        match step.get("preview") {
            Some(url) => {
                assert_eq!((i + 1) % 2, 0);
                let b64 = url
                    .as_str()
                    .unwrap()
                    .strip_prefix("data:image/png;base64,")
                    .unwrap();
                use base64::Engine as _;
                let png = base64::engine::general_purpose::STANDARD
                    .decode(b64)
                    .unwrap();
                let preview = image::load_from_memory(&png).unwrap();
                assert_eq!((preview.width(), preview.height()), (32, 32));
            }
            None => assert_eq!((i + 1) % 2, 1),
        }
    }
    let last = events.last().unwrap();
    assert_eq!(last["completed"], true, "{last}");
    let response = &last["response"];
    // The spec's answer, and the same image `POST /` makes for the same request.
    body.as_object_mut().unwrap().remove("previewEvery");
    let (status, whole) = img.imagine(body).await;
    assert_eq!(status, 200);
    assert_eq!(response["imageUrl"], whole["imageUrl"]);
    assert_eq!(response["usage"], whole["usage"]);
    assert_eq!(response["metadata"], whole["metadata"]);
    assert_eq!(state(&img, &job.id).await["state"], "completed");
    // Two images at their price, nothing held.
    no_holds(&img, "jo").await;
    let cost: Decimal = response["usage"]["cost"].as_str().unwrap().parse().unwrap();
    assert_eq!(balance(&img, "jo").await, Decimal::ONE - cost - cost);
}

#[tokio::test]
async fn a_job_stopped_by_id_or_by_its_client_stops_within_a_step_and_pays_nothing() {
    let img =
        ImagineApp::start_with("1", "", |raw| raw.imagine.max_concurrent_per_user = Some(0)).await;
    let token = img.app.token("stopper").await;
    // By id: once the first step is reported, stop it.
    let mut job = start(&img, slow(&token, 1)).await;
    job.first_step().await;
    let url = format!("{}/jobs/shutdown", img.app.url(Service::Imagine));
    let answer: Value = img
        .app
        .client
        .post(&url)
        .json(&json!({"jobId": job.id}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(answer["status"], "terminated");
    assert_eq!(answer["state"], "cancelled");
    let mut after = Vec::new();
    while let Some(event) = job.events.next().await {
        after.push(event);
    }
    let steps_after = after.iter().filter(|e| e.get("step").is_some()).count();
    assert!(steps_after <= 1, "stopped within a step: {after:?}");
    assert_eq!(
        after.last().unwrap(),
        &json!({"aborted": true, "reason": "cancelled"})
    );
    assert_eq!(state(&img, &job.id).await["state"], "cancelled");
    // Again: a stopped job is not found.
    let again = img
        .app
        .client
        .post(&url)
        .json(&json!({"jobId": job.id}))
        .send()
        .await
        .unwrap();
    assert_eq!(again.status(), 404);

    // By its client: the stream dropped after the first step.
    let mut job = start(&img, slow(&token, 2)).await;
    job.first_step().await;
    let id = job.id.clone();
    drop(job);
    let mut stopped = false;
    for _ in 0..200 {
        if state(&img, &id).await["state"] == "cancelled" {
            stopped = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(stopped, "{}", state(&img, &id).await);
    no_holds(&img, "stopper").await;
    assert_eq!(balance(&img, "stopper").await, Decimal::ONE);
}

#[tokio::test]
async fn waiting_jobs_learn_their_place_and_users_take_turns() {
    let img = ImagineApp::start_with("10", "max_queued = 8", |raw| {
        raw.imagine.max_concurrent_per_user = Some(0)
    })
    .await;
    let (ann, bob) = (img.app.token("ann").await, img.app.token("bob").await);
    // Ann's first job runs; her next two wait; then Bob's one.
    let mut a1 = start(&img, slow(&ann, 1)).await;
    a1.first_step().await;
    let a2 = start(&img, slow(&ann, 2)).await;
    let a3 = start(&img, slow(&ann, 3)).await;
    let b1 = start(&img, slow(&bob, 4)).await;
    // Each job's events to its end, and when it ended.
    let finish = |mut job: Job| {
        tokio::spawn(async move {
            let mut events = Vec::new();
            while let Some(e) = job.events.next().await {
                events.push(e);
            }
            (events, std::time::Instant::now())
        })
    };
    let (a1, a2, a3, b1) = (finish(a1), finish(a2), finish(a3), finish(b1));
    let (a1, a2, a3, b1) = (
        a1.await.unwrap(),
        a2.await.unwrap(),
        a3.await.unwrap(),
        b1.await.unwrap(),
    );
    for (events, _) in [&a1, &a2, &a3, &b1] {
        assert_eq!(events.last().unwrap()["completed"], true);
    }
    let places = |events: &[Value]| -> Vec<u64> {
        events
            .iter()
            .filter_map(|e| e["queued"]["position"].as_u64())
            .collect()
    };
    // Bob's job came after Ann's three, yet waits behind one of them only: it runs second of
    // the waiting ones, and Ann's third waits behind it.
    assert_eq!(places(&b1.0), vec![1, 0], "{:?}", b1.0);
    assert_eq!(places(&a3.0), vec![1, 2, 1, 0], "{:?}", a3.0);
    assert_eq!(places(&a2.0), vec![0]);
    assert!(a2.1 < b1.1 && b1.1 < a3.1, "turns: Ann, Bob, Ann");
    no_holds(&img, "ann").await;
    no_holds(&img, "bob").await;
}

#[tokio::test]
async fn hostile_job_requests_are_refused_in_the_services_shape_with_nothing_held() {
    let img = ImagineApp::start("1", "").await;
    let token = img.app.token("mal").await;
    let base = img.app.url(Service::Imagine);
    let ok = json!({"serviceToken": token, "prompt": "x", "width": 256, "height": 256, "steps": 1});
    let with = |k: &str, v: Value| {
        let mut body = ok.clone();
        body[k] = v;
        body
    };
    let cases: Vec<(&str, &str, Value, u16, &str)> = vec![
        (
            "preview too often",
            "/stream",
            with("previewEvery", json!(65)),
            400,
            "previewEvery",
        ),
        (
            "preview not a number",
            "/stream",
            with("previewEvery", json!("2")),
            400,
            "previewEvery",
        ),
        (
            "negative preview",
            "/stream",
            with("previewEvery", json!(-1)),
            400,
            "previewEvery",
        ),
        (
            "bad size",
            "/stream",
            with("width", json!(100)),
            400,
            "width",
        ),
        ("no token", "/stream", json!({"prompt": "x"}), 401, ""),
        (
            "shutdown without id",
            "/jobs/shutdown",
            json!({}),
            400,
            "jobId",
        ),
        (
            "shutdown of no job",
            "/jobs/shutdown",
            json!({"jobId": "not-a-job"}),
            404,
            "",
        ),
    ];
    for (name, path, body, status, field) in cases {
        let response = img
            .app
            .client
            .post(format!("{base}{path}"))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status().as_u16(), status, "{name}");
        let answer: Value = response.json().await.unwrap();
        assert!(answer["error"]["type"].is_string(), "{name}: {answer}");
        if !field.is_empty() {
            assert_eq!(
                answer["error"]["details"]["field"], field,
                "{name}: {answer}"
            );
        }
    }
    let unknown = img
        .app
        .client
        .get(format!("{base}/jobs/{}", "x".repeat(10_000)))
        .send()
        .await
        .unwrap();
    assert_eq!(unknown.status(), 404);
    no_holds(&img, "mal").await;
    assert_eq!(balance(&img, "mal").await, Decimal::ONE);
}
