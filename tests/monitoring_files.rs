//! The monitoring files in deploy/: the Grafana dashboard (`deploy/grafana/kube-ws-proxy.json`)
//! and the Prometheus alerting rules (`deploy/prometheus/kube-ws-proxy-rules.yaml`, with their
//! unit tests beside them).
//!
//! Every metric name the dashboard and the rules query is one a real proxy exports on its
//! `/metrics`, once it has served what each family counts; the dashboard's panels each have a
//! data source and a query; every alert waits, has a severity and says which cluster it is
//! about. promtool checks the rules and runs their unit tests, and a real Prometheus scraping a
//! real proxy evaluates every rule without error and shows data in every panel. promtool and
//! prometheus come from Debian's `prometheus` package: without them those tests are skipped
//! locally and fail in CI.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::proxy_process::ProxyProcess;
use common::ws_client::{connect, exec_path, read_to_close};
use kube_ws_proxy::sim::{SimCluster, SimConfig};
use serde::Deserialize;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const DASHBOARD: &str = "deploy/grafana/kube-ws-proxy.json";
const RULES: &str = "deploy/prometheus/kube-ws-proxy-rules.yaml";
const RULES_TEST: &str = "deploy/prometheus/kube-ws-proxy-rules.test.yaml";
/// The scrape job the rules' `up` alerts name.
const JOB: &str = "kube-ws-proxy";
/// The simulated cluster's token.
const TOKEN: &str = "monitoring-token";
const T: Duration = Duration::from_secs(60);

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

// ---- reading the files ----

fn dashboard() -> Value {
    let text = std::fs::read_to_string(root().join(DASHBOARD)).unwrap();
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{DASHBOARD} is not JSON: {e}"))
}

/// Every panel, those inside collapsed rows included, rows themselves not.
fn panels(dashboard: &Value) -> Vec<&Value> {
    let mut all = Vec::new();
    for panel in dashboard["panels"].as_array().expect("panels") {
        if panel["type"] == "row" {
            all.extend(panel["panels"].as_array().into_iter().flatten());
        } else {
            all.push(panel);
        }
    }
    all
}

/// Every panel query, as Grafana sends it (its variables not yet replaced).
fn panel_queries(dashboard: &Value) -> Vec<String> {
    panels(dashboard)
        .iter()
        .flat_map(|p| p["targets"].as_array().into_iter().flatten())
        .map(|t| t["expr"].as_str().expect("a target's expr").to_owned())
        .collect()
}

/// The templating variable called `name`.
fn variable<'d>(dashboard: &'d Value, name: &str) -> &'d Value {
    dashboard["templating"]["list"]
        .as_array()
        .expect("templating.list")
        .iter()
        .find(|v| v["name"] == name)
        .unwrap_or_else(|| panic!("no ${name} variable"))
}

/// The series selector of each `label_values(SELECTOR, label)` variable query.
fn variable_selectors(dashboard: &Value) -> Vec<String> {
    dashboard["templating"]["list"]
        .as_array()
        .expect("templating.list")
        .iter()
        .filter(|v| v["type"] == "query")
        .map(|v| {
            let query = v["definition"].as_str().expect("a variable's definition");
            let args = query
                .strip_prefix("label_values(")
                .and_then(|q| q.strip_suffix(')'))
                .unwrap_or_else(|| panic!("not label_values(selector, label): {query}"));
            let (selector, _label) = args.rsplit_once(',').expect("a selector and a label");
            selector.trim().to_owned()
        })
        .collect()
}

#[derive(Debug, Deserialize)]
struct RuleFile {
    groups: Vec<RuleGroup>,
}

#[derive(Debug, Deserialize)]
struct RuleGroup {
    rules: Vec<Rule>,
}

#[derive(Debug, Deserialize)]
struct Rule {
    alert: Option<String>,
    record: Option<String>,
    expr: String,
    #[serde(rename = "for")]
    wait: Option<String>,
    #[serde(default)]
    labels: BTreeMap<String, String>,
    #[serde(default)]
    annotations: BTreeMap<String, String>,
}

