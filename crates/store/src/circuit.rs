//! The store's circuit: after a few calls in a row fail because the database cannot be
//! reached, calls are refused at once ([`Error::Unavailable`]) instead of each waiting on the
//! connection pool, so a paid request is answered within a second while the database is down.
//! Once the cool-off has passed, one call goes through as a trial; the first call that reaches
//! the database closes the circuit again.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::Error;

/// Unreachable-database failures in a row that open the circuit.
const FAILURES_TO_OPEN: u32 = 3;

/// How long an open circuit refuses before it lets a trial call through. Also the figure a
/// refusal gives clients to come back after ([`crate::RETRY_AFTER`]).
pub(crate) const COOL_OFF: Duration = Duration::from_secs(1);

#[derive(Debug, Default)]
pub(crate) struct Circuit {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// Unreachable-database failures since the last call that reached it.
    failures: u32,
    /// While open: when the next trial call may go through.
    open_until: Option<Instant>,
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
    /// Lets a call through, or refuses it while the circuit is open. When the cool-off has
    /// passed, this call is the trial and the others keep being refused until it ends.
    pub(crate) fn admit(&self) -> Result<(), Error> {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let Some(until) = state.open_until else {
            return Ok(());
        };
        let now = Instant::now();
        if now < until {
            return Err(Error::Unavailable {
                retry_after: COOL_OFF,
            });
        }
        state.open_until = Some(now + COOL_OFF);
        Ok(())
    }

    /// Counts a call's outcome: any answer from the database (even a refusal) closes the
    /// circuit; a failure to reach it counts towards opening it.
    pub(crate) fn record<T>(&self, result: &Result<T, Error>) {
        let unreachable = match result {
            Ok(_) => false,
            Err(e) => e.is_unavailable(),
        };
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if !unreachable {
            if state.open_until.is_some() {
                tracing::info!("the store answers again: circuit closed");
            }
            *state = State::default();
            return;
        }
        if matches!(result, Err(Error::Unavailable { .. })) {
            return;
        }
        state.failures = state.failures.saturating_add(1);
        if state.failures >= FAILURES_TO_OPEN {
            if state.open_until.is_none() {
                tracing::warn!(
                    failures = state.failures,
                    "the store cannot be reached: circuit open, calls refused until it answers"
                );
            }
            state.open_until = Some(Instant::now() + COOL_OFF);
        }
    }

    pub(crate) fn reachability(&self) -> Reachability {
        let state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        match (state.open_until, state.failures) {
            (Some(_), _) => Reachability::Open,
            (None, 0) => Reachability::Reachable,
            (None, _) => Reachability::Failing,
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
        circuit.state.lock().unwrap().open_until = Some(Instant::now());
        circuit.admit().unwrap();
        assert!(circuit.admit().is_err(), "a second trial went through");
        circuit.record(&Ok(()));
        assert_eq!(circuit.reachability(), Reachability::Reachable);
        circuit.admit().unwrap();
    }
}
