//! A tiny HTTP server on 127.0.0.1 for browser tests: serves the files of one folder
//! (`GET /<name>`) and hands every JSON body POSTed to `/result` to the test.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::mpsc;

/// Largest result body accepted.
const MAX_RESULT: usize = 1024 * 1024;

/// A running page server; stops on drop.
pub struct PageServer {
    pub addr: SocketAddr,
    results: mpsc::UnboundedReceiver<serde_json::Value>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for PageServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl PageServer {
    /// Serves the files directly inside `root`.
    pub async fn start(root: PathBuf) -> PageServer {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, results) = mpsc::unbounded_channel();
        let task = tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let (root, tx) = (root.clone(), tx.clone());
                tokio::spawn(async move {
                    let service = service_fn(move |req| {
                        let (root, tx) = (root.clone(), tx.clone());
                        async move { Ok::<_, Infallible>(handle(&root, &tx, req).await) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(tcp), service)
                        .await;
                });
            }
        });
        PageServer {
            addr,
            results,
            task,
        }
    }

    /// The next result the page POSTed, or `None` after `timeout`.
    pub async fn next_result(&mut self, timeout: Duration) -> Option<serde_json::Value> {
        tokio::time::timeout(timeout, self.results.recv())
            .await
            .ok()
            .flatten()
    }
}

async fn handle(
    root: &std::path::Path,
    results: &mpsc::UnboundedSender<serde_json::Value>,
    req: Request<Incoming>,
) -> Response<Full<Bytes>> {
    let path = req.uri().path().to_owned();
    match (req.method().clone(), path.as_str()) {
        (Method::POST, "/result") => {
            let body = match Limited::new(req.into_body(), MAX_RESULT).collect().await {
                Ok(b) => b.to_bytes(),
                Err(_) => return answer(StatusCode::PAYLOAD_TOO_LARGE, "", Bytes::new()),
            };
            let value = serde_json::from_slice(&body).unwrap_or_else(
                |e| serde_json::json!({ "ok": false, "error": format!("result is not JSON: {e}") }),
            );
            let _ = results.send(value);
            answer(StatusCode::NO_CONTENT, "", Bytes::new())
        }
        (Method::GET, _) => {
            let name = path.trim_start_matches('/');
            // Only plain file names from the folder itself.
            let plain = !name.is_empty()
                && !name.starts_with('.')
                && name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
            match plain.then(|| std::fs::read(root.join(name))) {
                Some(Ok(data)) => answer(StatusCode::OK, content_type(name), Bytes::from(data)),
                _ => answer(
                    StatusCode::NOT_FOUND,
                    "text/plain",
                    Bytes::from("not found"),
                ),
            }
        }
        _ => answer(StatusCode::METHOD_NOT_ALLOWED, "", Bytes::new()),
    }
}

fn content_type(name: &str) -> &'static str {
    match name.rsplit_once('.').map(|(_, ext)| ext) {
        Some("html") => "text/html; charset=utf-8",
        Some("js") => "text/javascript; charset=utf-8",
        _ => "application/octet-stream",
    }
}

fn answer(status: StatusCode, content_type: &str, body: Bytes) -> Response<Full<Bytes>> {
    let mut resp = Response::new(Full::new(body));
    *resp.status_mut() = status;
    if !content_type.is_empty() {
        resp.headers_mut()
            .insert(http::header::CONTENT_TYPE, content_type.parse().unwrap());
    }
    // Every run must load the current page, never a cached one.
    resp.headers_mut()
        .insert(http::header::CACHE_CONTROL, "no-store".parse().unwrap());
    resp
}