impl Rule {
    fn name(&self) -> &str {
        self.alert
            .as_deref()
            .or(self.record.as_deref())
            .unwrap_or("?")
    }
}

fn rules() -> Vec<Rule> {
    let text = std::fs::read_to_string(root().join(RULES)).unwrap();
    let file: RuleFile =
        serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("{RULES} does not parse: {e}"));
    file.groups.into_iter().flat_map(|g| g.rules).collect()
}

// ---- the metric names a PromQL expression selects ----

/// Words of PromQL that are not metric names: aggregations, keywords, literals.
const PROMQL_WORDS: &[&str] = &[
    "sum",
    "min",
    "max",
    "avg",
    "group",
    "stddev",
    "stdvar",
    "count",
    "count_values",
    "bottomk",
    "topk",
    "quantile",
    "and",
    "or",
    "unless",
    "bool",
    "offset",
    "atan2",
    "inf",
    "nan",
];

/// Words a list of label names in parentheses follows.
const LABEL_LIST_WORDS: &[&str] = &[
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
];

/// The index after the string that starts at `i` (quoted by `quote`).
fn skip_string(b: &[u8], i: usize, quote: u8) -> usize {
    let mut j = i + 1;
    while j < b.len() {
        if b[j] == b'\\' && quote != b'`' {
            j += 2;
        } else if b[j] == quote {
            return j + 1;
        } else {
            j += 1;
        }
    }
    b.len()
}

/// The index after the `close` that ends what opens at `i`, strings inside skipped.
fn skip_until(b: &[u8], i: usize, close: u8) -> usize {
    let mut j = i + 1;
    while j < b.len() {
        match b[j] {
            q @ (b'"' | b'\'' | b'`') => j = skip_string(b, j, q),
            c if c == close => return j + 1,
            _ => j += 1,
        }
    }
    b.len()
}

fn is_name_byte(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_' || c == b':'
}

/// The metric names `expr` selects: names outside label matchers, ranges and strings that
/// are neither a function (followed by `(`), a PromQL word, nor in the label list of `by`,
/// `on` and their kin.
fn metric_names(expr: &str) -> BTreeSet<String> {
    let b = expr.as_bytes();
    let mut names = BTreeSet::new();
    let mut label_list_next = false;
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            q @ (b'"' | b'\'' | b'`') => i = skip_string(b, i, q),
            b'{' => i = skip_until(b, i, b'}'),
            b'[' => i = skip_until(b, i, b']'),
            b'(' if label_list_next => {
                i = skip_until(b, i, b')');
                label_list_next = false;
            }
            // Numbers and durations.
            c if c.is_ascii_digit() || c == b'.' => {
                while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'.') {
                    i += 1;
                }
            }
            c if c.is_ascii_alphabetic() || c == b'_' || c == b':' => {
                let start = i;
                while i < b.len() && is_name_byte(b[i]) {
                    i += 1;
                }
                let word = &expr[start..i];
                let next = expr[i..].trim_start().bytes().next();
                if LABEL_LIST_WORDS.contains(&word) {
                    label_list_next = next == Some(b'(');
                } else if !PROMQL_WORDS.contains(&word) && next != Some(b'(') {
                    names.insert(word.to_owned());
                }
            }
            _ => i += 1,
        }
    }
    names
}

/// Every metric name the dashboard (panels and variables) and the rules query.
fn queried_metric_names() -> BTreeSet<String> {
    let d = dashboard();
    let exprs = panel_queries(&d)
        .into_iter()
        .chain(variable_selectors(&d))
        .chain(rules().into_iter().map(|r| r.expr));
    exprs.flat_map(|e| metric_names(&e)).collect()
}

