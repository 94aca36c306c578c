use super::*;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// A served model whose running requests, liveness and stops the test controls and counts.
#[derive(Debug, Clone)]
struct Fake {
    version: u32,
    running: Arc<AtomicUsize>,
    alive: Arc<AtomicBool>,
    stopped: Arc<AtomicUsize>,
}

impl Served for Fake {
    fn unavailable(&self) -> Option<String> {
        (!self.alive.load(Ordering::SeqCst)).then(|| "it stopped".to_string())
    }
    fn in_flight(&self) -> usize {
        self.running.load(Ordering::SeqCst)
    }
    async fn stop(self) {
        self.stopped.fetch_add(1, Ordering::SeqCst);
    }
}

/// What the test holds of one fake model's loads.
#[derive(Clone, Default)]
struct Probe {
    loads: Arc<AtomicUsize>,
    running: Arc<AtomicUsize>,
    alive: Arc<AtomicBool>,
    stopped: Arc<AtomicUsize>,
}

impl Probe {
    fn new() -> Self {
        let p = Probe::default();
        p.alive.store(true, Ordering::SeqCst);
        p
    }
    fn loader(&self, version: u32) -> Loader<Fake> {
        let p = self.clone();
        Arc::new(move |_: &Progress| {
            p.loads.fetch_add(1, Ordering::SeqCst);
            Ok(Fake {
                version,
                running: Arc::clone(&p.running),
                alive: Arc::clone(&p.alive),
                stopped: Arc::clone(&p.stopped),
            })
        })
    }
}

fn hub(budget: u64, wait: Duration) -> Hub {
    Hub::start(
        HubConfig {
            budget: Budget {
                host: budget,
                gpu: None,
            },
            load_wait: wait,
            keep_alive: KeepAlive::Forever,
            table: Default::default(),
        },
        tokio_util::sync::CancellationToken::new(),
    )
}

fn spec(
    ids: &[&str],
    key: &str,
    load: Loader<Fake>,
    bytes: u64,
    keep: Keep,
) -> UnitSpec<Fake, String> {
    UnitSpec {
        ids: ids.iter().map(|s| s.to_string()).collect(),
        key: key.to_string(),
        load,
        pull: None,
        need: Need {
            place: Place::Host,
            bytes,
        },
        keep,
        preload: true,
    }
}

const FOREVER: Keep = Keep {
    keep_alive: KeepAlive::Forever,
    pinned: false,
};

