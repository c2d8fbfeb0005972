//! `--config file.yaml`: every flag of the proxy, set from a YAML file.
//!
//! Keys are the long flag names (`upstream-ca-file: /etc/ca.pem`); a list sets a repeated
//! flag, `true` sets a switch; `clusters:` is a list of clusters, each a map of the upstream and
//! auth flags' names for that cluster alone ([`ClusterEntry`]). Precedence, highest first: the command line, the environment
//! (`KUBE_WS_PROXY_*`), the config file, the built-in defaults. A file value that conflicts
//! with a flag given on the command line or in the environment (say `upstream:` in the file and
//! `--kubeconfig` on the command line) gives way to it. Unknown keys are an error, so a typo
//! never silently leaves a default in place.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};

use clap::parser::ValueSource;
use clap::{ArgAction, ArgMatches, CommandFactory, FromArgMatches, Parser};
use serde::Deserialize;

use crate::cli::{Cli, ClusterEntry, Command, ConfigOrigin, FileSettings};

/// The subcommand that reads the proxy's flags and config file, as serving does.
const KUBECONFIG_COMMAND: &str = "kubeconfig";

/// Why the command line and config file cannot be combined.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The command line itself (also `--help` and `--version`, which clap prints).
    #[error(transparent)]
    Cli(#[from] clap::Error),
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("config file {path} is not valid: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("config file {path}: unknown key {key:?} (keys are the long flag names, e.g. upstream-ca-file)")]
    UnknownKey { path: PathBuf, key: String },
    #[error("config file {path}: key {key:?} takes a single value, not a list")]
    NotAList { path: PathBuf, key: String },
}

/// One value in the file.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
enum Value {
    Bool(bool),
    Int(i64),
    Float(f64),
    Text(String),
    List(Vec<Scalar>),
}

#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
enum Scalar {
    Bool(bool),
    Int(i64),
    Float(f64),
    Text(String),
}

impl Scalar {
    fn render(&self) -> String {
        match self {
            Scalar::Bool(b) => b.to_string(),
            Scalar::Int(i) => i.to_string(),
            Scalar::Float(f) => f.to_string(),
            Scalar::Text(s) => s.clone(),
        }
    }
}

/// Parses the command line, layering `--config` underneath it when given.
pub fn parse_args<I, T>(argv: I) -> Result<Cli, ConfigError>
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let argv: Vec<OsString> = argv.into_iter().map(Into::into).collect();
    let matches = Cli::command().try_get_matches_from(&argv)?;
    // The proxy's flags: at the top, or those `kubeconfig` takes to name the same clusters.
    let serve_matches = match matches.subcommand() {
        None => &matches,
        Some((KUBECONFIG_COMMAND, sub)) => sub,
        Some(_) => return Ok(Cli::from_arg_matches(&matches)?),
    };
    let Some(config) = serve_matches.get_one::<PathBuf>("config").cloned() else {
        return Ok(Cli::from_arg_matches(&matches)?);
    };
    let text = std::fs::read_to_string(&config).map_err(|source| ConfigError::Read {
        path: config.clone(),
        source,
    })?;
    let file = read_file(&config, &text)?;
    let (extra, file_settings) = file_args(&config, file.flags, serve_matches)?;
    let mut all = argv.clone();
    // After everything given: within the subcommand's flags when there is one.
    all.extend(extra);
    let mut cli = Cli::try_parse_from(all)?;
    let serve = match &mut cli.command {
        Some(Command::Kubeconfig(args)) => &mut args.serve,
        _ => &mut cli.serve,
    };
    serve.upstream.file_clusters = file.clusters;
    serve.process.config_origin = Some(ConfigOrigin {
        argv,
        file_settings,
        file_digest: digest(text.as_bytes()),
    });
    Ok(cli)
}

/// A digest of a config file's bytes, to tell when it changes (not a security check).
pub fn digest(bytes: &[u8]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    bytes.hash(&mut hasher);
    hasher.finish()
}

/// Reads the command line of `origin` and its config file again, as at the start: the file as
/// it is now, under the same command line and environment.
pub fn reread(origin: &ConfigOrigin) -> Result<Cli, ConfigError> {
    parse_args(origin.argv.clone())
}

/// The flag a config file's clusters may also be given with (`cluster: [NAME=URL]`); with
/// `clusters:` it is what a reload changes.
const CLUSTER_KEY: &str = "cluster";

/// The file: the clusters (`clusters:`, a list of maps) and every other key, a flag.
#[derive(Debug, Default, Deserialize)]
struct File {
    #[serde(default)]
    clusters: Vec<ClusterEntry>,
    #[serde(flatten)]
    flags: BTreeMap<String, Value>,
}

