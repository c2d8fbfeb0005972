//! The web console: a page the proxy serves on the main listener under
//! `/kube-ws-proxy/console/` (after a fleet's `/clusters/NAME` prefix, for that cluster), a
//! path no Kubernetes API uses. It lists the live sessions (by the sessions API's watch),
//! shows one's terminal as it happens (its followed recording), replays finished ones and
//! terminates them, all through the sessions API with the signed-in person's own credentials:
//! the cluster's RBAC decides what they see and do.
//!
//! The files are public (they hold no data), so they are served before authentication; the
//! page's calls are authenticated as any other. Every answer forbids framing, sniffing and
//! any origin but this one (`Content-Security-Policy`), so the page can reach nothing else.
//!
//! May use `route` and `wire`; used by `listen`.

pub mod assets;

use bytes::Bytes;
use http::{header, HeaderValue, Method, Response, StatusCode};
use http_body_util::{BodyExt, Empty, Full};

use crate::proxy::wire::body::ProxyBody;
use crate::proxy::wire::status_response::failure;

/// The console's path, after any cluster prefix.
pub const PATH: &str = "/kube-ws-proxy/console/";

/// What the page may load and reach: only this origin. The player runs a WebAssembly terminal
/// emulator (`wasm-unsafe-eval`); the terminal and the player set inline styles.
const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self' 'wasm-unsafe-eval'; \
     style-src 'self' 'unsafe-inline'; img-src 'self' data:; font-src 'self' data:; \
     connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// The answer for a request to the console's path (`path` as the front door read it, without
/// a cluster prefix), or `None` when `path` is not the console's.
pub fn serve(method: &Method, path: &str) -> Option<Response<ProxyBody>> {
    let bare = PATH.trim_end_matches('/');
    if path == bare {
        // Relative, so a fleet's cluster prefix stays in the address.
        return Some(redirect("console/"));
    }
    let name = path.strip_prefix(PATH)?;
    if method != Method::GET && method != Method::HEAD {
        let mut resp = failure(
            StatusCode::METHOD_NOT_ALLOWED,
            "MethodNotAllowed",
            format!("the console's files are only read ({method})"),
        );
        resp.headers_mut()
            .insert(header::ALLOW, HeaderValue::from_static("GET, HEAD"));
        return Some(resp);
    }
    let Some(asset) = assets::find(name) else {
        return Some(failure(
            StatusCode::NOT_FOUND,
            "NotFound",
            format!("the console has no file {name:?}"),
        ));
    };
    let body = if method == Method::HEAD {
        Empty::new().map_err(|never| match never {}).boxed()
    } else {
        Full::new(Bytes::from_static(asset.body))
            .map_err(|never| match never {})
            .boxed()
    };
    let mut resp = Response::new(body);
    let headers = resp.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(asset.content_type),
    );
    headers.insert(header::CONTENT_LENGTH, HeaderValue::from(asset.body.len()));
    guard(headers);
    Some(resp)
}

/// A redirect to `location`.
fn redirect(location: &'static str) -> Response<ProxyBody> {
    let mut resp = Response::new(Empty::new().map_err(|never| match never {}).boxed());
    *resp.status_mut() = StatusCode::PERMANENT_REDIRECT;
    resp.headers_mut()
        .insert(header::LOCATION, HeaderValue::from_static(location));
    guard(resp.headers_mut());
    resp
}

/// The headers every console answer carries.
fn guard(headers: &mut http::HeaderMap) {
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    // A new binary serves new files under the same names.
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn get(path: &str) -> Option<Response<ProxyBody>> {
        serve(&Method::GET, path)
    }

    #[test]
    fn other_paths_are_not_the_consoles() {
        for path in [
            "/",
            "/api/v1/pods",
            "/kube-ws-proxy",
            "/kube-ws-proxy/consoles/",
            "/x/kube-ws-proxy/console/",
        ] {
            assert!(get(path).is_none(), "{path}");
        }
    }

    #[test]
    fn the_page_is_served_guarded() {
        let resp = get(PATH).unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        let h = resp.headers();
        assert_eq!(h[header::CONTENT_TYPE], "text/html; charset=utf-8");
        assert!(h[header::CONTENT_SECURITY_POLICY]
            .to_str()
            .unwrap()
            .contains("connect-src 'self'"));
        assert_eq!(h[header::X_CONTENT_TYPE_OPTIONS], "nosniff");
        assert_eq!(h[header::X_FRAME_OPTIONS], "DENY");
    }

    #[test]
    fn the_bare_path_redirects_relatively() {
        let resp = get("/kube-ws-proxy/console").unwrap();
        assert_eq!(resp.status(), StatusCode::PERMANENT_REDIRECT);
        assert_eq!(resp.headers()[header::LOCATION], "console/");
    }

    #[test]
    fn unknown_files_and_writes_are_refused() {
        assert_eq!(
            get("/kube-ws-proxy/console/../../etc/passwd")
                .unwrap()
                .status(),
            StatusCode::NOT_FOUND
        );
        let post = serve(&Method::POST, "/kube-ws-proxy/console/console.js").unwrap();
        assert_eq!(post.status(), StatusCode::METHOD_NOT_ALLOWED);
        assert_eq!(post.headers()[header::ALLOW], "GET, HEAD");
    }

    #[test]
    fn head_has_the_length_and_no_body() {
        let resp = serve(&Method::HEAD, "/kube-ws-proxy/console/xterm.js").unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        let length: usize = resp.headers()[header::CONTENT_LENGTH]
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(length, assets::find("xterm.js").unwrap().body.len());
    }
}
