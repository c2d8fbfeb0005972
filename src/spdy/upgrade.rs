//! The HTTP/1.1 `Upgrade: SPDY/3.1` handshake, client side (PROTOCOL.md §3.1).
//!
//! Redirects are never followed (the reference translator refuses them); any answer other than
//! 101 is a [`UpgradeError::Refused`] carrying status, headers and a capped body, so the caller
//! can turn it into the Kubernetes Status the user should see.

use bytes::{Buf, Bytes, BytesMut};
use http::{header, HeaderMap, HeaderName, HeaderValue, Method, StatusCode};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Largest response head accepted.
const MAX_HEAD: usize = 64 * 1024;
/// Largest refusal body kept (the rest is not read): room for a Kubernetes `Status` of any
/// realistic size, which the caller may have to deliver whole.
const MAX_BODY: usize = 1024 * 1024;
/// Most header lines in a response head.
const MAX_HEADERS: usize = 128;

/// What to send upstream.
#[derive(Debug, Clone)]
pub struct UpgradeRequest {
    /// `POST` for exec/attach/port-forward (what the reference translator sends).
    pub method: Method,
    /// Path and query on the upstream, e.g. `/api/v1/namespaces/ns/pods/p/exec?command=sh`.
    pub path_and_query: String,
    /// `Host` header value.
    pub host: String,
    /// End-to-end headers to pass (Authorization, Impersonate-*, X-Forwarded-For …).
    /// Connection-level ones are skipped.
    pub headers: HeaderMap,
    /// `X-Stream-Protocol-Version` values, one header line each, in preference order.
    pub protocols: Vec<String>,
}

/// A connection that switched to SPDY/3.1.
#[derive(Debug)]
pub struct Upgraded<T> {
    pub io: T,
    /// Bytes that arrived after the 101 head; they belong to the SPDY session.
    pub leftover: Bytes,
    /// The negotiated `X-Stream-Protocol-Version`, `None` if the server sent none (v1).
    pub protocol: Option<String>,
    /// All headers of the 101.
    pub headers: HeaderMap,
}

