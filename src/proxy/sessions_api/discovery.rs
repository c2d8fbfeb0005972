//! The proxy's group in the cluster's own discovery (`--sessions-discovery`): the upstream's
//! answer to `GET /apis` (a v1 `APIGroupList`, or the aggregated `APIGroupDiscoveryList` of
//! `apidiscovery.k8s.io/v2` and `v2beta1` that kubectl 1.26+ asks for) gets `kube-ws-proxy.io`
//! appended, so that `kubectl get sessions.kube-ws-proxy.io` finds the resource. Anything else
//! (another status, another type or encoding, a body past [`MAX_DISCOVERY_BODY`], JSON that is
//! no group list) passes through as it came.

use bytes::{Bytes, BytesMut};
use http::{header, HeaderMap, HeaderValue, Method, Response, StatusCode};
use http_body_util::{BodyExt, BodyStream, Full, StreamBody};
use serde_json::{json, Value};

use crate::proxy::route::sessions_api::{GROUP, RECORDING, RESOURCE, VERSION};
use crate::proxy::wire::body::ProxyBody;

/// The most of an upstream discovery answer the proxy holds to merge it (decoded, and as it
/// came): a real cluster's aggregated discovery is a few hundred KiB; a larger one passes
/// through without the group.
pub const MAX_DISCOVERY_BODY: usize = 8 * 1024 * 1024;

/// Whether a request (its method and cluster-local path) asks for the list of groups.
pub fn asks_groups(method: &Method, path: &str) -> bool {
    *method == Method::GET && matches!(path, "/apis" | "/apis/")
}

/// Asks upstream for the answer unencoded (a gzip answer is decoded all the same).
pub fn ask_identity(headers: &mut HeaderMap) {
    headers.insert(
        header::ACCEPT_ENCODING,
        HeaderValue::from_static("identity"),
    );
}

/// The upstream's answer to `GET /apis`, with the group appended when it is a group list.
pub async fn merge(resp: Response<ProxyBody>) -> Response<ProxyBody> {
    let (mut parts, body) = resp.into_parts();
    let encoding = parts
        .headers
        .get(header::CONTENT_ENCODING)
        .map(|v| v.to_str().unwrap_or("?").trim().to_ascii_lowercase());
    let known_encoding = matches!(encoding.as_deref(), None | Some("identity" | "gzip"));
    let declared = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if parts.status != StatusCode::OK
        || !is_json(&parts.headers)
        || !known_encoding
        || declared.is_some_and(|n| n > MAX_DISCOVERY_BODY as u64)
    {
        return Response::from_parts(parts, body);
    }
    let held = match hold(body).await {
        Held::Whole(bytes) => bytes,
        Held::Partly(body) => return Response::from_parts(parts, body),
    };
    let Some(merged) = merged(encoding.as_deref(), &held) else {
        return Response::from_parts(parts, full(held));
    };
    for name in [
        header::CONTENT_LENGTH,
        header::CONTENT_ENCODING,
        header::ETAG,
    ] {
        // The body is no longer the upstream's: neither its length, encoding nor validator.
        parts.headers.remove(name);
    }
    Response::from_parts(parts, full(Bytes::from(merged)))
}

/// What [`hold`] read of a body.
enum Held {
    /// All of it, within the bound.
    Whole(Bytes),
    /// Past the bound: what was read, then the rest as it comes.
    Partly(ProxyBody),
}

/// Reads `body` whole if it is at most [`MAX_DISCOVERY_BODY`] bytes.
async fn hold(mut body: ProxyBody) -> Held {
    let mut held = BytesMut::new();
    while let Some(frame) = body.frame().await {
        let frame = match frame {
            Ok(frame) => frame,
            // The upstream failed mid-answer: the client sees what came, then the end.
            Err(_) => return Held::Partly(full(held.freeze())),
        };
        let Ok(data) = frame.into_data() else {
            continue; // trailers: a JSON answer has none worth keeping
        };
        held.extend_from_slice(&data);
        if held.len() > MAX_DISCOVERY_BODY {
            let first = futures_util::stream::once(async move {
                Ok::<_, hyper::Error>(hyper::body::Frame::data(held.freeze()))
            });
            let rest = futures_util::StreamExt::chain(first, BodyStream::new(body));
            return Held::Partly(StreamBody::new(rest).boxed());
        }
    }
    Held::Whole(held.freeze())
}