async fn until(what: &str, mut done: impl FnMut() -> bool) {
    for _ in 0..500 {
        if done() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("timed out waiting until {what}");
}

#[tokio::test]
async fn ids_share_a_load_requests_wait_for_it_and_health_reads_each_state() {
    let hub = hub(u64::MAX, Duration::from_secs(5));
    let models: Models<Fake, String> = Models::new("text", &hub);
    let (a, (go, wait)) = (Probe::new(), std::sync::mpsc::channel::<()>());
    let wait = Arc::new(Mutex::new(wait));
    let gated = a.loader(1);
    let gate: Loader<Fake> = Arc::new(move |p: &Progress| {
        wait.lock().unwrap().recv().unwrap();
        gated(p)
    });
    let failing: Loader<Fake> = Arc::new(|_: &Progress| Err("no such file".into()));
    models.apply(vec![
        spec(&["a", "b"], "ab", gate, 10, FOREVER),
        spec(&["c"], "c", failing, 10, FOREVER),
    ]);
    assert_eq!(models.status()["a"], Availability::Loading);
    let waiting = models.get("b");
    go.send(()).unwrap();
    assert_eq!(
        waiting.await.unwrap().version,
        1,
        "a request waits for the load"
    );
    assert_eq!(a.loads.load(Ordering::SeqCst), 1, "a and b share one load");
    assert_eq!(models.status()["a"], Availability::Ready);
    until("c has failed", || {
        models.status()["c"] != Availability::Loading
    })
    .await;
    assert_eq!(
        models.get("c").await.unwrap_err(),
        ModelError::Unavailable {
            id: "c".into(),
            why: "no such file".into()
        }
    );
    assert_eq!(models.status()["c"].describe(), "unavailable: no such file");
    assert!(matches!(models.get("x").await, Err(ModelError::Unknown(_))));
    let rows = models.rows();
    assert_eq!(rows[0].shares_with, vec!["b".to_string()]);
    assert_eq!(rows[2].error.as_deref(), Some("no such file"));

    // A loaded model whose engine stopped is unavailable, to requests and to health.
    a.alive.store(false, Ordering::SeqCst);
    assert!(matches!(
        models.get("a").await,
        Err(ModelError::Unavailable { .. })
    ));
    assert_eq!(models.status()["b"].describe(), "unavailable: it stopped");
}

#[tokio::test]
async fn an_idle_model_leaves_after_its_keep_alive_and_comes_back_on_demand() {
    let hub = hub(u64::MAX, Duration::from_secs(5));
    let models: Models<Fake, String> = Models::new("text", &hub);
    let (brief, pinned) = (Probe::new(), Probe::new());
    let at_once = Keep {
        keep_alive: KeepAlive::For(Duration::ZERO),
        pinned: false,
    };
    let pin = Keep {
        keep_alive: KeepAlive::For(Duration::ZERO),
        pinned: true,
    };
    models.apply(vec![
        spec(&["brief"], "brief", brief.loader(1), 10, at_once),
        spec(&["pinned"], "pinned", pinned.loader(1), 10, pin),
    ]);
    let lease = models.get("brief").await.unwrap();
    brief.running.store(1, Ordering::SeqCst);
    drop(lease);
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(
        models.status()["brief"],
        Availability::Ready,
        "a model with a running stream stays, whatever its keep-alive"
    );
    brief.running.store(0, Ordering::SeqCst);
    until("brief unloads", || {
        models.status()["brief"] == Availability::Unloaded
    })
    .await;
    assert_eq!(brief.stopped.load(Ordering::SeqCst), 1);
    assert_eq!(models.get("brief").await.unwrap().version, 1);
    assert_eq!(
        brief.loads.load(Ordering::SeqCst),
        2,
        "loaded again on demand"
    );
    assert_eq!(models.status()["pinned"], Availability::Ready);
    assert_eq!(
        pinned.stopped.load(Ordering::SeqCst),
        0,
        "pinned never leaves"
    );
    assert_eq!(
        models.unload("pinned"),
        Some(Err(ModelError::Pinned("pinned".into())))
    );
    assert!(hub.counters("text").snapshot().load_waits >= 1);
}

#[tokio::test]
async fn the_budget_evicts_the_least_recently_used_idle_model_and_refuses_when_all_are_busy() {
    let hub = hub(250, Duration::from_secs(5));
    let models: Models<Fake, String> = Models::new("text", &hub);
    let (a, b, c) = (Probe::new(), Probe::new(), Probe::new());
    let mut late = spec(&["c"], "c", c.loader(1), 100, FOREVER);
    late.preload = true;
    models.apply(vec![
        spec(&["a"], "a", a.loader(1), 100, FOREVER),
        spec(&["b"], "b", b.loader(1), 100, FOREVER),
        late,
    ]);
    until("a and b load", || {
        models.status()["a"] == Availability::Ready && models.status()["b"] == Availability::Ready
    })
    .await;
    assert_eq!(
        models.status()["c"],
        Availability::Unloaded,
        "a preload that does not fit waits for a request"
    );
    // b is used after a: a is the least recently used.
    drop(models.get("a").await.unwrap());
    tokio::time::sleep(Duration::from_millis(5)).await;
    drop(models.get("b").await.unwrap());
    let c_lease = models.get("c").await.unwrap();
    assert_eq!(models.status()["a"], Availability::Unloaded);
    assert_eq!(models.status()["b"], Availability::Ready);
    assert_eq!(a.stopped.load(Ordering::SeqCst), 1);

    // b and c busy: a has no room, and the refusal names who holds it.
    let _b_lease = models.get("b").await.unwrap();
    let refused = models.get("a").await.unwrap_err();
    let ModelError::NoRoom { why, .. } = &refused else {
        panic!("{refused:?}")
    };
    assert!(why.contains("b (1 MiB, busy, 1 requests)"), "{why}");
    assert!(why.contains("c (1 MiB, busy, 1 requests)"), "{why}");
    drop(c_lease);
    assert_eq!(
        models.get("a").await.unwrap().version,
        1,
        "c was idle: evicted"
    );
    assert_eq!(models.status()["c"], Availability::Unloaded);
}

#[tokio::test]
async fn unload_waits_for_running_requests_and_a_changed_model_switches_when_ready() {
    let hub = hub(u64::MAX, Duration::from_secs(5));
    let models: Models<Fake, String> = Models::new("text", &hub);
    let (old, new) = (Probe::new(), Probe::new());
    models.apply(vec![spec(&["m"], "v1", old.loader(1), 10, FOREVER)]);
    let running = models.get("m").await.unwrap();
    assert_eq!(running.version, 1);

    // Unloading a busy model defers it.
    assert_eq!(models.unload("m"), Some(Ok(())));
    assert_eq!(models.status()["m"], Availability::Ready);
    assert!(models.rows()[0].unload_when_idle);
    // A new request keeps it.
    drop(models.get("m").await.unwrap());
    assert!(!models.rows()[0].unload_when_idle);

    // A new version loads beside the one still serving a request, then takes over.
    let (go, wait) = std::sync::mpsc::channel::<()>();
    let wait = Arc::new(Mutex::new(wait));
    let gated = new.loader(2);
    let gate: Loader<Fake> = Arc::new(move |p: &Progress| {
        wait.lock().unwrap().recv().unwrap();
        gated(p)
    });
    let changes = models.apply(vec![spec(&["m"], "v2", gate, 10, FOREVER)]);
    assert_eq!(changes.changed, vec!["m".to_string()]);
    assert_eq!(models.rows()[0].next, Some(Phase::Loading));
    assert_eq!(
        models.get("m").await.unwrap().version,
        1,
        "old serves meanwhile"
    );
    go.send(()).unwrap();
    until("v2 takes over", || {
        models.loaded("m").map(|f| f.version) == Some(2)
    })
    .await;
    assert_eq!(
        old.stopped.load(Ordering::SeqCst),
        0,
        "v1 still runs a request"
    );
    drop(running);
    until("v1 unloads", || old.stopped.load(Ordering::SeqCst) == 1).await;

    // A reload that drops the id: requests no longer find it, and it unloads.
    let changes = models.apply(vec![]);
    assert_eq!(changes.removed, vec!["m".to_string()]);
    assert!(matches!(models.get("m").await, Err(ModelError::Unknown(_))));
    until("v2 unloads", || new.stopped.load(Ordering::SeqCst) == 1).await;
}

#[tokio::test]
async fn a_load_past_the_wait_answers_still_loading() {
    let hub = hub(u64::MAX, Duration::from_millis(100));
    let models: Models<Fake, String> = Models::new("text", &hub);
    let slow = Probe::new();
    let load = slow.loader(1);
    let sleepy: Loader<Fake> = Arc::new(move |p: &Progress| {
        std::thread::sleep(Duration::from_millis(400));
        load(p)
    });
    models.apply(vec![spec(&["slow"], "slow", sleepy, 10, FOREVER)]);
    assert!(matches!(
        models.get("slow").await,
        Err(ModelError::StillLoading { .. })
    ));
    let counters = hub.counters("text").snapshot();
    assert_eq!(counters.load_waits, 1);
    assert!(counters.load_wait_seconds >= 0.09);
}
