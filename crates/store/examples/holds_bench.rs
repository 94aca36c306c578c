//! Hold + settle throughput: TASKS concurrent tasks, each placing a hold and settling it (the
//! two store calls every paid request makes), for SECS seconds, on one user each (the common
//! case) or all on one user (the worst: every transaction waits for that user's row).
//!
//!   cargo run -p hearth-store --features postgres --example holds_bench -- sled [TASKS] [SECS] [one]
//!   cargo run -p hearth-store --features postgres --example holds_bench -- postgres://... [TASKS] [SECS] [one]
//!
//! Prints one line: backend, tasks, users, pairs/s, and the mean time of one pair.

use hearth_store::{LedgerMeta, Location, Store, StoreOptions};
use rust_decimal::Decimal;
use std::time::{Duration, Instant};

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let target = args.first().cloned().unwrap_or_else(|| "sled".into());
    let tasks: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(16);
    let secs: u64 = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(5);
    let one_user = args.get(3).is_some_and(|a| a == "one");
    let dir = tempfile::tempdir().expect("temp dir");
    let location = if target == "sled" {
        Location::Dir(dir.path().join("db"))
    } else {
        Location::Url(target.clone())
    };
    let options = StoreOptions {
        initial_balance: Decimal::from(1_000_000),
        node_id: "bench".into(),
        max_connections: u32::try_from(tasks).unwrap_or(16).max(1),
        ..StoreOptions::default()
    };
    let store = Store::open_at(&location, options)
        .await
        .expect("store opens");
    let stamp = std::process::id();
    let users: Vec<String> = (0..if one_user { 1 } else { tasks })
        .map(|i| format!("bench-{stamp}-{i}"))
        .collect();
    for u in &users {
        store.ensure_user(u, false).await.expect("user");
    }
    let deadline = Instant::now() + Duration::from_secs(secs);
    let workers: Vec<_> = (0..tasks)
        .map(|t| {
            let (store, user) = (store.clone(), users[t % users.len()].clone());
            tokio::spawn(async move {
                let meta = LedgerMeta::reason("bench");
                let (held, cost) = (Decimal::new(1, 2), Decimal::new(3, 3));
                let mut pairs = 0u64;
                while Instant::now() < deadline {
                    let hold = store.place_hold(&user, held, &meta).await.expect("hold");
                    store.settle_hold(hold.id, cost).await.expect("settle");
                    pairs += 1;
                }
                pairs
            })
        })
        .collect();
    let started = Instant::now();
    let mut pairs = 0;
    for w in workers {
        pairs += w.await.expect("worker");
    }
    let elapsed = started.elapsed().as_secs_f64();
    let backend = if target == "sled" { "sled" } else { "postgres" };
    println!(
        "{backend}: {tasks} tasks, {} user(s): {:.0} hold+settle pairs/s, {:.2} ms per pair",
        users.len(),
        pairs as f64 / elapsed,
        elapsed * 1000.0 * tasks as f64 / pairs.max(1) as f64
    );
}
