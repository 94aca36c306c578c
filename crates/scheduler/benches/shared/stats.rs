//! Figures both benchmarks compute the same way (the scheduler's `decode` bench and the HTTP
//! `loadgen`), so that their tables compare.

/// The `q` quantile of sorted samples (nearest rank); NaN when there are none.
pub fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

/// Aggregate decode tokens/s: the sum over streams of each stream's decode rate, its tokens
/// after the first divided by the time from its first token to its last. Unlike tokens over
/// wall time it leaves out the queueing and prefill before each first token (reported as TTFT),
/// and it still counts every stall a stream sees between its first and last token.
pub fn decode_rate(streams_gaps_ms: &[Vec<f64>]) -> f64 {
    streams_gaps_ms
        .iter()
        .filter(|gaps| !gaps.is_empty())
        .map(|gaps| gaps.len() as f64 / (gaps.iter().sum::<f64>() / 1e3))
        .sum()
}