/// Whether the answer says it is JSON (`application/json`, with any parameters).
fn is_json(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|t| t.trim().eq_ignore_ascii_case("application/json"))
}

/// `body` (as `encoding` says) with the group appended, or `None` when it is not a group list
/// this merges (or decodes past the bound).
pub fn merged(encoding: Option<&str>, body: &[u8]) -> Option<Vec<u8>> {
    let decoded;
    let body = match encoding {
        Some("gzip") => {
            decoded = gunzip(body)?;
            &decoded[..]
        }
        _ => body,
    };
    let mut list: Value = serde_json::from_slice(body).ok()?;
    let (items, entry) = match (list["kind"].as_str()?, list["apiVersion"].as_str()?) {
        ("APIGroupList", "v1") => ("groups", v1_entry()),
        ("APIGroupDiscoveryList", "apidiscovery.k8s.io/v2" | "apidiscovery.k8s.io/v2beta1") => {
            ("items", v2_entry())
        }
        _ => return None,
    };
    let items = list.get_mut(items)?.as_array_mut()?;
    let ours = |g: &Value| g["name"] == GROUP || g["metadata"]["name"] == GROUP;
    if !items.iter().any(ours) {
        items.push(entry);
    }
    serde_json::to_vec(&list).ok()
}

/// `body` gunzipped, if it is at most [`MAX_DISCOVERY_BODY`] bytes so.
fn gunzip(body: &[u8]) -> Option<Vec<u8>> {
    use std::io::Read;
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(body)
        .take(MAX_DISCOVERY_BODY as u64 + 1)
        .read_to_end(&mut out)
        .ok()?;
    (out.len() <= MAX_DISCOVERY_BODY).then_some(out)
}

/// The group as a v1 `APIGroupList` lists it.
fn v1_entry() -> Value {
    let version = json!({"groupVersion": format!("{GROUP}/{VERSION}"), "version": VERSION});
    json!({"name": GROUP, "versions": [version], "preferredVersion": version})
}

/// The group as an aggregated `APIGroupDiscoveryList` lists it: its one version, its one
/// resource with the verbs it serves and its `recording` subresource.
fn v2_entry() -> Value {
    let kind = |kind: &str| json!({"group": GROUP, "version": VERSION, "kind": kind});
    json!({
        "metadata": {"name": GROUP, "creationTimestamp": null},
        "versions": [{
            "version": VERSION,
            "resources": [{
                "resource": RESOURCE,
                "responseKind": kind("Session"),
                "scope": "Namespaced",
                "singularResource": "session",
                "verbs": ["delete", "get", "list", "watch"],
                "subresources": [{
                    "subresource": RECORDING,
                    "responseKind": kind("Recording"),
                    "verbs": ["get"],
                }],
            }],
            "freshness": "Current",
        }],
    })
}

