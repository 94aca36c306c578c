//! The store's circuit: after a few calls in a row fail because the database cannot be
//! reached, calls are refused at once ([`Error::Unavailable`]) instead of each waiting on the
//! connection pool, so a paid request is answered within a second while the database is down.
//! Once the cool-off has passed, one call goes through as a trial; the first call that reaches
//! the database closes the circuit again.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::Error;

/// Unreachable-database failures in a row that open the circuit.
const FAILURES_TO_OPEN: u32 = 3;

/// How long an open circuit refuses before it lets a trial call through. Also the figure a
/// refusal gives clients to come back after ([`crate::RETRY_AFTER`]).
pub(crate) const COOL_OFF: Duration = Duration::from_secs(1);

/// Every store call passes here twice, so a closed circuit with nothing to forget costs two
/// atomic loads and no write.
#[derive(Debug)]
pub(crate) struct Circuit {
    /// Unreachable-database failures since the last call that reached it.
    failures: AtomicU32,
    /// While open: when the next trial call may go through, in milliseconds since `epoch`;
    /// 0 while closed.
    open_until_ms: AtomicU64,
    epoch: Instant,
}

impl Default for Circuit {
    fn default() -> Self {
        Self {
            failures: AtomicU32::new(0),
            open_until_ms: AtomicU64::new(0),
            epoch: Instant::now(),
        }
    }
}

/// What the store looks like from here, for health answers and `/metrics`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reachability {
    /// The last call reached the database (or none has failed yet).
    Reachable,
    /// Calls are failing because the database cannot be reached; the circuit is still closed.
    Failing,
    /// The circuit is open: calls are refused without trying the database.
    Open,
}

impl Circuit {
    /// Milliseconds since `epoch`, plus `later`; never 0 (which means closed).
    fn at(&self, later: Duration) -> u64 {
        u64::try_from((self.epoch.elapsed() + later).as_millis())
            .unwrap_or(u64::MAX)
            .max(1)
    }

    /// Lets a call through, or refuses it while the circuit is open. When the cool-off has
    /// passed, this call is the trial and the others keep being refused until it ends.
    pub(crate) fn admit(&self) -> Result<(), Error> {
        let until = self.open_until_ms.load(Ordering::Acquire);
        if until == 0 {
            return Ok(());
        }
        let refused = Err(Error::Unavailable {
            retry_after: COOL_OFF,
        });
        if self.at(Duration::ZERO) < until {
            return refused;
        }
        // The first caller past the cool-off moves it on and is the trial.
        let next = self.at(COOL_OFF);
        match self
            .open_until_ms
            .compare_exchange(until, next, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => Ok(()),
            Err(_) => refused,
        }
    }

    /// Counts a call's outcome: any answer from the database (even a refusal) closes the
    /// circuit; a failure to reach it counts towards opening it.
    pub(crate) fn record<T>(&self, result: &Result<T, Error>) {
        match result {
            // Its own refusals do not keep it open longer.
            Err(Error::Unavailable { .. }) => {}
            Err(e) if e.is_unavailable() => {
                let failures = self
                    .failures
                    .fetch_add(1, Ordering::AcqRel)
                    .saturating_add(1);
                if failures >= FAILURES_TO_OPEN {
                    let was = self.open_until_ms.swap(self.at(COOL_OFF), Ordering::AcqRel);
                    if was == 0 {
                        tracing::warn!(
                            failures,
                            "the store cannot be reached: circuit open, calls refused until it answers"
                        );
                    }
                }
            }
            _ => {
                if self.failures.load(Ordering::Acquire) != 0 {
                    self.failures.store(0, Ordering::Release);
                }
                if self.open_until_ms.load(Ordering::Acquire) != 0
                    && self.open_until_ms.swap(0, Ordering::AcqRel) != 0
                {
                    tracing::info!("the store answers again: circuit closed");
                }
            }
        }
    }

    pub(crate) fn reachability(&self) -> Reachability {
        if self.open_until_ms.load(Ordering::Acquire) != 0 {
            Reachability::Open
        } else if self.failures.load(Ordering::Acquire) != 0 {
            Reachability::Failing
        } else {
            Reachability::Reachable
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unreachable() -> Result<(), Error> {
        Err(Error::Interrupted)
    }

    #[test]
    fn failures_in_a_row_open_it_and_the_first_answer_closes_it() {
        let circuit = Circuit::default();
        for _ in 0..FAILURES_TO_OPEN - 1 {
            circuit.admit().unwrap();
            circuit.record(&unreachable());
        }
        assert_eq!(circuit.reachability(), Reachability::Failing);
        // A refusal from the database is an answer: the count starts again.
        circuit.record::<()>(&Err(Error::UnknownUser("x".into())));
        assert_eq!(circuit.reachability(), Reachability::Reachable);
        for _ in 0..FAILURES_TO_OPEN {
            circuit.record(&unreachable());
        }
        assert_eq!(circuit.reachability(), Reachability::Open);
        let refused = circuit.admit().unwrap_err();
        assert!(
            matches!(refused, Error::Unavailable { retry_after } if retry_after == COOL_OFF),
            "{refused:?}"
        );
        // Its own refusals do not keep it open longer.
        circuit.record(&Err::<(), _>(refused));
        // After the cool-off one trial goes through, the rest wait for it.
        circuit
            .open_until_ms
            .store(circuit.at(Duration::ZERO), Ordering::Release);
        circuit.admit().unwrap();
        assert!(circuit.admit().is_err(), "a second trial went through");
        circuit.record(&Ok(()));
        assert_eq!(circuit.reachability(), Reachability::Reachable);
        circuit.admit().unwrap();
    }
}