#[test]
fn metric_names_are_the_selectors_not_functions_labels_or_strings() {
    let expr = r#"(sum by (cluster, le) (rate(a_bucket{code=~"5..", x="b{c}"}[$__rate_interval]))
        or on(cluster) group_left(kind) b * 0) / ignoring (le) c_total offset 5m
        + histogram_quantile(0.99, d) > bool 1e-3 unless absent(up{job="x"})
        + sum(e) without (f) + topk(5, g:rate5m)"#;
    let want = ["a_bucket", "b", "c_total", "d", "e", "g:rate5m", "up"];
    assert_eq!(
        metric_names(expr),
        want.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>()
    );
}

// ---- the dashboard and the rules, read ----

#[test]
fn the_dashboard_has_its_variables_and_every_panel_a_data_source_and_a_query() {
    let d = dashboard();
    let schema = d["schemaVersion"].as_u64().expect("schemaVersion");
    assert!(
        schema >= 36,
        "schemaVersion {schema}: export from a current Grafana"
    );
    let ds = variable(&d, "datasource");
    assert_eq!(ds["type"], "datasource");
    assert_eq!(ds["query"], "prometheus");
    for name in ["job", "instance", "cluster"] {
        let v = variable(&d, name);
        assert_eq!(v["type"], "query", "${name}");
        assert_eq!(v["datasource"]["uid"], "${datasource}", "${name}");
    }
    // Every configured cluster has a readiness, whether or not it has had a session.
    let cluster = variable(&d, "cluster");
    let definition = cluster["definition"].as_str().unwrap();
    assert!(
        definition.starts_with("label_values(kube_ws_proxy_upstream_ready")
            && definition.ends_with(", cluster)"),
        "$cluster: {definition}"
    );
    for name in ["instance", "cluster"] {
        let v = variable(&d, name);
        // "All" must match series without the label too (a proxy before clusters had one).
        assert_eq!(v["includeAll"], true, "${name}");
        assert_eq!(v["allValue"], ".*", "${name}");
    }
    let panels = panels(&d);
    assert!(panels.len() >= 20, "{} panels", panels.len());
    let mut ids = BTreeSet::new();
    for p in &panels {
        let title = p["title"].as_str().expect("a panel title");
        assert!(
            ids.insert(p["id"].as_u64().expect("a panel id")),
            "{title}: id taken"
        );
        assert!(p["gridPos"]["w"].as_u64().is_some(), "{title}: no gridPos");
        assert_eq!(p["datasource"]["type"], "prometheus", "{title}");
        assert_eq!(p["datasource"]["uid"], "${datasource}", "{title}");
        let targets = p["targets"].as_array().expect("targets");
        assert!(!targets.is_empty(), "{title}: no query");
        for t in targets {
            assert_eq!(t["datasource"]["uid"], "${datasource}", "{title}");
            let expr = t["expr"].as_str().unwrap_or_default();
            assert!(!expr.trim().is_empty(), "{title}: an empty query");
            assert!(!metric_names(expr).is_empty(), "{title}: selects no metric");
        }
    }
}

#[test]
fn every_alert_waits_has_a_severity_and_says_which_cluster() {
    let rules = rules();
    assert!(rules.len() >= 8, "{} rules", rules.len());
    for rule in &rules {
        let name = rule.name();
        assert!(rule.alert.is_some(), "{name}: only alerting rules here");
        assert!(rule.wait.is_some(), "{name}: no `for:`");
        let severity = rule.labels.get("severity").map(String::as_str);
        assert!(
            matches!(severity, Some("critical" | "warning")),
            "{name}: severity {severity:?}"
        );
        for key in ["summary", "description"] {
            assert!(rule.annotations.contains_key(key), "{name}: no {key}");
        }
        // Grouped by cluster, the alert names it (or says it is the only upstream).
        if rule.expr.contains("by (cluster") {
            assert!(
                rule.annotations["summary"].contains("$labels.cluster"),
                "{name}: the summary does not name the cluster"
            );
        }
    }
    let alerts: BTreeSet<_> = rules.iter().map(Rule::name).collect();
    for expected in [
        "KubeWsProxyDown",
        "KubeWsProxyClusterNotReady",
        "KubeWsProxyUpstreamUnreachable",
        "KubeWsProxyUpstreamErrorsHigh",
        "KubeWsProxySessionsRefused",
        "KubeWsProxyRecordingFailures",
        "KubeWsProxyAuditWriteFailures",
        "KubeWsProxyAuditEventsDropped",
        "KubeWsProxyConfigReloadFailed",
        "KubeWsProxyServingCertificateReloadFailed",
        "KubeWsProxyUploadsBehind",
    ] {
        assert!(alerts.contains(expected), "no {expected}");
    }
}