fn full(bytes: Bytes) -> ProxyBody {
    Full::new(bytes).map_err(|never| match never {}).boxed()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v1_list() -> Value {
        json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": [
            {"name": "apps", "versions": [{"groupVersion": "apps/v1", "version": "v1"}]}
        ]})
    }

    fn v2_list(version: &str) -> Value {
        json!({"kind": "APIGroupDiscoveryList", "apiVersion": format!("apidiscovery.k8s.io/{version}"),
               "metadata": {}, "items": [{"metadata": {"name": "apps"}, "versions": []}]})
    }

    fn merged_value(encoding: Option<&str>, body: &[u8]) -> Value {
        serde_json::from_slice(&merged(encoding, body).expect("merged")).unwrap()
    }

    #[test]
    fn a_v1_group_list_gets_the_group() {
        let v = merged_value(None, v1_list().to_string().as_bytes());
        let groups = v["groups"].as_array().unwrap();
        assert_eq!(groups.len(), 2);
        assert_eq!(groups[0]["name"], "apps");
        assert_eq!(groups[1]["name"], GROUP);
        assert_eq!(
            groups[1]["preferredVersion"]["groupVersion"],
            "kube-ws-proxy.io/v1"
        );
    }

    #[test]
    fn an_aggregated_list_gets_the_resource_its_verbs_and_subresource() {
        for version in ["v2", "v2beta1"] {
            let v = merged_value(None, v2_list(version).to_string().as_bytes());
            let ours = &v["items"][1];
            assert_eq!(ours["metadata"]["name"], GROUP);
            let resource = &ours["versions"][0]["resources"][0];
            assert_eq!(resource["resource"], "sessions");
            assert_eq!(resource["scope"], "Namespaced");
            assert_eq!(resource["responseKind"]["kind"], "Session");
            assert_eq!(resource["verbs"], json!(["delete", "get", "list", "watch"]));
            assert_eq!(resource["subresources"][0]["subresource"], "recording");
            assert_eq!(ours["versions"][0]["freshness"], "Current");
        }
    }

    #[test]
    fn the_group_is_not_added_twice() {
        let once = merged(None, v1_list().to_string().as_bytes()).unwrap();
        let twice: Value = serde_json::from_slice(&merged(None, &once).unwrap()).unwrap();
        assert_eq!(twice["groups"].as_array().unwrap().len(), 2);
    }

    #[test]
    fn a_gzip_answer_is_decoded_and_merged() {
        use std::io::Write;
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(v2_list("v2").to_string().as_bytes()).unwrap();
        let v = merged_value(Some("gzip"), &gz.finish().unwrap());
        assert_eq!(v["items"][1]["metadata"]["name"], GROUP);
    }

    #[test]
    fn what_is_no_group_list_is_not_merged() {
        assert!(merged(None, b"<html>not json</html>").is_none());
        assert!(merged(None, br#"{"kind":"Status","apiVersion":"v1"}"#).is_none());
        assert!(merged(Some("gzip"), b"not gzip").is_none());
        // A gzip bomb decodes no further than the bound.
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        std::io::Write::write_all(&mut gz, &vec![b' '; MAX_DISCOVERY_BODY + 10]).unwrap();
        assert!(merged(Some("gzip"), &gz.finish().unwrap()).is_none());
    }

    fn answer(body: Vec<u8>, content_type: &str) -> Response<ProxyBody> {
        let mut resp = Response::new(full(Bytes::from(body)));
        resp.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_str(content_type).unwrap(),
        );
        resp.headers_mut()
            .insert(header::ETAG, HeaderValue::from_static("\"upstream\""));
        resp
    }

    async fn body_of(resp: Response<ProxyBody>) -> Vec<u8> {
        resp.into_body()
            .collect()
            .await
            .unwrap()
            .to_bytes()
            .to_vec()
    }

    #[tokio::test]
    async fn an_answer_is_merged_and_loses_the_upstream_validator() {
        let aggregated = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList";
        let resp = merge(answer(v2_list("v2").to_string().into_bytes(), aggregated)).await;
        assert!(resp.headers().get(header::ETAG).is_none());
        assert_eq!(resp.headers()[header::CONTENT_TYPE], aggregated);
        let v: Value = serde_json::from_slice(&body_of(resp).await).unwrap();
        assert_eq!(v["items"][1]["metadata"]["name"], GROUP);
    }

    #[tokio::test]
    async fn an_oversize_or_foreign_answer_passes_through_untouched() {
        // Past the bound: valid JSON all the same, so only the bound keeps it as it is.
        let mut big = v1_list();
        big["padding"] = Value::String(" ".repeat(MAX_DISCOVERY_BODY));
        let big = big.to_string().into_bytes();
        let resp = merge(answer(big.clone(), "application/json")).await;
        assert_eq!(resp.headers()[header::ETAG], "\"upstream\"");
        assert_eq!(body_of(resp).await, big);

        let list = v1_list().to_string().into_bytes();
        let resp = merge(answer(list.clone(), "application/vnd.kubernetes.protobuf")).await;
        assert_eq!(body_of(resp).await, list);

        let mut resp = answer(list.clone(), "application/json");
        *resp.status_mut() = StatusCode::NOT_MODIFIED;
        assert_eq!(body_of(merge(resp).await).await, list);

        let text = b"plain text".to_vec();
        let resp = merge(answer(text.clone(), "application/json")).await;
        assert_eq!(resp.headers()[header::ETAG], "\"upstream\"");
        assert_eq!(body_of(resp).await, text);
    }
}
