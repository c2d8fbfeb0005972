//! The two clocks of one client connection, whatever it speaks (HTTP/1.1, h2 over TLS, h2c):
//!
//! - from the accept (TLS handshake included) to the first complete request head:
//!   `--request-header-timeout`. hyper's own header timeout starts only once HTTP/1.1 parsing
//!   does, so a socket that sends nothing, a TLS session that goes quiet after the handshake,
//!   or an h2c preface followed by silence would otherwise hold a descriptor for ever;
//! - while no request is in flight: `--idle-connection-timeout` (kube-apiserver closes idle
//!   connections after 90 s, HTTP/2 ones included).
//!
//! A request counts as in flight from its head until its response body is finished or
//! dropped, so a watch or a followed log keeps its connection, however quiet.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use super::waiting_connections::Waiter;

/// Which clock ran out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expiry {
    /// No complete request head within the request-header timeout of the accept.
    FirstRequest,
    /// No request in flight for the idle timeout.
    Idle,
}

impl Expiry {
    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            Expiry::FirstRequest => "request_header_timeout",
            Expiry::Idle => "idle_timeout",
        }
    }
}

#[derive(Debug, Clone, Copy, Default)]
struct State {
    in_flight: usize,
    /// Requests seen so far (0: still waiting for the first head).
    started: u64,
}

/// The requests in flight on one connection.
#[derive(Debug)]
pub struct Activity {
    state: watch::Sender<State>,
    /// The connection's place among those waiting for a request head
    /// (`--max-pending-connections`): it waits whenever no request is in flight.
    waiter: Option<Arc<Waiter>>,
}

impl Activity {
    /// A connection with no request yet.
    pub fn new() -> Arc<Activity> {
        Arc::new(Activity {
            state: watch::Sender::new(State::default()),
            waiter: None,
        })
    }

    /// A connection with no request yet, counted among the connections waiting for a head
    /// whenever it has no request in flight.
    pub fn counted(waiter: Arc<Waiter>) -> Arc<Activity> {
        Arc::new(Activity {
            state: watch::Sender::new(State::default()),
            waiter: Some(waiter),
        })
    }

    /// Marks a request head as arrived; the request is in flight until the guard drops.
    pub fn request_started(self: &Arc<Self>) -> RequestInFlight {
        self.state.send_modify(|s| {
            if s.in_flight == 0 {
                // Under the state's lock, so that waiting and not follow the count in order.
                if let Some(waiter) = &self.waiter {
                    waiter.stop_waiting();
                }
            }
            s.in_flight += 1;
            s.started += 1;
        });
        RequestInFlight {
            activity: self.clone(),
        }
    }

    /// Whether a request is in flight now.
    pub fn has_request_in_flight(&self) -> bool {
        self.state.borrow().in_flight > 0
    }

    /// Resolves when the connection has outlived its clocks: the first request head did not
    /// arrive by `first_request_by`, or no request was in flight for `idle`.
    pub async fn expired(&self, first_request_by: Instant, idle: Duration) -> Expiry {
        let mut rx = self.state.subscribe();
        loop {
            let state = *rx.borrow_and_update();
            if state.in_flight > 0 {
                // Busy: nothing can expire until a request finishes.
                if rx.changed().await.is_err() {
                    return std::future::pending().await;
                }
                continue;
            }
            let (until, expiry) = if state.started == 0 {
                (first_request_by, Expiry::FirstRequest)
            } else {
                (Instant::now() + idle, Expiry::Idle)
            };
            tokio::select! {
                changed = rx.changed() => {
                    if changed.is_err() {
                        return std::future::pending().await;
                    }
                }
                _ = tokio::time::sleep_until(until) => return expiry,
            }
        }
    }
}

/// One request in flight; dropping it (with the response body) ends it.
#[derive(Debug)]
pub struct RequestInFlight {
    activity: Arc<Activity>,
}

impl Drop for RequestInFlight {
    fn drop(&mut self) {
        let activity = &self.activity;
        activity.state.send_modify(|s| {
            s.in_flight -= 1;
            if s.in_flight == 0 {
                if let Some(waiter) = &activity.waiter {
                    waiter.start_waiting();
                }
            }
        });
    }
}

/// A response body that keeps its request in flight until the body is done or dropped.
#[derive(Debug)]
pub struct InFlightBody<B> {
    inner: B,
    request: Option<RequestInFlight>,
}

impl<B> InFlightBody<B> {
    /// `inner`, ending `request` when it ends.
    pub fn new(inner: B, request: RequestInFlight) -> Self {
        InFlightBody {
            inner,
            request: Some(request),
        }
    }
}

impl<B: hyper::body::Body + Unpin> hyper::body::Body for InFlightBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        let this = &mut *self;
        let polled = std::pin::Pin::new(&mut this.inner).poll_frame(cx);
        if matches!(polled, std::task::Poll::Ready(None | Some(Err(_)))) {
            // Done: the connection may count as idle from now, even if hyper keeps the body.
            this.request = None;
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_counted_connection_waits_only_while_no_request_is_in_flight() {
        let waiting = super::super::waiting_connections::WaitingConnections::new(8);
        let guard = waiting.join();
        let a = Activity::counted(guard.waiter());
        assert_eq!(waiting.len(), 1, "waiting from the accept");
        let first = a.request_started();
        let second = a.request_started();
        assert_eq!(waiting.len(), 0);
        drop(first);
        assert_eq!(waiting.len(), 0, "one request still in flight");
        drop(second);
        assert_eq!(waiting.len(), 1, "idle: waiting for the next head");
        drop(guard);
        assert_eq!(waiting.len(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn no_first_request_expires_at_the_deadline() {
        let a = Activity::new();
        let start = Instant::now();
        let e = a
            .expired(start + Duration::from_secs(3), Duration::from_secs(90))
            .await;
        assert_eq!(e, Expiry::FirstRequest);
        assert_eq!(start.elapsed(), Duration::from_secs(3));
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_in_flight_holds_the_connection_then_idle_counts_from_its_end() {
        let a = Activity::new();
        let start = Instant::now();
        let req = a.request_started();
        let watcher = tokio::spawn({
            let a = a.clone();
            async move {
                a.expired(start + Duration::from_secs(1), Duration::from_secs(5))
                    .await
            }
        });
        // A long watch: far past both clocks, nothing expires.
        tokio::time::sleep(Duration::from_secs(600)).await;
        assert!(!watcher.is_finished());
        drop(req);
        let e = watcher.await.unwrap();
        assert_eq!(e, Expiry::Idle);
        assert_eq!(start.elapsed(), Duration::from_secs(605));
    }

    #[tokio::test(start_paused = true)]
    async fn each_new_request_restarts_the_idle_clock() {
        let a = Activity::new();
        let start = Instant::now();
        let watcher = tokio::spawn({
            let a = a.clone();
            async move {
                a.expired(start + Duration::from_secs(10), Duration::from_secs(5))
                    .await
            }
        });
        for _ in 0..3 {
            tokio::time::sleep(Duration::from_secs(4)).await;
            drop(a.request_started());
        }
        assert_eq!(watcher.await.unwrap(), Expiry::Idle);
        assert_eq!(start.elapsed(), Duration::from_secs(17));
    }
}
