//! Progress throttling: hf-hub's byte-by-chunk [`Progress`] calls turned into the caller's
//! [`PullProgress`] reports, one each time 256 KiB or 1% of the file (whichever is larger) more
//! have arrived, and one when the file is complete.

use std::cell::Cell;

use hf_hub::api::Progress;

use super::PullProgress;

/// Progress is reported each time this many more bytes (or 1% of the file, if larger) arrived.
const PROGRESS_STEP: u64 = 256 * 1024;

/// hf-hub's [`Progress`] into the caller's callback, throttled (see [`PullProgress`]).
pub(super) struct Reporter<'a> {
    file: &'a str,
    sink: &'a (dyn Fn(&PullProgress) + Sync),
    /// Set while the callback runs, so that its own panic is not taken for hf-hub's.
    in_callback: &'a Cell<bool>,
    done: u64,
    total: u64,
    /// The last `done` reported since the last `init`.
    reported: Option<u64>,
}

impl<'a> Reporter<'a> {
    /// A reporter for `file`, into `sink`; `in_callback` is set while `sink` runs.
    pub(super) fn new(
        file: &'a str,
        sink: &'a (dyn Fn(&PullProgress) + Sync),
        in_callback: &'a Cell<bool>,
    ) -> Self {
        Self {
            file,
            sink,
            in_callback,
            done: 0,
            total: 0,
            reported: None,
        }
    }

    fn report(&mut self) {
        self.reported = Some(self.done);
        self.in_callback.set(true);
        (self.sink)(&PullProgress {
            file: self.file.to_string(),
            done: self.done,
            total: self.total,
        });
        self.in_callback.set(false);
    }
}

impl Progress for Reporter<'_> {
    // hf-hub calls `init` before each attempt and then `update(resumed_offset)`.
    fn init(&mut self, size: usize, _filename: &str) {
        self.total = size as u64;
        self.done = 0;
        self.reported = None;
    }

    fn update(&mut self, size: usize) {
        self.done = self.done.saturating_add(size as u64);
        let step = (self.total / 100).max(PROGRESS_STEP);
        let due = match self.reported {
            None => true,
            Some(last) => self.done >= last.saturating_add(step) || self.done == self.total,
        };
        if due && self.reported != Some(self.done) {
            self.report();
        }
    }

    fn finish(&mut self) {
        if self.reported != Some(self.done) {
            self.report();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[test]
    fn progress_is_throttled_and_ends_at_the_total() {
        let seen = Mutex::new(Vec::new());
        let sink = |p: &PullProgress| seen.lock().unwrap().push(p.done);
        let flag = Cell::new(false);
        let mut r = Reporter {
            file: "f",
            sink: &sink,
            in_callback: &flag,
            done: 0,
            total: 0,
            reported: None,
        };
        let total = 10 * PROGRESS_STEP + 5;
        r.init(total as usize, "f");
        r.update(0);
        for _ in 0..(total / 1024) {
            r.update(1024);
        }
        r.update((total % 1024) as usize);
        r.finish();
        let seen = seen.into_inner().unwrap();
        assert_eq!(seen.first(), Some(&0));
        assert_eq!(seen.last(), Some(&total));
        assert!(seen.len() <= 13, "{} reports", seen.len());
        assert!(seen.windows(2).all(|w| w[0] < w[1]));
    }
}
