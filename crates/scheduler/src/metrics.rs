//! Counters and histograms of one engine, kept with atomics so the engine thread records without
//! locks and the HTTP layer can read a [`MetricsSnapshot`] at any time (to export it later).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use serde::Serialize;

/// Bucket upper bounds grow by this factor; 48 buckets from 10µs cover past 10 minutes.
const GROWTH: f64 = 1.5;
const BUCKETS: usize = 48;
const FIRST_BOUND: f64 = 10.0;

/// A histogram over positive values with exponentially growing buckets.
#[derive(Debug)]
pub struct Histogram {
    buckets: [AtomicU64; BUCKETS],
    count: AtomicU64,
    sum: AtomicU64,
    max: AtomicU64,
}

impl Default for Histogram {
    fn default() -> Self {
        Self {
            buckets: std::array::from_fn(|_| AtomicU64::new(0)),
            count: AtomicU64::new(0),
            sum: AtomicU64::new(0),
            max: AtomicU64::new(0),
        }
    }
}

fn bound(i: usize) -> f64 {
    FIRST_BOUND * GROWTH.powi(i as i32)
}

/// The upper bound of every bucket, in order; the last bucket also takes everything above the
/// one before it, so an exporter reads its bound as +Inf (see [`HistogramSnapshot::counts`]).
pub fn bucket_bounds() -> impl Iterator<Item = f64> {
    (0..BUCKETS).map(bound)
}

impl Histogram {
    /// Records one value (in the histogram's unit: microseconds for times, rows for sizes).
    pub fn record(&self, value: u64) {
        let mut i = 0;
        while i + 1 < BUCKETS && value as f64 > bound(i) {
            i += 1;
        }
        self.buckets[i].fetch_add(1, Relaxed);
        self.count.fetch_add(1, Relaxed);
        self.sum.fetch_add(value, Relaxed);
        self.max.fetch_max(value, Relaxed);
    }

    pub fn record_duration(&self, d: Duration) {
        self.record(d.as_micros().min(u64::MAX as u128) as u64);
    }

    pub fn snapshot(&self) -> HistogramSnapshot {
        let counts: Vec<u64> = self.buckets.iter().map(|b| b.load(Relaxed)).collect();
        let count = self.count.load(Relaxed);
        let quantile = |q: f64| -> f64 {
            if count == 0 {
                return 0.0;
            }
            let rank = (q * count as f64).ceil().max(1.0) as u64;
            let mut seen = 0;
            for (i, c) in counts.iter().enumerate() {
                seen += c;
                if seen >= rank {
                    return bound(i).min(self.max.load(Relaxed) as f64);
                }
            }
            self.max.load(Relaxed) as f64
        };
        HistogramSnapshot {
            count,
            sum: self.sum.load(Relaxed),
            counts: counts.clone(),
            mean: if count == 0 {
                0.0
            } else {
                self.sum.load(Relaxed) as f64 / count as f64
            },
            p50: quantile(0.50),
            p90: quantile(0.90),
            p99: quantile(0.99),
            max: self.max.load(Relaxed) as f64,
            buckets: counts
                .iter()
                .enumerate()
                .filter(|(_, c)| **c > 0)
                .map(|(i, c)| (bound(i), *c))
                .collect(),
        }
    }
}

/// A histogram's state; quantiles are bucket upper bounds (within a factor 1.5).
#[derive(Debug, Clone, Serialize)]
pub struct HistogramSnapshot {
    pub count: u64,
    pub mean: f64,
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub max: f64,
    /// `(upper bound, count)` of the non-empty buckets.
    pub buckets: Vec<(f64, u64)>,
    /// Sum of the recorded values.
    pub sum: u64,
    /// The count of every bucket, empty or not, in the order of [`bucket_bounds`] (what a
    /// Prometheus exporter needs: the same buckets on every scrape). Not serialised.
    #[serde(skip)]
    pub counts: Vec<u64>,
}

/// Everything one engine counts. Times are in microseconds.
#[derive(Debug, Default)]
pub struct Metrics {
    pub requests: AtomicU64,
    pub rejected: AtomicU64,
    pub finished: AtomicU64,
    pub aborted: AtomicU64,
    pub prompt_tokens: AtomicU64,
    /// Prompt tokens not prefilled because a kept KV cache already held them.
    pub prefix_reused_tokens: AtomicU64,
    /// Prompt tokens the draft model did not prefill because a kept or running draft cache
    /// already held them.
    pub draft_reused_tokens: AtomicU64,
    pub generated_tokens: AtomicU64,
    /// Tokens drafted by speculative decoding and fed for verification.
    pub drafted_tokens: AtomicU64,
    /// Drafted tokens the model confirmed (each one a token without a step of its own).
    pub accepted_tokens: AtomicU64,
    pub steps: AtomicU64,
    pub queue_depth: AtomicU64,
    pub active: AtomicU64,
    pub paused: AtomicU64,
    /// Bytes of the KV caches the running sequences hold (caches kept for reuse not included).
    pub kv_bytes_in_use: AtomicU64,
    pub time_to_first_token: Histogram,
    pub inter_token_latency: Histogram,
    pub queue_wait: Histogram,
    pub step_time: Histogram,
    pub batch_rows: Histogram,
    pub batch_tokens: Histogram,
}

