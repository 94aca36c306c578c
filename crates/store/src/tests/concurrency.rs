//! Money under concurrency, on both backends. On PostgreSQL the tasks are spread over separate
//! store handles (separate pools and node ids), as the requests of several Hearth nodes are.

use super::{both_backends, d, TestDb};
use crate::*;
use std::collections::HashMap;

both_backends!(
    concurrent_debits_and_credits_add_up_exactly_with_one_ledger_row_each,
    concurrent_holds_settles_and_releases_leave_exact_balances_and_a_ledger_that_replays,
    a_hold_settled_and_released_from_many_tasks_at_once_ends_exactly_once,
);

/// A small deterministic generator (xorshift64*), so a failure replays.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// 0 to `max_micros` millionths.
    fn money(&mut self, max_micros: u64) -> Decimal {
        Decimal::new(i64::try_from(self.below(max_micros + 1)).unwrap(), 6)
    }
}

/// The ledger replays to the balance (no hold open): the amounts add up to it. Each row's
/// `balance_after` is the spendable balance then, never below zero: the running total less what
/// other requests held at that moment, so exactly the running total when `no_holds_ran`.
async fn assert_ledger_replays(store: &Store, user: &str, no_holds_ran: bool) -> usize {
    let ledger = store.ledger(user).await.unwrap();
    let mut running = Decimal::ZERO;
    for e in &ledger {
        running += e.amount;
        let row = e.seq;
        assert!(
            e.balance_after >= Decimal::ZERO,
            "{user}: row {row} below zero"
        );
        if no_holds_ran {
            assert_eq!(
                e.balance_after, running,
                "{user}: row {row} does not replay"
            );
        } else {
            assert!(
                e.balance_after <= running,
                "{user}: row {row} above the total"
            );
        }
    }
    assert_eq!(running, store.balance(user).await.unwrap(), "{user}");
    ledger.len()
}