fn read_file(path: &Path, text: &str) -> Result<File, ConfigError> {
    if text.trim().is_empty() {
        return Ok(File::default());
    }
    serde_saphyr::from_str(text).map_err(|e| ConfigError::Parse {
        path: path.to_owned(),
        message: e.to_string(),
    })
}

/// Whether an argument was set where the file must give way.
fn set_above_file(matches: &ArgMatches, id: &str) -> bool {
    matches!(
        matches.value_source(id),
        Some(ValueSource::CommandLine | ValueSource::EnvVariable)
    )
}

/// The flags the file contributes: only those not set on the command line or in the
/// environment, and not in conflict with one that is; and those of them that are settings
/// other than clusters, with their values.
fn file_args(
    path: &Path,
    values: BTreeMap<String, Value>,
    matches: &ArgMatches,
) -> Result<(Vec<OsString>, FileSettings), ConfigError> {
    let cmd = Cli::command();
    let mut out = Vec::new();
    let mut settings = FileSettings::new();
    for (key, value) in values {
        let unknown = || ConfigError::UnknownKey {
            path: path.to_owned(),
            key: key.clone(),
        };
        let arg = cmd
            .get_arguments()
            .find(|a| a.get_long() == Some(key.as_str()))
            .filter(|a| !matches!(a.get_id().as_str(), "config" | "help" | "version"))
            .ok_or_else(unknown)?;
        let id = arg.get_id().as_str();
        if set_above_file(matches, id) {
            continue;
        }
        let conflicting = cmd
            .get_arg_conflicts_with(arg)
            .iter()
            .any(|other| set_above_file(matches, other.get_id().as_str()));
        if conflicting {
            continue;
        }
        let switch = matches!(arg.get_action(), ArgAction::SetTrue);
        let flag = format!("--{key}");
        let items = match value {
            Value::Bool(on) if switch => {
                if on {
                    out.push(OsString::from(flag));
                    settings.insert(key, vec![on.to_string()]);
                }
                continue;
            }
            Value::List(items) if matches!(arg.get_action(), ArgAction::Append) => items,
            Value::List(_) => {
                return Err(ConfigError::NotAList {
                    path: path.to_owned(),
                    key,
                })
            }
            Value::Bool(b) => vec![Scalar::Bool(b)],
            Value::Int(i) => vec![Scalar::Int(i)],
            Value::Float(f) => vec![Scalar::Float(f)],
            Value::Text(s) => vec![Scalar::Text(s)],
        };
        let rendered: Vec<String> = items.iter().map(Scalar::render).collect();
        for item in &rendered {
            out.push(OsString::from(format!("{flag}={item}")));
        }
        if key != CLUSTER_KEY {
            settings.insert(key, rendered);
        }
    }
    Ok((out, settings))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::proxy::auth::AuthMode;

    fn with_file(yaml: &str, args: &[&str]) -> Result<Cli, ConfigError> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.yaml");
        std::fs::write(&path, yaml).unwrap();
        let mut argv = vec![
            "kube-ws-proxy".to_owned(),
            format!("--config={}", path.display()),
        ];
        argv.extend(args.iter().map(|s| s.to_string()));
        parse_args(argv)
    }

    #[test]
    fn clusters_are_a_list_of_maps_of_flag_names() {
        let yaml = "cluster: [old=http://127.0.0.1:1]\nclusters:\n- name: prod-eu\n  \
                    upstream: https://10.0.0.1:6443\n  upstream-token-file: /t\n  \
                    auth-mode: impersonate\n  upstream-streaming: spdy\n- name: dev\n  \
                    kubeconfig: /k\n  context: dev\n";
        let cli = with_file(yaml, &["--cluster", "new=http://127.0.0.1:2"]).unwrap();
        let u = cli.serve.upstream;
        // The command line wins over the file's `cluster:` as for any flag.
        assert_eq!(u.clusters.len(), 1);
        assert_eq!(u.clusters[0].name, "new");
        assert_eq!(u.file_clusters.len(), 2);
        let prod = &u.file_clusters[0];
        assert_eq!(prod.name, "prod-eu");
        assert_eq!(prod.upstream.as_deref(), Some("https://10.0.0.1:6443"));
        assert_eq!(prod.auth_mode, Some(AuthMode::Impersonate));
        assert_eq!(
            prod.upstream_streaming,
            Some(crate::cli::UpstreamStreaming::Spdy)
        );
        assert_eq!(u.file_clusters[1].context.as_deref(), Some("dev"));
        // A typo in an entry is an error, never a silent default.
        let typo = "clusters:\n- name: a\n  upstream: http://x\n  upstream-tokn-file: /t\n";
        assert!(matches!(
            with_file(typo, &[]),
            Err(ConfigError::Parse { .. })
        ));
    }

    #[test]
    fn the_file_is_read_again_under_the_same_command_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.yaml");
        std::fs::write(
            &path,
            "cluster: [a=http://127.0.0.1:1]\nclusters:\n- name: b\n  upstream: http://127.0.0.1:2\n\
             drain-timeout: 5s\nlisten: 127.0.0.1:1\nhttp2-websockets: false\n",
        )
        .unwrap();
        let argv = [
            "kube-ws-proxy".to_owned(),
            format!("--config={}", path.display()),
            "--listen=127.0.0.1:2".to_owned(),
        ];
        let cli = parse_args(argv).unwrap();
        let origin = cli.serve.process.config_origin.unwrap();
        // The settings the file gave beside its clusters; `listen` is the command line's.
        let settings: Vec<(&str, &[String])> = origin
            .file_settings
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_slice()))
            .collect();
        assert_eq!(
            settings,
            [
                ("drain-timeout", &["5s".to_owned()][..]),
                ("http2-websockets", &["false".to_owned()][..])
            ]
        );
        std::fs::write(
            &path,
            "clusters:\n- name: c\n  upstream: http://127.0.0.1:3\ndrain-timeout: 6s\n",
        )
        .unwrap();
        let again = reread(&origin).unwrap().serve;
        assert!(again.upstream.clusters.is_empty());
        assert_eq!(again.upstream.file_clusters[0].name, "c");
        assert_eq!(again.listeners.listen.to_string(), "127.0.0.1:2");
        assert_eq!(again.process.drain_timeout, Duration::from_secs(6));
        std::fs::write(&path, "drain-timeout: soon\n").unwrap();
        assert!(reread(&origin).is_err());
    }

    #[test]
    fn file_sets_flags_and_the_command_line_wins() {
        let yaml = "# comment\nupstream: https://10.0.0.1:6443\nlisten: 0.0.0.0:8443\n\
                    drain-timeout: 45s\nmax-sessions: 100\nauth-mode: impersonate\n\
                    upstream-insecure-skip-tls-verify: true\n";
        let cli = with_file(yaml, &["--listen", "127.0.0.1:9000"]).unwrap();
        let s = cli.serve;
        assert_eq!(
            s.upstream.upstream.as_deref(),
            Some("https://10.0.0.1:6443")
        );
        assert_eq!(s.listeners.listen.to_string(), "127.0.0.1:9000");
        assert_eq!(s.process.drain_timeout, Duration::from_secs(45));
        assert_eq!(s.limits.max_sessions, Some(100));
        assert_eq!(s.auth.auth_mode, AuthMode::Impersonate);
        assert!(s.upstream.upstream_insecure_skip_tls_verify);
    }

    #[test]
    fn a_switch_that_defaults_on_is_turned_off_by_the_file() {
        let on = with_file("upstream: https://10.0.0.1:6443\n", &[]).unwrap();
        assert!(on.serve.listeners.http2_websockets);
        let off = with_file(
            "upstream: https://10.0.0.1:6443\nhttp2-websockets: false\n",
            &[],
        )
        .unwrap();
        assert!(!off.serve.listeners.http2_websockets);
        let cli = with_file(
            "upstream: https://10.0.0.1:6443\nhttp2-websockets: false\n",
            &["--http2-websockets=true"],
        )
        .unwrap();
        assert!(
            cli.serve.listeners.http2_websockets,
            "the command line wins"
        );
    }

    #[test]
    fn conflicting_file_value_gives_way() {
        let cli = with_file("upstream: https://a:6443\n", &["--kubeconfig", "/tmp/kc"]).unwrap();
        assert_eq!(cli.serve.upstream.upstream, None);
        assert_eq!(
            cli.serve.upstream.kubeconfig,
            Some(PathBuf::from("/tmp/kc"))
        );
    }

    #[test]
    fn false_switch_and_empty_file() {
        let cli = with_file("in-cluster: false\nupstream: http://a\n", &[]).unwrap();
        assert!(!cli.serve.upstream.in_cluster);
        let cli = with_file("", &["--upstream", "http://b"]).unwrap();
        assert_eq!(cli.serve.upstream.upstream.as_deref(), Some("http://b"));
    }

    #[test]
    fn mistakes_are_reported() {
        assert!(matches!(
            with_file("upstreem: http://a\n", &[]),
            Err(ConfigError::UnknownKey { .. })
        ));
        assert!(matches!(
            with_file("config: other.yaml\n", &[]),
            Err(ConfigError::UnknownKey { .. })
        ));
        assert!(matches!(
            with_file("listen: [a, b]\n", &[]),
            Err(ConfigError::NotAList { .. })
        ));
        assert!(matches!(
            with_file("upstream: [\n", &[]),
            Err(ConfigError::Parse { .. })
        ));
        // Values go through the same parsers as flags.
        assert!(matches!(
            with_file("drain-timeout: soon\n", &[]),
            Err(ConfigError::Cli(_))
        ));
        assert!(matches!(
            parse_args(["kube-ws-proxy", "--config", "/nonexistent.yaml"]),
            Err(ConfigError::Read { .. })
        ));
    }

    /// A value the file can give `arg`: its default where it has one, else a made-up one.
    fn sample(arg: &clap::Arg) -> String {
        let long = arg.get_long().unwrap();
        if matches!(arg.get_action(), ArgAction::SetTrue) {
            return "true".into();
        }
        if let Some(v) = arg.get_possible_values().last() {
            return v.get_name().into();
        }
        if let Some(v) = arg.get_default_values().first() {
            return v.to_string_lossy().into_owned();
        }
        if long.ends_with("-file") || long.ends_with("-dir") || long == "kubeconfig" {
            return format!("/tmp/{long}");
        }
        match long {
            "upstream" => "http://127.0.0.1:1".into(),
            "context" => "other".into(),
            "audit-log" => "-".into(),
            "max-sessions" => "7".into(),
            "cluster" => "a=http://127.0.0.1:2".into(),
            "cluster-host-suffix" => "kube.example.com".into(),
            "tls-sni-cert" => "a=/tmp/a.crt,/tmp/a.key".into(),
            "peers" => "https://kube-ws-proxy-peers.ops.svc:8443".into(),
            "record-upload" | "audit-upload" => "s3://evidence/kube-ws-proxy".into(),
            "s3-endpoint" => "https://minio.example:9000".into(),
            "s3-region" => "eu-west-1".into(),
            "s3-path-style" => "true".into(),
            "s3-sse-kms-key-id" => "alias/evidence".into(),
            _ => panic!("give --{long} a sample value for the config-file test"),
        }
    }

    /// The flags `id` needs beside it: itself and what it requires, transitively.
    fn with_requirements(cmd: &clap::Command, id: &str) -> Vec<String> {
        let mut ids = vec![id.to_owned()];
        let mut i = 0;
        while i < ids.len() {
            let arg = cmd.get_arguments().find(|a| a.get_id() == ids[i].as_str());
            for required in crate::cli::surface::required_ids(arg.unwrap()) {
                if !ids.contains(&required) {
                    ids.push(required);
                }
            }
            i += 1;
        }
        ids
    }

    #[test]
    fn every_flag_is_a_config_key() {
        let cmd = Cli::command();
        let long_of = |id: &str| {
            let arg = cmd.get_arguments().find(|a| a.get_id() == id).unwrap();
            (arg.get_long().unwrap().to_owned(), sample(arg))
        };
        let mut checked = 0;
        for arg in cmd.get_arguments() {
            let id = arg.get_id().as_str();
            if matches!(id, "config" | "help" | "version") {
                continue;
            }
            let mut ids = with_requirements(&cmd, id);
            let conflicts = cmd.get_arg_conflicts_with(arg);
            // Some upstream must be named; `--upstream` unless this flag excludes it.
            if !ids
                .iter()
                .any(|i| i == "upstream" || i == "kubeconfig" || i == "in_cluster")
                && !conflicts.iter().any(|c| c.get_id() == "upstream")
            {
                ids.push("upstream".into());
            }
            let yaml: String = ids
                .iter()
                .map(|i| {
                    let (long, value) = long_of(i);
                    format!("{long}: \"{value}\"\n").replace("\"true\"", "true")
                })
                .collect();
            let path = Path::new("config.yaml");
            let none = Cli::command()
                .try_get_matches_from(["kube-ws-proxy"])
                .unwrap();
            let extra = read_file(path, &yaml)
                .and_then(|file| file_args(path, file.flags, &none).map(|(args, _)| args))
                .unwrap_or_else(|e| panic!("{id}: {e}"));
            let argv = std::iter::once(OsString::from("kube-ws-proxy")).chain(extra);
            let matches = Cli::command()
                .try_get_matches_from(argv)
                .unwrap_or_else(|e| panic!("{yaml}: {e}"));
            assert_eq!(
                matches.value_source(id),
                Some(ValueSource::CommandLine),
                "{yaml}"
            );
            with_file(&yaml, &[]).unwrap_or_else(|e| panic!("{yaml}: {e}"));
            checked += 1;
        }
        assert!(checked >= 50, "only {checked} flags seen");
    }

    #[test]
    fn shipped_examples_are_valid() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("config");
        let mut seen = 0;
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().and_then(|e| e.to_str()) != Some("yaml") {
                continue;
            }
            let argv = [
                "kube-ws-proxy".to_owned(),
                format!("--config={}", path.display()),
            ];
            if let Err(e) = parse_args(argv) {
                panic!("{}: {e}", path.display());
            }
            seen += 1;
        }
        assert!(
            seen >= 3,
            "expected the three deployment examples in config/"
        );
    }
}