/// A point-in-time copy of [`Metrics`], serialisable for an exporter.
#[derive(Debug, Clone, Serialize)]
pub struct MetricsSnapshot {
    pub requests: u64,
    pub rejected: u64,
    pub finished: u64,
    pub aborted: u64,
    pub prompt_tokens: u64,
    pub prefix_reused_tokens: u64,
    pub draft_reused_tokens: u64,
    pub generated_tokens: u64,
    pub drafted_tokens: u64,
    pub accepted_tokens: u64,
    pub steps: u64,
    pub queue_depth: u64,
    pub active: u64,
    pub paused: u64,
    pub kv_bytes_in_use: u64,
    pub time_to_first_token_us: HistogramSnapshot,
    pub inter_token_latency_us: HistogramSnapshot,
    pub queue_wait_us: HistogramSnapshot,
    pub step_time_us: HistogramSnapshot,
    pub batch_rows: HistogramSnapshot,
    pub batch_tokens: HistogramSnapshot,
}

impl Metrics {
    pub fn snapshot(&self) -> MetricsSnapshot {
        MetricsSnapshot {
            requests: self.requests.load(Relaxed),
            rejected: self.rejected.load(Relaxed),
            finished: self.finished.load(Relaxed),
            aborted: self.aborted.load(Relaxed),
            prompt_tokens: self.prompt_tokens.load(Relaxed),
            prefix_reused_tokens: self.prefix_reused_tokens.load(Relaxed),
            draft_reused_tokens: self.draft_reused_tokens.load(Relaxed),
            generated_tokens: self.generated_tokens.load(Relaxed),
            drafted_tokens: self.drafted_tokens.load(Relaxed),
            accepted_tokens: self.accepted_tokens.load(Relaxed),
            steps: self.steps.load(Relaxed),
            queue_depth: self.queue_depth.load(Relaxed),
            active: self.active.load(Relaxed),
            paused: self.paused.load(Relaxed),
            kv_bytes_in_use: self.kv_bytes_in_use.load(Relaxed),
            time_to_first_token_us: self.time_to_first_token.snapshot(),
            inter_token_latency_us: self.inter_token_latency.snapshot(),
            queue_wait_us: self.queue_wait.snapshot(),
            step_time_us: self.step_time.snapshot(),
            batch_rows: self.batch_rows.snapshot(),
            batch_tokens: self.batch_tokens.snapshot(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_quantiles_land_in_the_right_bucket() {
        let h = Histogram::default();
        for v in 1..=100u64 {
            h.record(v * 1000);
        }
        let s = h.snapshot();
        assert_eq!(s.count, 100);
        // p50 is 50ms: its bucket bound is within a factor 1.5 above it.
        assert!(s.p50 >= 50_000.0 && s.p50 <= 75_000.0, "p50 {}", s.p50);
        assert!(s.p99 >= 99_000.0 && s.p99 <= 100_000.0, "p99 {}", s.p99);
        assert_eq!(s.max, 100_000.0);
        assert!((s.mean - 50_500.0).abs() < 1e-6);
        assert_eq!(s.sum, 5_050_000);
        // Every bucket, in bound order, adds up to the count.
        assert_eq!(s.counts.len(), bucket_bounds().count());
        assert_eq!(s.counts.iter().sum::<u64>(), 100);
        let nonempty: Vec<(f64, u64)> = bucket_bounds()
            .zip(s.counts.iter().copied())
            .filter(|(_, c)| *c > 0)
            .collect();
        assert_eq!(nonempty, s.buckets);
    }

    #[test]
    fn values_past_the_last_bound_land_in_the_last_bucket() {
        let h = Histogram::default();
        h.record(u64::MAX / 2);
        let s = h.snapshot();
        assert_eq!(s.counts.last(), Some(&1));
    }

    #[test]
    fn empty_histogram_reports_zeros() {
        let s = Histogram::default().snapshot();
        assert_eq!((s.count, s.p50, s.p99), (0, 0.0, 0.0));
    }
}