// ---- promtool ----

/// `name` on PATH, or `None` (skipped locally, a failure in CI: see `common::clients`).
fn prometheus_tool(name: &str) -> Option<PathBuf> {
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|p| p.join(name))
            .find(|p| p.is_file())
    });
    common::clients::require(&format!("{name} (Debian's prometheus package)"), found)
}

/// Runs promtool with `args` in deploy/prometheus; fails with its output unless it succeeds.
fn promtool(args: &[&str]) {
    let Some(promtool) = prometheus_tool("promtool") else {
        return;
    };
    let out = Command::new(promtool)
        .args(args)
        .current_dir(root().join("deploy/prometheus"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "promtool {args:?}:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn the_alerting_rules_pass_promtool_check() {
    promtool(&[
        "check",
        "rules",
        Path::new(RULES).file_name().unwrap().to_str().unwrap(),
    ]);
}

#[test]
fn the_alerting_rules_pass_their_unit_tests() {
    promtool(&[
        "test",
        "rules",
        Path::new(RULES_TEST).file_name().unwrap().to_str().unwrap(),
    ]);
}

// ---- a real proxy, each family the files query counted at least once ----

/// The simulated cluster (a token required) and the real proxy in front of it, audited, with
/// a one-second request header timeout.
struct Exercised {
    _sim: SimCluster,
    proxy: ProxyProcess,
    _dir: tempfile::TempDir,
}

async fn exercised_proxy() -> Exercised {
    let sim = SimCluster::start(SimConfig {
        require_bearer_token: Some(TOKEN.into()),
        ..SimConfig::default()
    })
    .await
    .expect("start sim cluster");
    let dir = tempfile::tempdir().unwrap();
    let audit = dir.path().join("audit.log");
    let flags = [
        "--audit-log",
        audit.to_str().unwrap(),
        "--request-header-timeout",
        "1s",
    ];
    let proxy = ProxyProcess::start(&sim.url(), &flags);
    exercise(proxy.addr).await;
    Exercised {
        _sim: sim,
        proxy,
        _dir: dir,
    }
}

/// Sends `request` on a connection of its own; the answer's status line.
async fn status_line(addr: SocketAddr, request: &str) -> String {
    let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    tcp.write_all(request.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(T, tcp.read_to_end(&mut answer)).await;
    let answer = String::from_utf8_lossy(&answer);
    answer.lines().next().unwrap_or_default().to_owned()
}

/// An upgrade request for an exec, with `extra` header lines.
fn upgrade_request(extra: &str) -> String {
    let path = exec_path("web", &["true"], false, true, false);
    format!(
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\
         Sec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: v5.channel.k8s.io\r\n{extra}\r\n"
    )
}

/// What makes each family the files query appear: a plain request, an exec, one the cluster
/// forbids, one with a token the cluster does not know, a handshake the proxy refuses, and a
/// connection that never sends a request.
async fn exercise(addr: SocketAddr) {
    let bearer = format!("Authorization: Bearer {TOKEN}\r\n");
    let list = format!(
        "GET /api/v1/namespaces/default/pods HTTP/1.1\r\nHost: x\r\n{bearer}Connection: close\r\n\r\n"
    );
    let answer = status_line(addr, &list).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");

    let protocols = format!("v5.channel.k8s.io, {}", common::bearer::entry(TOKEN));
    for pod in ["web", "forbidden-m"] {
        let path = exec_path(pod, &["echo", "hello"], false, true, false);
        let (mut ws, _) = connect(addr, &path, &protocols).await.unwrap();
        let transcript = tokio::time::timeout(T, read_to_close(&mut ws))
            .await
            .unwrap();
        if pod == "web" {
            assert_eq!(transcript.stdout, b"hello\n");
        }
    }

    let stranger =
        "Authorization: Bearer not-a-token\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n";
    let answer = status_line(addr, &upgrade_request(stranger)).await;
    assert!(answer.contains(" 401 "), "{answer}");
    // No Sec-WebSocket-Key: refused by the proxy itself.
    let answer = status_line(addr, &upgrade_request(&bearer)).await;
    assert!(answer.contains(" 400 "), "{answer}");

    // Silent until the request header timeout closes it.
    let mut silent = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut byte = [0u8; 1];
    let read = tokio::time::timeout(T, silent.read(&mut byte)).await;
    assert!(
        matches!(read, Ok(Ok(0) | Err(_))),
        "a silent connection left open"
    );
}

/// The sample names of a `/metrics` answer (a histogram's `_bucket`, `_sum` and `_count`).
fn sample_names(answer: &str) -> BTreeSet<String> {
    let (_head, body) = answer.split_once("\r\n\r\n").expect("an HTTP answer");
    body.lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| l[..l.find(['{', ' ']).unwrap_or(l.len())].to_owned())
        .collect()
}

/// Waits until every name of `wanted` but `up` (Prometheus's own) is on the proxy's
/// `/metrics` (a session is counted as finished just after its client saw it end); what is
/// still missing at the deadline.
fn missing_from_metrics(proxy: &ProxyProcess, wanted: &BTreeSet<String>) -> BTreeSet<String> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let found = sample_names(&proxy.metrics());
        let missing: BTreeSet<String> = wanted
            .iter()
            .filter(|n| *n != "up" && !found.contains(*n))
            .cloned()
            .collect();
        if missing.is_empty() || Instant::now() > deadline {
            return missing;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_the_dashboard_and_the_rules_query_is_on_a_real_proxys_metrics() {
    let queried = queried_metric_names();
    assert!(
        queried.len() >= 20 && queried.contains("kube_ws_proxy_sessions_active"),
        "{queried:?}"
    );
    let e = exercised_proxy().await;
    let missing = missing_from_metrics(&e.proxy, &queried);
    assert!(
        missing.is_empty(),
        "queried, not on /metrics: {missing:?}\n{}",
        e.proxy.metrics()
    );
}

// ---- a real Prometheus scraping it ----

/// A Prometheus server on a free loopback port scraping one proxy every second as job
/// [`JOB`], with the rules loaded; killed on drop.
struct Prometheus {
    child: Child,
    addr: SocketAddr,
    _dir: tempfile::TempDir,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Prometheus {
    fn start(bin: &Path, target: SocketAddr) -> Prometheus {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("prometheus.yml");
        let rules = root().join(RULES);
        std::fs::write(
            &config,
            format!(
                "global: {{scrape_interval: 1s, evaluation_interval: 1s}}\n\
                 rule_files: [{rules:?}]\n\
                 scrape_configs:\n\
                 - job_name: {JOB}\n  static_configs: [{{targets: [\"{target}\"]}}]\n"
            ),
        )
        .unwrap();
        let mut child = Command::new(bin)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg("--web.listen-address=127.0.0.1:0")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start prometheus");
        let (tx, rx) = std::sync::mpsc::channel();
        let stderr = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        // It listens before its storage is open, and answers 503 until it says it is ready.
        let mut addr = None;
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let line = rx
                .recv_timeout(deadline.saturating_duration_since(Instant::now()))
                .expect("prometheus did not say it was ready");
            if line.contains("msg=\"Listening on\"") {
                addr = line
                    .split_whitespace()
                    .find_map(|f| f.strip_prefix("address="))
                    .and_then(|a| a.parse().ok());
            }
            if line.contains("Server is ready to receive web requests") {
                break;
            }
        }
        let addr = addr.expect("prometheus did not say where it listens");
        Prometheus {
            child,
            addr,
            _dir: dir,
        }
    }

    /// GETs an API path; the JSON answer.
    fn get(&self, path: &str) -> Value {
        let mut s = std::net::TcpStream::connect(self.addr).unwrap();
        s.set_read_timeout(Some(T)).unwrap();
        // HTTP/1.0: the body ends with the connection, never chunked.
        write!(s, "GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").unwrap();
        let mut raw = String::new();
        s.read_to_string(&mut raw).unwrap();
        let (_head, body) = raw.split_once("\r\n\r\n").expect("an HTTP answer");
        serde_json::from_str(body).unwrap_or_else(|e| panic!("{path}: {e}: {body}"))
    }

    /// Evaluates `query` now: its result vector (an error fails the test: a bad query).
    fn query(&self, query: &str) -> Vec<Value> {
        let q = percent_encoding::utf8_percent_encode(query, percent_encoding::NON_ALPHANUMERIC);
        let answer = self.get(&format!("/api/v1/query?query={q}"));
        assert_eq!(answer["status"], "success", "{query}: {answer}");
        answer["data"]["result"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }
}

/// A dashboard query as Grafana sends it: job [`JOB`], every instance and cluster ("All"), and
/// ranges that suit a scrape every second.
fn as_grafana_sends(expr: &str) -> String {
    let q = expr
        .replace("$__rate_interval", "10s")
        .replace("$__range", "1m")
        .replace("$job", JOB)
        .replace("$instance", ".*")
        .replace("$cluster", ".*");
    assert!(!q.contains('$'), "a variable left in {q}");
    q
}

/// Each panel's queries and each variable's selector (counted), named for a failure message.
fn dashboard_queries_as_sent() -> Vec<(String, String)> {
    let d = dashboard();
    let mut all = Vec::new();
    for p in panels(&d) {
        for t in p["targets"].as_array().into_iter().flatten() {
            let title = format!("panel {} ({})", p["title"], t["refId"]);
            all.push((title, as_grafana_sends(t["expr"].as_str().unwrap())));
        }
    }
    for selector in variable_selectors(&d) {
        let query = format!("count({})", as_grafana_sends(&selector));
        all.push((format!("variable selector {selector}"), query));
    }
    all
}

/// Waits until every query has a result; fails naming those that never had one.
fn wait_for_data(prometheus: &Prometheus, mut pending: Vec<(String, String)>) {
    let deadline = Instant::now() + T;
    while !pending.is_empty() && Instant::now() < deadline {
        pending.retain(|(_, query)| prometheus.query(query).is_empty());
        std::thread::sleep(Duration::from_millis(500));
    }
    assert!(pending.is_empty(), "no data for {pending:#?}");
}

/// Waits until Prometheus has evaluated each of `count` rules; fails on one in error.
fn wait_for_rules(prometheus: &Prometheus, count: usize) {
    let deadline = Instant::now() + T;
    loop {
        let answer = prometheus.get("/api/v1/rules");
        let rules: Vec<Value> = answer["data"]["groups"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
            .collect();
        for r in &rules {
            assert_ne!(r["health"], "err", "{}: {}", r["name"], r["lastError"]);
        }
        if rules.len() == count && rules.iter().all(|r| r["health"] == "ok") {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "rules not all evaluated: {answer}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_prometheus_scraping_a_real_proxy_shows_every_panel_and_evaluates_every_rule() {
    let Some(bin) = prometheus_tool("prometheus") else {
        return;
    };
    let e = exercised_proxy().await;
    let missing = missing_from_metrics(&e.proxy, &queried_metric_names());
    assert!(missing.is_empty(), "not on /metrics: {missing:?}");
    let prometheus = Prometheus::start(&bin, e.proxy.admin_addr);
    wait_for_data(&prometheus, dashboard_queries_as_sent());
    wait_for_rules(&prometheus, rules().len());
}
