//! Per-user caps on concurrent paid work (completions, images), so that one user cannot occupy
//! every slot of a model. A slot is an owned value: taken before the work is queued, given back
//! when dropped, on whatever path the request ends.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How long a user past the cap is told to wait (`Retry-After` on the 429): one of their
/// requests may end any moment, so a second is a fair first wait. The one place this is set.
pub const RETRY_AFTER: Duration = Duration::from_secs(1);

/// The user already has `limit` requests of this kind running; retry after `retry_after`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{limit} requests of yours are already running here; wait for one to finish")]
pub struct SlotsFull {
    pub limit: usize,
    pub retry_after: Duration,
}

/// Counts each user's running requests of one service against a cap.
#[derive(Clone, Debug)]
pub struct UserSlots {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    /// 0: no cap.
    limit: usize,
    running: Mutex<HashMap<String, usize>>,
}

impl Inner {
    fn running(&self) -> std::sync::MutexGuard<'_, HashMap<String, usize>> {
        self.running.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl UserSlots {
    /// At most `limit` concurrent requests per user; 0 means no cap.
    pub fn new(limit: usize) -> Self {
        UserSlots {
            inner: Arc::new(Inner {
                limit,
                running: Mutex::new(HashMap::new()),
            }),
        }
    }

    pub fn limit(&self) -> usize {
        self.inner.limit
    }

    /// Takes one of `user`'s slots, or refuses when all are in use.
    pub fn take(&self, user: &str) -> Result<UserSlot, SlotsFull> {
        let mut running = self.inner.running();
        let count = running.entry(user.to_string()).or_insert(0);
        if self.inner.limit > 0 && *count >= self.inner.limit {
            return Err(SlotsFull {
                limit: self.inner.limit,
                retry_after: RETRY_AFTER,
            });
        }
        *count += 1;
        Ok(UserSlot {
            inner: Arc::clone(&self.inner),
            user: user.to_string(),
        })
    }

    /// How many requests `user` has running.
    pub fn running(&self, user: &str) -> usize {
        self.inner.running().get(user).copied().unwrap_or(0)
    }
}

/// One running request of one user; dropping it frees the slot.
#[derive(Debug)]
#[must_use = "the slot is freed when dropped"]
pub struct UserSlot {
    inner: Arc<Inner>,
    user: String,
}

impl Drop for UserSlot {
    fn drop(&mut self) {
        let mut running = self.inner.running();
        if let Some(count) = running.get_mut(&self.user) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                running.remove(&self.user);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_user_gets_at_most_limit_slots_and_dropping_one_frees_it() {
        let slots = UserSlots::new(2);
        let a = slots.take("ann").unwrap();
        let _b = slots.take("ann").unwrap();
        let full = SlotsFull {
            limit: 2,
            retry_after: RETRY_AFTER,
        };
        assert_eq!(slots.take("ann").unwrap_err(), full);
        // Other users are not affected.
        let _c = slots.take("bob").unwrap();
        drop(a);
        assert_eq!(slots.running("ann"), 1);
        let _d = slots.take("ann").unwrap();
        assert_eq!(slots.running("ann"), 2);
    }

    #[test]
    fn zero_means_no_cap_and_idle_users_leave_no_entry() {
        let slots = UserSlots::new(0);
        let held: Vec<_> = (0..100).map(|_| slots.take("ann").unwrap()).collect();
        assert_eq!(slots.running("ann"), 100);
        drop(held);
        assert!(slots.inner.running().is_empty());
    }
}
