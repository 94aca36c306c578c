//! Holds: funds reserved before a request's work starts, settled with its real cost or
//! released, exactly once, on every path.

use std::sync::Arc;

use hearth_store::{Hold, LedgerMeta, Store};
use rust_decimal::Decimal;

use crate::flows::Flows;
use crate::journal::{Entry, Journal};
use crate::{Margin, Result};

/// What settling did to the balance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Charge {
    pub cost: Decimal,
    /// The spendable balance before the hold was placed.
    pub balance_before: Decimal,
    /// The balance the store has after the settlement; for a [`Charge::journaled`] one, the
    /// balance before less the cost (what this request alone did to it).
    pub balance_after: Decimal,
    /// The store could not be reached: the settlement waits in the node's journal, which hands
    /// it to the store once it answers (the hold stays open until then).
    pub journaled: bool,
}

/// Metering on top of the store: the default margin, balances and holds, and the money each
/// service moved ([`Meter::flows`]).
#[derive(Clone)]
pub struct Meter {
    store: Store,
    default_margin: Margin,
    flows: Arc<Flows>,
    /// Whose totals the money this meter moves adds to.
    service: &'static str,
    /// Where settlements and releases wait while the store is unreachable; without one they
    /// fail (a settlement is then released, and a release waits for the node's next start).
    journal: Option<Arc<Journal>>,
}

/// The service of a [`Meter`] that [`Meter::for_service`] has not named.
pub const UNATTRIBUTED: &str = "unattributed";

impl Meter {
    pub fn new(store: Store, default_margin: Margin) -> Self {
        Self {
            store,
            default_margin,
            flows: Arc::default(),
            service: UNATTRIBUTED,
            journal: None,
        }
    }

    /// The same meter, keeping settlements the store cannot take in `journal`.
    pub fn with_journal(self, journal: Arc<Journal>) -> Meter {
        Meter {
            journal: Some(journal),
            ..self
        }
    }

    /// The journal this meter keeps settlements in, if any.
    pub fn journal(&self) -> Option<&Arc<Journal>> {
        self.journal.as_ref()
    }

    /// The same meter, counting the money it moves under `service` (the totals stay shared).
    pub fn for_service(&self, service: &'static str) -> Meter {
        Meter {
            service,
            ..self.clone()
        }
    }

    /// The money moved so far, per service.
    pub fn flows(&self) -> &Arc<Flows> {
        &self.flows
    }

    /// Counts an admin credit (`amount` > 0) or debit (`amount` < 0) already applied to a
    /// balance.
    pub fn record_admin_change(&self, amount: Decimal) {
        self.flows.add(self.service, |t| {
            if amount >= Decimal::ZERO {
                t.credited += amount;
            } else {
                t.debited -= amount;
            }
        });
    }

    /// The margin a request pays: its own override, else the configured default.
    pub fn margin(&self, requested: Option<Margin>) -> Margin {
        requested.unwrap_or(self.default_margin)
    }

    /// The user's spendable balance.
    pub async fn balance(&self, user_id: &str) -> Result<Decimal> {
        Ok(self.store.balance(user_id).await?)
    }

    /// Reserves `amount` for a request; [`Error::InsufficientFunds`] when the balance is short
    /// (nothing is held then).
    ///
    /// The hold comes back as [`HeldFunds`], which releases it when dropped. It is wrapped in
    /// the task that placed it, so a caller that goes away while the hold is being placed (its
    /// future dropped mid-await) releases it too: the value is dropped with the task's unread
    /// output.
    pub async fn hold(
        &self,
        user_id: &str,
        amount: Decimal,
        meta: LedgerMeta,
    ) -> Result<HeldFunds> {
        let (store, user) = (self.store.clone(), user_id.to_string());
        let (flows, service) = (Arc::clone(&self.flows), self.service);
        let journal = self.journal.clone();
        let placing = tokio::spawn(async move {
            let hold = store.place_hold(&user, amount, &meta).await?;
            flows.add(service, |t| t.held += hold.amount);
            Ok::<_, crate::Error>(HeldFunds {
                store,
                hold: Some(hold),
                flows,
                service,
                journal,
            })
        });
        placing.await?
    }
}

/// Funds reserved for one request: an owned hold that is settled with the real cost
/// ([`HeldFunds::settle`]) or, on every other path (an error, a cancelled future, a client gone,
/// a panic), released when dropped. So no path strands money: what [`Meter::hold`] placed always
/// ends.
#[must_use = "dropping the funds releases the hold"]
pub struct HeldFunds {
    store: Store,
    /// `Some` until settled or released.
    hold: Option<Hold>,
    /// Where the settlement or release is counted.
    flows: Arc<Flows>,
    service: &'static str,
    journal: Option<Arc<Journal>>,
}

impl HeldFunds {
    /// The amount held.
    pub fn amount(&self) -> Decimal {
        self.hold.as_ref().map_or(Decimal::ZERO, |h| h.amount)
    }

