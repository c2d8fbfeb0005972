//! A client connection's write clock (`--response-write-timeout`): a plain response (a big
//! LIST, a log, a watch) whose client takes nothing of it for that long is cut. Without it, a
//! client that stops reading holds the upstream's response, its upstream connection and the
//! proxy's buffers for as long as it likes.
//!
//! The clock measures no progress, not length: it runs only while the proxy has handed hyper a
//! piece of the body that hyper has not taken yet, which is while the client's socket (HTTP/1.1)
//! or its stream's flow-control window (HTTP/2) has no room. A watch or a followed log that is
//! quiet is waiting for the upstream, not for the client, and its clock does not run; one the
//! client reads slowly makes progress at every piece it takes.
//!
//! Every piece a body hands out is stamped (one clock read); each connection's loop looks at its
//! responses every quarter of the timeout while any is in flight ([`Responses::stalled`]). A
//! response found stalled has its body dropped at once, which closes the upstream's response
//! (and its connection) and ends the request in flight; on HTTP/1.1 the connection is then
//! closed (it can carry nothing else), on HTTP/2 the stream ends with an error as soon as the
//! client reads again, and its other streams go on.

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

/// `--response-write-timeout`'s default: far beyond any pause of a client that reads (a laptop
/// busy for a moment, a full terminal scrolling), well within what a stuck one should hold.
pub const DEFAULT_RESPONSE_WRITE_TIMEOUT: Duration = Duration::from_secs(60);

/// The error a cut response ends with, for hyper (which resets the HTTP/2 stream) and the log.
#[derive(Debug, thiserror::Error)]
pub enum ResponseError {
    /// The body's own error (the upstream's response failed).
    #[error(transparent)]
    Body(Box<dyn std::error::Error + Send + Sync>),
    /// The client took nothing of the response for the write timeout.
    #[error("the client took nothing of the response within --response-write-timeout")]
    Stalled,
}

/// The watched responses of one client connection.
#[derive(Debug)]
pub struct Responses {
    timeout: Duration,
    base: Instant,
    watched: Mutex<Vec<Weak<dyn Stallable>>>,
    added: Notify,
}

/// A response found stalled and cut.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stalled {
    /// Whether it was on HTTP/1.x: then the connection can only be closed.
    pub http1: bool,
}

impl Responses {
    /// The responses of a new connection, cut after `timeout` without progress.
    pub fn new(timeout: Duration) -> Arc<Responses> {
        Arc::new(Responses {
            timeout,
            base: Instant::now(),
            watched: Mutex::new(Vec::new()),
            added: Notify::new(),
        })
    }

    /// Watches `body`, a response of `http1` (HTTP/1.x) or HTTP/2.
    pub fn watch<B>(&self, body: B, http1: bool) -> WatchedBody<B>
    where
        B: Send + std::fmt::Debug + 'static,
    {
        let shared = Arc::new(Shared {
            body: Mutex::new(Some(body)),
            handed_ms: AtomicU64::new(0),
            base: self.base,
            http1,
        });
        let weak: Weak<dyn Stallable> = Arc::downgrade(&shared) as Weak<dyn Stallable>;
        {
            let mut watched = self.lock();
            // Finished responses leave their places behind: cleared as new ones come.
            watched.retain(|w| w.strong_count() > 0);
            watched.push(weak);
        }
        self.added.notify_one();
        WatchedBody { shared }
    }

    /// Resolves when a response of this connection has had a piece handed out and not taken
    /// for the timeout; that response has been cut by then (its body dropped). Looks every
    /// quarter of the timeout while any response is watched, and not at all otherwise.
    pub async fn stalled(&self) -> Stalled {
        let tick = (self.timeout / 4).max(Duration::from_millis(10));
        loop {
            let added = self.added.notified();
            if self.lock().is_empty() {
                added.await;
                continue;
            }
            tokio::time::sleep(tick).await;
            if let Some(stalled) = self.cut_stalled() {
                return stalled;
            }
        }
    }

    /// Cuts the first response stalled for the timeout, if one is.
    fn cut_stalled(&self) -> Option<Stalled> {
        let now = self.elapsed_ms();
        let timeout = self.timeout.as_millis() as u64;
        let mut watched = self.lock();
        watched.retain(|w| w.strong_count() > 0);
        let stalled = watched.iter().filter_map(Weak::upgrade).find(|r| {
            r.handed_at()
                .is_some_and(|at| now.saturating_sub(at) >= timeout)
        })?;
        drop(watched);
        stalled.cut();
        Some(Stalled {
            http1: stalled.is_http1(),
        })
    }

    fn elapsed_ms(&self) -> u64 {
        self.base.elapsed().as_millis() as u64
    }