/// Why the upgrade did not happen.
#[derive(Debug, thiserror::Error)]
pub enum UpgradeError {
    #[error("i/o error during the upgrade: {0}")]
    Io(#[from] std::io::Error),
    #[error("the upstream closed the connection before answering the upgrade")]
    Closed,
    #[error("malformed upgrade response: {0}")]
    MalformedResponse(String),
    #[error("upgrade response head larger than {MAX_HEAD} bytes")]
    HeaderTooLarge,
    /// Any answer other than 101, including redirects.
    #[error("upgrade refused with HTTP {status}")]
    Refused {
        status: StatusCode,
        /// Boxed: a refusal is rare and the error stays small on the happy path.
        headers: Box<HeaderMap>,
        body: Bytes,
    },
    #[error("101 response without Connection: Upgrade and Upgrade: SPDY/3.1")]
    MissingUpgradeHeaders,
}

/// Headers the handshake sets itself or that describe a single hop.
fn is_reserved(name: &HeaderName) -> bool {
    const RESERVED: &[&str] = &[
        "host",
        "connection",
        "upgrade",
        "content-length",
        "transfer-encoding",
        "keep-alive",
        "proxy-connection",
        "te",
        "trailer",
        "x-stream-protocol-version",
    ];
    RESERVED.contains(&name.as_str())
}

/// The request head, as one buffer (written with one write).
fn request_head(req: &UpgradeRequest) -> Vec<u8> {
    let mut out = Vec::with_capacity(512);
    out.extend_from_slice(req.method.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(req.path_and_query.as_bytes());
    out.extend_from_slice(b" HTTP/1.1\r\nHost: ");
    out.extend_from_slice(req.host.as_bytes());
    out.extend_from_slice(b"\r\n");
    for (name, value) in &req.headers {
        if is_reserved(name) {
            continue;
        }
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"Content-Length: 0\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\n");
    for p in &req.protocols {
        out.extend_from_slice(b"X-Stream-Protocol-Version: ");
        out.extend_from_slice(p.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
    out
}

/// A parsed HTTP/1.1 response head.
#[derive(Debug)]
pub struct ResponseHead {
    pub status: StatusCode,
    pub headers: HeaderMap,
    len: usize,
}

/// Reads an HTTP/1.1 response head (at most 64 KiB). Returns it and the bytes read past it.
pub async fn read_response_head<T: AsyncRead + Unpin>(
    io: &mut T,
) -> Result<(ResponseHead, BytesMut), UpgradeError> {
    let mut buf = BytesMut::with_capacity(1024);
    let head = loop {
        if let Some(head) = parse_head(&buf)? {
            break head;
        }
        if buf.len() >= MAX_HEAD {
            return Err(UpgradeError::HeaderTooLarge);
        }
        buf.reserve(1024);
        if io.read_buf(&mut buf).await? == 0 {
            return Err(UpgradeError::Closed);
        }
    };
    buf.advance(head.len);
    Ok((head, buf))
}

fn parse_head(buf: &[u8]) -> Result<Option<ResponseHead>, UpgradeError> {
    let mut slots = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut resp = httparse::Response::new(&mut slots);
    let len = match resp.parse(buf) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(e) => return Err(UpgradeError::MalformedResponse(e.to_string())),
    };
    let code = resp.code.unwrap_or(0);
    let status = StatusCode::from_u16(code)
        .map_err(|_| UpgradeError::MalformedResponse(format!("status {code}")))?;
    let mut headers = HeaderMap::with_capacity(resp.headers.len());
    for h in resp.headers.iter() {
        let name = HeaderName::from_bytes(h.name.as_bytes())
            .map_err(|e| UpgradeError::MalformedResponse(e.to_string()))?;
        let value = HeaderValue::from_bytes(h.value)
            .map_err(|e| UpgradeError::MalformedResponse(e.to_string()))?;
        headers.append(name, value);
    }
    Ok(Some(ResponseHead {
        status,
        headers,
        len,
    }))
}

fn header_contains(headers: &HeaderMap, name: header::HeaderName, token: &str) -> bool {
    headers.get_all(name).iter().any(|v| {
        v.to_str()
            .map(|s| s.split(',').any(|t| t.trim().eq_ignore_ascii_case(token)))
            .unwrap_or(false)
    })
}

/// Sends the upgrade request on `io` and reads the answer.
pub async fn upgrade<T>(mut io: T, req: &UpgradeRequest) -> Result<Upgraded<T>, UpgradeError>
where
    T: AsyncRead + AsyncWrite + Unpin,
{
    io.write_all(&request_head(req)).await?;
    io.flush().await?;
    let (head, buf) = read_response_head(&mut io).await?;

    if head.status != StatusCode::SWITCHING_PROTOCOLS {
        let body = read_body(&mut io, &head.headers, buf, MAX_BODY).await?;
        return Err(UpgradeError::Refused {
            status: head.status,
            headers: Box::new(head.headers),
            body,
        });
    }
    if !header_contains(&head.headers, header::CONNECTION, "upgrade")
        || !header_contains(&head.headers, header::UPGRADE, "spdy/3.1")
    {
        return Err(UpgradeError::MissingUpgradeHeaders);
    }
    let protocol = head
        .headers
        .get("x-stream-protocol-version")
        .and_then(|v| v.to_str().ok())
        .map(|v| v.trim().to_owned())
        .filter(|v| !v.is_empty());
    Ok(Upgraded {
        io,
        leftover: buf.freeze(),
        protocol,
        headers: head.headers,
    })
}

/// Reads a response body by Content-Length, chunked encoding, or to EOF; at most `max` bytes
/// are kept. `buf` holds bytes already read past the head.
pub async fn read_body<T: AsyncRead + Unpin>(
    io: &mut T,
    headers: &HeaderMap,
    mut buf: BytesMut,
    max: usize,
) -> Result<Bytes, UpgradeError> {
    let chunked = header_contains(headers, header::TRANSFER_ENCODING, "chunked");
    let length = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<usize>().ok());
    if chunked {
        return read_chunked(io, buf, max).await;
    }
    let want = length.unwrap_or(max).min(max);
    while buf.len() < want {
        buf.reserve(4096);
        match io.read_buf(&mut buf).await {
            Ok(0) => break,
            Ok(_) => {}
            // A refusal body cut short is still worth showing.
            Err(_) if length.is_none() => break,
            Err(e) => return Err(e.into()),
        }
    }
    buf.truncate(want);
    Ok(buf.freeze())
}

async fn read_chunked<T: AsyncRead + Unpin>(
    io: &mut T,
    mut raw: BytesMut,
    max: usize,
) -> Result<Bytes, UpgradeError> {
    let mut body = BytesMut::new();
    loop {
        // Enough bytes for a size line?
        match httparse::parse_chunk_size(&raw) {
            Ok(httparse::Status::Complete((consumed, size))) => {
                let size = size as usize;
                if size == 0 {
                    break;
                }
                let need = consumed + size + 2;
                while raw.len() < need && body.len() + raw.len() < max + need {
                    raw.reserve(4096);
                    if io.read_buf(&mut raw).await? == 0 {
                        return Err(UpgradeError::Closed);
                    }
                }
                if raw.len() < need {
                    break;
                }
                let take = size.min(max.saturating_sub(body.len()));
                body.extend_from_slice(&raw[consumed..consumed + take]);
                raw.advance(need);
                if body.len() >= max {
                    break;
                }
            }
            Ok(httparse::Status::Partial) => {
                if raw.len() > 1024 {
                    return Err(UpgradeError::MalformedResponse(
                        "bad chunk size line".into(),
                    ));
                }
                raw.reserve(1024);
                if io.read_buf(&mut raw).await? == 0 {
                    break;
                }
            }
            Err(_) => return Err(UpgradeError::MalformedResponse("bad chunk size".into())),
        }
    }
    Ok(body.freeze())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::duplex;

    fn request() -> UpgradeRequest {
        let mut headers = HeaderMap::new();
        headers.insert(header::AUTHORIZATION, HeaderValue::from_static("Bearer t"));
        headers.insert(header::CONNECTION, HeaderValue::from_static("keep-alive"));
        UpgradeRequest {
            method: Method::POST,
            path_and_query: "/api/v1/namespaces/ns/pods/p/exec?command=sh&stdout=true".into(),
            host: "10.0.0.5:6443".into(),
            headers,
            protocols: vec!["v5.channel.k8s.io".into(), "v4.channel.k8s.io".into()],
        }
    }

    /// Runs the client against a scripted server answer; returns the result and what the
    /// server received.
    async fn exchange(
        answer: &'static [u8],
    ) -> (
        Result<Upgraded<tokio::io::DuplexStream>, UpgradeError>,
        String,
    ) {
        let (client, mut server) = duplex(256 * 1024);
        let srv = tokio::spawn(async move {
            let mut got = Vec::new();
            let mut b = [0u8; 4096];
            while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                let n = server.read(&mut b).await.unwrap();
                got.extend_from_slice(&b[..n]);
            }
            server.write_all(answer).await.unwrap();
            server.shutdown().await.unwrap();
            // Keep the server end alive until the client is done.
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            String::from_utf8(got).unwrap()
        });
        let result = upgrade(client, &request()).await;
        (result, srv.await.unwrap())
    }

    #[tokio::test]
    async fn request_bytes_are_exact() {
        let (_, sent) =
            exchange(b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 0\r\n\r\n").await;
        assert_eq!(
            sent,
            "POST /api/v1/namespaces/ns/pods/p/exec?command=sh&stdout=true HTTP/1.1\r\n\
             Host: 10.0.0.5:6443\r\n\
             authorization: Bearer t\r\n\
             Content-Length: 0\r\n\
             Connection: Upgrade\r\n\
             Upgrade: SPDY/3.1\r\n\
             X-Stream-Protocol-Version: v5.channel.k8s.io\r\n\
             X-Stream-Protocol-Version: v4.channel.k8s.io\r\n\r\n"
        );
    }

    #[tokio::test]
    async fn switching_protocols_keeps_leftover_bytes() {
        let (result, _) = exchange(
            b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\n\
              X-Stream-Protocol-Version: v4.channel.k8s.io\r\n\r\n\x80\x03\x00\x06",
        )
        .await;
        let up = result.unwrap();
        assert_eq!(up.protocol.as_deref(), Some("v4.channel.k8s.io"));
        assert_eq!(&up.leftover[..], b"\x80\x03\x00\x06");
    }

    #[tokio::test]
    async fn missing_version_header_means_v1() {
        let (result, _) = exchange(
            b"HTTP/1.1 101 Switching Protocols\r\nConnection: upgrade\r\nUpgrade: spdy/3.1\r\n\r\n",
        )
        .await;
        assert_eq!(result.unwrap().protocol, None);
    }

    #[tokio::test]
    async fn refusal_with_json_status_body() {
        let (result, _) = exchange(
            b"HTTP/1.1 403 Forbidden\r\nContent-Type: application/json\r\nContent-Length: 36\r\n\r\n\
              {\"kind\":\"Status\",\"status\":\"Failure\"}",
        )
        .await;
        match result {
            Err(UpgradeError::Refused {
                status,
                headers,
                body,
            }) => {
                assert_eq!(status, StatusCode::FORBIDDEN);
                assert_eq!(headers.get("content-type").unwrap(), "application/json");
                assert_eq!(&body[..], br#"{"kind":"Status","status":"Failure"}"#);
            }
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn refusal_with_chunked_and_unframed_bodies() {
        let (result, _) = exchange(
            b"HTTP/1.1 500 Internal Server Error\r\nTransfer-Encoding: chunked\r\n\r\n\
              5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n",
        )
        .await;
        assert!(
            matches!(result, Err(UpgradeError::Refused { body, .. }) if &body[..] == b"hello world")
        );
        let (result, _) =
            exchange(b"HTTP/1.1 404 Not Found\r\nContent-Type: text/plain\r\n\r\npod not found")
                .await;
        assert!(
            matches!(result, Err(UpgradeError::Refused { body, .. }) if &body[..] == b"pod not found")
        );
    }

    #[tokio::test]
    async fn redirects_are_not_followed() {
        let (result, _) = exchange(
            b"HTTP/1.1 302 Found\r\nLocation: http://elsewhere/\r\nContent-Length: 0\r\n\r\n",
        )
        .await;
        assert!(
            matches!(result, Err(UpgradeError::Refused { status, .. }) if status == StatusCode::FOUND)
        );
    }

    #[tokio::test]
    async fn bad_answers_are_typed_errors() {
        let (result, _) = exchange(b"HTTP/1.1 101 Switching Protocols\r\n\r\n").await;
        assert!(matches!(result, Err(UpgradeError::MissingUpgradeHeaders)));
        let (result, _) = exchange(b"\x16\x03\x01 definitely not http\r\n\r\n").await;
        assert!(matches!(result, Err(UpgradeError::MalformedResponse(_))));
        let (result, _) = exchange(b"HTTP/1.1 101 Swi").await;
        assert!(matches!(result, Err(UpgradeError::Closed)));
    }

    #[tokio::test]
    async fn oversized_heads_are_refused() {
        let (client, mut server) = duplex(1024 * 1024);
        tokio::spawn(async move {
            let mut b = [0u8; 4096];
            let _ = server.read(&mut b).await;
            let mut head = b"HTTP/1.1 101 Switching Protocols\r\n".to_vec();
            while head.len() < MAX_HEAD + 10 {
                head.extend_from_slice(b"X-Padding: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n");
            }
            let _ = server.write_all(&head).await;
            tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        });
        let result = upgrade(client, &request()).await;
        assert!(matches!(
            result,
            Err(UpgradeError::HeaderTooLarge | UpgradeError::MalformedResponse(_))
        ));
    }
}