    /// Whose funds these are.
    pub fn user_id(&self) -> &str {
        self.hold.as_ref().map_or("", |h| h.user_id.as_str())
    }

    /// Settles with the real cost (at most the held amount).
    ///
    /// When the store cannot be reached, the settlement is written to the journal (durably,
    /// before this returns) and comes back as a [`Charge::journaled`] charge: the cost stands,
    /// and the journal hands it to the store later. If the store refuses it outright, or it
    /// cannot be journaled either, the hold is released (the user is not charged) before the
    /// error is returned, so a balance read afterwards already has the funds back.
    pub async fn settle(mut self, cost: Decimal) -> Result<Charge> {
        let Some(hold) = self.hold.take() else {
            unreachable!("a HeldFunds holds its hold until it is consumed");
        };
        // The store finishes the settlement even if this future is dropped meanwhile.
        let e = match self.store.settle_hold(hold.id, cost).await {
            Ok(change) => {
                self.count_settled(hold.amount, cost);
                return Ok(Charge {
                    cost,
                    balance_before: change.before,
                    balance_after: change.after,
                    journaled: false,
                });
            }
            Err(e) => e,
        };
        let entry = Entry {
            hold: hold.clone(),
            cost,
        };
        let e = match self.take_over(e, entry).await {
            Ok(()) => {
                self.count_settled(hold.amount, cost);
                return Ok(Charge {
                    cost,
                    balance_before: hold.balance_before,
                    balance_after: hold.balance_before - cost,
                    journaled: true,
                });
            }
            Err(e) => crate::Error::from(e),
        };
        // Put it back so that if this future is dropped now, dropping `self` releases it.
        self.hold = Some(hold);
        if let Err(release) = self.release_now().await {
            tracing::warn!(error = %release, "releasing a hold whose settlement failed failed too");
        }
        Err(e)
    }

    /// The journal's [`Journal::take_over`], or `error` back without one.
    async fn take_over(
        &self,
        error: hearth_store::Error,
        entry: Entry,
    ) -> hearth_store::Result<()> {
        match &self.journal {
            Some(journal) => journal.take_over_async(error, entry).await,
            None => Err(error),
        }
    }

    fn count_settled(&self, held: Decimal, cost: Decimal) {
        self.flows.add(self.service, |t| {
            t.charged += cost;
            t.released += held - cost;
        });
    }

    /// Gives the hold back untouched and waits until the store has done so.
    pub async fn release(mut self) -> Result<()> {
        self.release_now().await
    }

    /// Releases the hold, or journals the release when the store cannot be reached (the
    /// journal gives it back once the store answers; that counts as done here).
    async fn release_now(&mut self) -> Result<()> {
        let Some((id, amount)) = self.hold.as_ref().map(|h| (h.id, h.amount)) else {
            return Ok(());
        };
        // Taken only once released, so a drop mid-await still releases it.
        if let Err(e) = self.store.release_hold(id).await {
            let Some(hold) = self.hold.clone() else {
                return Err(e.into());
            };
            let release = Entry {
                hold,
                cost: Decimal::ZERO,
            };
            self.take_over(e, release).await?;
        }
        self.hold = None;
        self.flows.add(self.service, |t| t.released += amount);
        Ok(())
    }
}

impl Drop for HeldFunds {
    fn drop(&mut self) {
        let Some(hold) = self.hold.take() else { return };
        let (flows, service) = (Arc::clone(&self.flows), self.service);
        let journal = self.journal.clone();
        let (id, amount) = (hold.id, hold.amount);
        self.store.release_in_background(id, move |result| match result {
            Ok(_) => {
                flows.add(service, |t| t.released += amount);
                tracing::info!(hold = %id, user = %hold.user_id, amount = %amount, "hold released: the request ended without settling")
            }
            // A short fsync on the runtime's thread, once per hold dropped while the store is
            // unreachable. Without the journal the hold stays in the store: its node gives it
            // back at its next start (or `hearth holds release --node` does).
            Err(e) => {
                let release = Entry {
                    hold,
                    cost: Decimal::ZERO,
                };
                let kept = match journal {
                    Some(journal) => journal.take_over(e, release),
                    None => Err(e),
                };
                match kept {
                    Ok(()) => flows.add(service, |t| t.released += amount),
                    Err(e) => tracing::warn!(hold = %id, error = %e, "releasing a dropped hold failed"),
                }
            }
        });
    }
}