    fn lock(&self) -> MutexGuard<'_, Vec<Weak<dyn Stallable>>> {
        self.watched.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// What the connection's loop asks of a watched response.
trait Stallable: Send + Sync + std::fmt::Debug {
    /// Milliseconds after the connection's start at which the piece hyper holds now was handed
    /// out; `None` when hyper holds none (it is waiting for the body, or the body is done).
    fn handed_at(&self) -> Option<u64>;
    /// Drops the body: the upstream's response and the request in flight end.
    fn cut(&self);
    fn is_http1(&self) -> bool;
}

/// A response body and its clock, shared by the body hyper polls and the connection's loop.
#[derive(Debug)]
struct Shared<B> {
    /// `None` once cut (or done).
    body: Mutex<Option<B>>,
    /// When hyper was handed the piece it holds, as milliseconds after `base` plus one; 0 when
    /// it holds none.
    handed_ms: AtomicU64,
    base: Instant,
    http1: bool,
}

impl<B> Shared<B> {
    fn lock(&self) -> MutexGuard<'_, Option<B>> {
        self.body.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl<B: Send + std::fmt::Debug> Stallable for Shared<B> {
    fn handed_at(&self) -> Option<u64> {
        match self.handed_ms.load(Ordering::Relaxed) {
            0 => None,
            at => Some(at - 1),
        }
    }

    fn cut(&self) {
        let body = self.lock().take();
        drop(body);
    }

    fn is_http1(&self) -> bool {
        self.http1
    }
}

/// A response body on the connection's write clock (see [`Responses::watch`]).
#[derive(Debug)]
pub struct WatchedBody<B> {
    shared: Arc<Shared<B>>,
}

impl<B> hyper::body::Body for WatchedBody<B>
where
    B: hyper::body::Body + Unpin,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    type Data = B::Data;
    type Error = ResponseError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        let shared = &self.shared;
        // hyper is back for more: it took the piece it held.
        shared.handed_ms.store(0, Ordering::Relaxed);
        let mut body = shared.lock();
        let Some(inner) = body.as_mut() else {
            // Cut while hyper held a piece: the response ends with an error, never as if whole.
            return Poll::Ready(Some(Err(ResponseError::Stalled)));
        };
        let polled = Pin::new(inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) if frame.is_data() => {
                let at = shared.base.elapsed().as_millis() as u64 + 1;
                shared.handed_ms.store(at, Ordering::Relaxed);
            }
            // Done: the upstream's response (and the request in flight) go now.
            Poll::Ready(None | Some(Err(_))) => *body = None,
            _ => {}
        }
        polled.map(|frame| frame.map(|f| f.map_err(|e| ResponseError::Body(e.into()))))
    }

    fn is_end_stream(&self) -> bool {
        self.shared
            .lock()
            .as_ref()
            .is_some_and(hyper::body::Body::is_end_stream)
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.shared
            .lock()
            .as_ref()
            .map(hyper::body::Body::size_hint)
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicBool;

    use bytes::Bytes;
    use hyper::body::{Body, Frame};

    use super::*;

    /// A body that has a piece ready whenever asked (`quiet`: never), and says when dropped.
    #[derive(Debug)]
    struct Source {
        quiet: bool,
        dropped: Arc<AtomicBool>,
    }

    impl Drop for Source {
        fn drop(&mut self) {
            self.dropped.store(true, Ordering::Relaxed);
        }
    }

    impl Body for Source {
        type Data = Bytes;
        type Error = std::io::Error;

        fn poll_frame(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
            if self.quiet {
                return Poll::Pending;
            }
            Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(b"piece")))))
        }
    }

    fn watched(responses: &Responses, quiet: bool) -> (WatchedBody<Source>, Arc<AtomicBool>) {
        let dropped = Arc::new(AtomicBool::new(false));
        let source = Source {
            quiet,
            dropped: dropped.clone(),
        };
        (responses.watch(source, true), dropped)
    }

    fn poll(body: &mut WatchedBody<Source>) -> Poll<Option<Result<Frame<Bytes>, ResponseError>>> {
        let mut cx = Context::from_waker(std::task::Waker::noop());
        Pin::new(body).poll_frame(&mut cx)
    }

    /// A piece handed out and never taken: the response is cut once the timeout has passed
    /// (not before), its body dropped, and it ends with an error if polled again.
    #[tokio::test(start_paused = true)]
    async fn a_piece_never_taken_cuts_the_response_after_the_timeout() {
        let responses = Responses::new(Duration::from_secs(60));
        let (mut body, dropped) = watched(&responses, false);
        assert!(matches!(poll(&mut body), Poll::Ready(Some(Ok(_)))));
        let started = Instant::now();
        let stalled = responses.stalled().await;
        let after = started.elapsed();
        assert!(stalled.http1);
        assert!(after >= Duration::from_secs(60) && after <= Duration::from_secs(75));
        assert!(
            dropped.load(Ordering::Relaxed),
            "the upstream's body is let go"
        );
        assert!(matches!(
            poll(&mut body),
            Poll::Ready(Some(Err(ResponseError::Stalled)))
        ));
    }

    /// A response its client takes a piece of now and then, and one that waits for its
    /// upstream, are never cut, however long they last.
    #[tokio::test(start_paused = true)]
    async fn a_moving_response_and_a_quiet_one_are_never_cut() {
        let responses = Responses::new(Duration::from_secs(60));
        let (mut moving, _) = watched(&responses, false);
        let (mut quiet, _) = watched(&responses, true);
        assert!(poll(&mut quiet).is_pending());
        let client = async {
            for _ in 0..60 {
                assert!(matches!(poll(&mut moving), Poll::Ready(Some(Ok(_)))));
                tokio::time::sleep(Duration::from_secs(50)).await;
            }
        };
        tokio::select! {
            () = client => {}
            stalled = responses.stalled() => panic!("cut: {stalled:?}"),
        }
    }
}
