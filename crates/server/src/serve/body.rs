//! Request bodies with a deadline: [`TimedBody`] cuts off a body whose next frame does not arrive
//! within the frame timeout, or whose average rate, past that first window, falls below the
//! minimum. Only time spent waiting on the client counts: a handler that is busy between reads
//! does not use up the client's allowance.

use axum::body::Bytes;
use http_body::{Body, Frame, SizeHint};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::time::{Instant, Sleep};

/// Why a request body was cut off. Handlers see it as the cause of a body read error: find it
/// in any rejection's source chain with [`BodyTimeout::find`]. The server answers such a request
/// with status 408 in the service's own error shape whatever the handler answered (see
/// `serve::serve`), so handlers need not map it themselves.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BodyTimeout {
    /// No data arrived for `waited`.
    #[error("no data arrived for {} s", .waited.as_secs_f32())]
    Stalled { waited: Duration },
    /// The body arrived slower on average than the configured minimum.
    #[error(
        "{received} bytes arrived in {:.1} s, below the minimum of {min_bytes_per_sec} bytes/s",
        .waited.as_secs_f32()
    )]
    TooSlow {
        received: u64,
        waited: Duration,
        min_bytes_per_sec: u64,
    },
}

impl BodyTimeout {
    /// The body timeout somewhere in `err`'s source chain: an axum `BytesRejection`,
    /// `JsonRejection` or `MultipartError` caused by a timed-out body carries one.
    pub fn find<'a>(err: &'a (dyn std::error::Error + 'static)) -> Option<&'a BodyTimeout> {
        let mut next = Some(err);
        while let Some(e) = next {
            if let Some(t) = e.downcast_ref::<BodyTimeout>() {
                return Some(t);
            }
            next = e.source();
        }
        None
    }
}

/// The pace a body must keep.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pace {
    /// Longest wait for one frame; also the window before the rate counts.
    pub frame_timeout: Duration,
    /// Slowest average past the first window; 0: no rate check.
    pub min_bytes_per_sec: u64,
}

/// Which limit ends the current wait first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Limit {
    Frame,
    Rate,
}

impl Pace {
    /// How much longer the wait for the next frame may last, given the bytes received and the
    /// time already spent waiting for them, and which limit that is. The rate allows
    /// `max(frame_timeout, received / min_bytes_per_sec)` of waiting in all.
    fn allowance(&self, received: u64, waited: Duration) -> (Duration, Limit) {
        if self.min_bytes_per_sec == 0 {
            return (self.frame_timeout, Limit::Frame);
        }
        let earned = Duration::from_secs_f64(received as f64 / self.min_bytes_per_sec as f64);
        let budget = earned.max(self.frame_timeout).saturating_sub(waited);
        if budget < self.frame_timeout {
            (budget, Limit::Rate)
        } else {
            (self.frame_timeout, Limit::Frame)
        }
    }

    fn timeout(&self, limit: Limit, received: u64, waited: Duration) -> BodyTimeout {
        match limit {
            Limit::Frame => BodyTimeout::Stalled {
                waited: self.frame_timeout,
            },
            Limit::Rate => BodyTimeout::TooSlow {
                received,
                waited,
                min_bytes_per_sec: self.min_bytes_per_sec,
            },
        }
    }
}

/// Where a [`TimedBody`] reports that it timed out, for the server to answer 408.
pub(crate) type Tripped = Arc<OnceLock<BodyTimeout>>;

/// A request body held to a [`Pace`].
pub struct TimedBody<B> {
    inner: B,
    pace: Pace,
    received: u64,
    /// Waiting time of the frames already received.
    waited: Duration,
    /// The wait under way: when it began, which limit ends it, and its timer.
    wait: Option<(Instant, Limit)>,
    sleep: Option<Pin<Box<Sleep>>>,
    tripped: Tripped,
}

impl<B> TimedBody<B> {
    pub(crate) fn new(inner: B, pace: Pace, tripped: Tripped) -> Self {
        Self {
            inner,
            pace,
            received: 0,
            waited: Duration::ZERO,
            wait: None,
            sleep: None,
            tripped,
        }
    }
}