impl std::fmt::Debug for HeldFunds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HeldFunds")
            .field("hold", &self.hold.as_ref().map(|h| h.id))
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::{d, store_with};
    use crate::Error;

    /// Waits (up to 5 s) until `user` has no open hold.
    async fn holds_end(store: &Store, user: &str) -> bool {
        for _ in 0..500 {
            if store.holds(user).await.unwrap().is_empty() {
                return true;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        false
    }

    #[tokio::test]
    async fn a_hold_whose_caller_goes_away_while_it_is_being_placed_is_released() {
        let (_dir, store) = store_with("ann", "10").await;
        let meter = Meter::new(store.clone(), Margin::ZERO);
        // Poll the placement once (it is then on its blocking thread) and drop it: the caller
        // went away mid-await, as a handler does when its client disconnects.
        let mut placing = Box::pin(meter.hold("ann", d("3"), LedgerMeta::reason("test")));
        let first = futures::poll!(placing.as_mut());
        assert!(
            first.is_pending(),
            "the placement finished before it could be cut"
        );
        drop(placing);
        assert!(holds_end(&store, "ann").await, "the hold was stranded");
        assert_eq!(store.balance("ann").await.unwrap(), d("10"));
    }

    #[tokio::test]
    async fn held_funds_settle_once_and_are_released_when_dropped() {
        let (_dir, store) = store_with("bob", "10").await;
        let meter = Meter::new(store.clone(), Margin::ZERO);
        let meta = || LedgerMeta::reason("test");
        let held = meter.hold("bob", d("4"), meta()).await.unwrap();
        assert_eq!(held.amount(), d("4"));
        assert_eq!(store.balance("bob").await.unwrap(), d("6"));
        let charge = held.settle(d("1.5")).await.unwrap();
        assert_eq!(
            (charge.balance_before, charge.balance_after),
            (d("10"), d("8.5"))
        );
        assert!(store.holds("bob").await.unwrap().is_empty());

        let dropped = meter.hold("bob", d("8"), meta()).await.unwrap();
        assert_eq!(store.balance("bob").await.unwrap(), d("0.5"));
        drop(dropped);
        assert!(holds_end(&store, "bob").await, "a dropped hold stayed");
        assert_eq!(meter.balance("bob").await.unwrap(), d("8.5"));
        // A hold beyond the balance is refused and places nothing.
        let refused = meter.hold("bob", d("9"), meta()).await.unwrap_err();
        assert!(
            matches!(refused, Error::InsufficientFunds { needed, available } if needed == d("9") && available == d("8.5")),
            "{refused:?}"
        );
        assert!(store.holds("bob").await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn a_settlement_the_store_refuses_releases_the_hold() {
        let (_dir, store) = store_with("cy", "10").await;
        let meter = Meter::new(store.clone(), Margin::ZERO);
        let held = meter
            .hold("cy", d("2"), LedgerMeta::reason("test"))
            .await
            .unwrap();
        // More than was held: the store refuses the settlement, and the hold is back at once.
        assert!(held.settle(d("3")).await.is_err());
        assert!(
            store.holds("cy").await.unwrap().is_empty(),
            "the refused settlement kept its hold"
        );
        assert_eq!(store.balance("cy").await.unwrap(), d("10"));
    }

    #[tokio::test]
    async fn money_moved_is_counted_per_service_and_every_hold_ends_in_the_totals() {
        let (_dir, store) = store_with("dee", "10").await;
        let base = Meter::new(store.clone(), Margin::ZERO);
        let chat = base.for_service("completion");
        let images = base.for_service("imagine");
        let meta = || LedgerMeta::reason("test");
        // Settled below the hold: the rest counts as released.
        let held = chat.hold("dee", d("4"), meta()).await.unwrap();
        held.settle(d("1.5")).await.unwrap();
        // Released on purpose, and dropped.
        chat.hold("dee", d("1"), meta())
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
        drop(images.hold("dee", d("2"), meta()).await.unwrap());
        assert!(holds_end(&store, "dee").await);
        // The drop releases on a blocking thread: wait for its count too.
        for _ in 0..500 {
            if base.flows().totals("imagine").released == d("2") {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        base.for_service("auth").record_admin_change(d("5"));
        base.for_service("auth").record_admin_change(d("-0.25"));

        let flows = base.flows();
        let chat = flows.totals("completion");
        assert_eq!(
            (chat.held, chat.charged, chat.released),
            (d("5"), d("1.5"), d("3.5"))
        );
        let images = flows.totals("imagine");
        assert_eq!(
            (images.held, images.charged, images.released),
            (d("2"), d("0"), d("2"))
        );
        let auth = flows.totals("auth");
        assert_eq!((auth.credited, auth.debited), (d("5"), d("0.25")));
        assert_eq!(flows.totals("markdown"), crate::FlowTotals::default());
    }

    #[test]
    fn the_request_margin_wins_over_the_default() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), Default::default()).unwrap();
        let five = Margin::percent(d("5")).unwrap();
        let meter = Meter::new(store, five);
        assert_eq!(meter.margin(None), five);
        let twelve = Margin::from_f64(12.5).unwrap();
        assert_eq!(meter.margin(Some(twelve)), twelve);
    }
}