pub(crate) async fn concurrent_debits_and_credits_add_up_exactly_with_one_ledger_row_each(
    db: &TestDb,
) {
    let nodes = db.nodes("1000", 2).await;
    nodes[0].ensure_user("dave", false).await.unwrap();
    let tasks: Vec<_> = (0..8)
        .map(|t| {
            let store = nodes[t % nodes.len()].clone();
            tokio::spawn(async move {
                for i in 0..25 {
                    let meta = LedgerMeta::reason(format!("t{t} op{i}"));
                    if (t + i) % 3 == 0 {
                        store.credit("dave", d("0.5"), &meta).await.unwrap();
                    } else {
                        store.debit("dave", d("1.25"), &meta).await.unwrap();
                    }
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let ops: Vec<(usize, usize)> = (0..8).flat_map(|t| (0..25).map(move |i| (t, i))).collect();
    let credits = ops.iter().filter(|(t, i)| (t + i) % 3 == 0).count() as i64;
    let debits = ops.len() as i64 - credits;
    let expected =
        d("1000") + Decimal::from(credits) * d("0.5") - Decimal::from(debits) * d("1.25");
    assert_eq!(nodes[1].balance("dave").await.unwrap(), expected);
    assert_eq!(
        assert_ledger_replays(&nodes[0], "dave", true).await,
        1 + ops.len()
    );
}

/// What one task did to one user.
#[derive(Default, Clone, Copy)]
struct Tally {
    settled: Decimal,
    credited: Decimal,
    /// Ledger rows written: settles of more than nothing, and credits.
    rows: usize,
    refused: usize,
}

/// The property: tasks on several nodes place, settle (for any part of the hold, or try more
/// than it and are refused) and release holds and credit the same few users, at once. Each
/// user's final balance is the initial one plus credits minus settled sums exactly, no hold is
/// left, and the ledger replays to the balance without ever going below zero.
pub(crate) async fn concurrent_holds_settles_and_releases_leave_exact_balances_and_a_ledger_that_replays(
    db: &TestDb,
) {
    const USERS: [&str; 3] = ["p0", "p1", "p2"];
    const TASKS: u64 = 12;
    const OPS: usize = 30;
    let nodes = db.nodes("20", 3).await;
    for u in USERS {
        nodes[0].ensure_user(u, false).await.unwrap();
    }
    let tasks: Vec<_> = (0..TASKS)
        .map(|t| {
            let store = nodes[t as usize % nodes.len()].clone();
            tokio::spawn(async move {
                let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ (t + 1));
                let mut tally: HashMap<&str, Tally> = HashMap::new();
                for i in 0..OPS {
                    let user = USERS[rng.below(USERS.len() as u64) as usize];
                    let mine = tally.entry(user).or_default();
                    let meta = LedgerMeta::reason(format!("t{t} op{i}"));
                    if rng.below(10) == 0 {
                        store.credit(user, d("1"), &meta).await.unwrap();
                        mine.credited += d("1");
                        mine.rows += 1;
                        continue;
                    }
                    let amount = rng.money(4_000_000);
                    let hold = match store.place_hold(user, amount, &meta).await {
                        Ok(h) => h,
                        Err(Error::InsufficientFunds { needed, available }) => {
                            assert!(needed > available);
                            mine.refused += 1;
                            continue;
                        }
                        Err(e) => panic!("{e}"),
                    };
                    if rng.below(3) == 0 {
                        tokio::task::yield_now().await;
                    }
                    match rng.below(4) {
                        0 => {
                            store.release_hold(hold.id).await.unwrap();
                        }
                        1 => {
                            let over = amount + d("0.000001");
                            assert!(matches!(
                                store.settle_hold(hold.id, over).await,
                                Err(Error::SettleExceedsHold { .. })
                            ));
                            store.settle_hold(hold.id, amount).await.unwrap();
                            mine.settled += amount;
                            mine.rows += usize::from(!amount.is_zero());
                        }
                        _ => {
                            let cost = Decimal::new(
                                i64::try_from(
                                    rng.below(u64::try_from(amount.mantissa()).unwrap() + 1),
                                )
                                .unwrap(),
                                6,
                            );
                            store.settle_hold(hold.id, cost).await.unwrap();
                            mine.settled += cost;
                            mine.rows += usize::from(!cost.is_zero());
                        }
                    }
                }
                tally
            })
        })
        .collect();
    let mut total: HashMap<&str, Tally> = HashMap::new();
    for t in tasks {
        for (user, tally) in t.await.unwrap() {
            let sum = total.entry(user).or_default();
            sum.settled += tally.settled;
            sum.credited += tally.credited;
            sum.rows += tally.rows;
            sum.refused += tally.refused;
        }
    }
    for user in USERS {
        let t = total.get(user).copied().unwrap_or_default();
        let balance = nodes[0].balance(user).await.unwrap();
        assert_eq!(balance, d("20") + t.credited - t.settled, "{user}");
        assert!(nodes[0].holds(user).await.unwrap().is_empty(), "{user}");
        assert_eq!(
            assert_ledger_replays(&nodes[1], user, false).await,
            1 + t.rows,
            "{user}"
        );
    }
    // The run did exercise the refusals (balances of 20 against holds of up to 4).
    assert!(total.values().map(|t| t.refused).sum::<usize>() > 0);
}

/// Hostile: many tasks, on several nodes, settle and release the same hold at once. Exactly
/// one wins; the others are told the hold is gone, and the balance moved once.
pub(crate) async fn a_hold_settled_and_released_from_many_tasks_at_once_ends_exactly_once(
    db: &TestDb,
) {
    let nodes = db.nodes("100", 2).await;
    nodes[0].ensure_user("race", false).await.unwrap();
    let mut charged = Decimal::ZERO;
    for round in 0..10 {
        let hold = nodes[round % 2]
            .place_hold("race", d("5"), &LedgerMeta::reason("race"))
            .await
            .unwrap();
        let racers: Vec<_> = (0..8)
            .map(|i| {
                let store = nodes[i % nodes.len()].clone();
                tokio::spawn(async move {
                    let r = if i % 2 == 0 {
                        store.settle_hold(hold.id, d("2")).await
                    } else {
                        store.release_hold(hold.id).await
                    };
                    (i, r)
                })
            })
            .collect();
        let mut winners = Vec::new();
        for r in racers {
            match r.await.unwrap() {
                (i, Ok(_)) => winners.push(i),
                (_, Err(Error::UnknownHold(id))) => assert_eq!(id, hold.id),
                (_, Err(e)) => panic!("{e}"),
            }
        }
        assert_eq!(
            winners.len(),
            1,
            "round {round}: {winners:?} all ended the hold"
        );
        if winners[0] % 2 == 0 {
            charged += d("2");
        }
        assert_eq!(nodes[1].balance("race").await.unwrap(), d("100") - charged);
    }
    assert_ledger_replays(&nodes[0], "race", false).await;
}