impl<B> Body for TimedBody<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<axum::BoxError>,
{
    type Data = Bytes;
    type Error = axum::BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.get_mut();
        if let Some(t) = this.tripped.get() {
            return Poll::Ready(Some(Err(t.clone().into())));
        }
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(frame) => {
                if let Some((began, _)) = this.wait.take() {
                    this.waited += began.elapsed();
                }
                if let Some(data) = frame.as_ref().and_then(|f| f.as_ref().ok()?.data_ref()) {
                    this.received += data.len() as u64;
                }
                Poll::Ready(frame.map(|f| f.map_err(Into::into)))
            }
            Poll::Pending => {
                let (began, limit) = match this.wait {
                    Some(w) => w,
                    None => {
                        let now = Instant::now();
                        let (allowed, limit) = this.pace.allowance(this.received, this.waited);
                        match &mut this.sleep {
                            Some(s) => s.as_mut().reset(now + allowed),
                            None => this.sleep = Some(Box::pin(tokio::time::sleep(allowed))),
                        }
                        this.wait = Some((now, limit));
                        (now, limit)
                    }
                };
                let sleep = this.sleep.as_mut().expect("set with the wait");
                if sleep.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                let waited = this.waited + began.elapsed();
                let timeout = this.pace.timeout(limit, this.received, waited);
                tracing::debug!(error = %timeout, "request body timed out");
                let _ = this.tripped.set(timeout.clone());
                Poll::Ready(Some(Err(timeout.into())))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::extract::FromRequest;

    const SEC: Duration = Duration::from_secs(1);

    fn pace(frame_secs: u64, min_bytes_per_sec: u64) -> Pace {
        Pace {
            frame_timeout: Duration::from_secs(frame_secs),
            min_bytes_per_sec,
        }
    }

    #[test]
    fn the_first_window_allows_the_frame_timeout_of_waiting_in_all() {
        assert_eq!(
            pace(30, 4096).allowance(0, Duration::ZERO),
            (30 * SEC, Limit::Frame)
        );
        assert_eq!(
            pace(30, 4096).allowance(10, 20 * SEC),
            (10 * SEC, Limit::Rate)
        );
    }

    #[test]
    fn bytes_received_earn_waiting_time_at_the_minimum_rate() {
        // 100 KiB at 1 KiB/s earns 100 s of waiting; 50 s used: the next frame may take the full 30.
        let p = pace(30, 1024);
        assert_eq!(p.allowance(100 * 1024, 50 * SEC), (30 * SEC, Limit::Frame));
        // 90 s used: only 10 s are left before the average drops below 1 KiB/s.
        assert_eq!(p.allowance(100 * 1024, 90 * SEC), (10 * SEC, Limit::Rate));
        // Over budget already: no wait at all.
        assert_eq!(
            p.allowance(100 * 1024, 120 * SEC),
            (Duration::ZERO, Limit::Rate)
        );
    }

    #[test]
    fn a_zero_minimum_rate_turns_the_rate_check_off() {
        assert_eq!(pace(5, 0).allowance(1, 3600 * SEC), (5 * SEC, Limit::Frame));
    }

    #[test]
    fn a_trickle_that_keeps_every_frame_in_time_is_still_cut_off_by_the_rate() {
        // One byte every 1 s against a 2 s frame timeout and 100 bytes/s: allowed 2 s in all.
        let p = pace(2, 100);
        let (mut received, mut waited) = (0, Duration::ZERO);
        loop {
            let (allowed, limit) = p.allowance(received, waited);
            if allowed < SEC {
                assert_eq!(limit, Limit::Rate);
                break;
            }
            received += 1;
            waited += SEC;
        }
        assert_eq!((received, waited), (2, 2 * SEC));
    }

    /// A body that never yields a frame.
    struct Silent;
    impl Body for Silent {
        type Data = Bytes;
        type Error = std::convert::Infallible;
        fn poll_frame(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
            Poll::Pending
        }
    }

    #[tokio::test]
    async fn a_silent_body_fails_an_extractor_with_a_findable_timeout() {
        let tripped = Tripped::default();
        let waited = Duration::from_millis(100);
        let pace = Pace {
            frame_timeout: waited,
            min_bytes_per_sec: 0,
        };
        let body = TimedBody::new(Silent, pace, tripped.clone());
        let req = axum::http::Request::new(axum::body::Body::new(body));
        let rejection = Bytes::from_request(req, &()).await.unwrap_err();
        let expected = BodyTimeout::Stalled { waited };
        assert_eq!(BodyTimeout::find(&rejection), Some(&expected));
        assert_eq!(tripped.get(), Some(&expected));
        assert_eq!(expected.to_string(), "no data arrived for 0.1 s");
    }
}
