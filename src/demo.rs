//! `kube-ws-proxy demo`: three simulated clusters of different kinds behind the proxy (or one,
//! with `--sim-streaming`), a kubeconfig with a context for each, and commands to try.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use clap::Parser;

use crate::cli::{DemoArgs, SimArgs};
use crate::kubeconfig::{Document, Entry, Front};
use crate::sim::{SimCluster, SimConfig, SimFrontProxy, SimStreaming, SimTls};

type BoxError = Box<dyn std::error::Error>;

/// The demo's clusters: an old one, a new one, and one behind a gateway that takes only
/// WebSocket.
const FLEET: [(&str, SimStreaming); 3] = [
    ("old", SimStreaming::SpdyOnly),
    ("new", SimStreaming::New),
    ("ws-only", SimStreaming::WebSocketOnly),
];

/// A kubeconfig for a plain-HTTP server without credentials (or with a bearer token): one
/// context, `demo`, in namespace `default`.
pub fn kubeconfig(server: &str, token: Option<&str>) -> String {
    Document {
        entries: vec![Entry {
            name: "demo".into(),
            server: server.into(),
        }],
        token: token.map(str::to_owned),
        namespace: Some("default".into()),
        ..Document::default()
    }
    .render()
}

/// A demo that would give the network a shell on this host.
#[derive(Debug, thiserror::Error)]
#[error(
    "demo --listen {0}: the demo's pod runs commands on this host for anyone who reaches the \
     proxy, without credentials; listen on loopback, or pass --allow-remote-demo if that is \
     what you want"
)]
pub struct RemoteDemoRefused(pub SocketAddr);

/// Refuses a demo listening beyond loopback unless `--allow-remote-demo`, and warns when it is.
fn check_listen(args: &DemoArgs) -> Result<(), RemoteDemoRefused> {
    if args.listen.ip().is_loopback() {
        return Ok(());
    }
    if !args.allow_remote_demo {
        return Err(RemoteDemoRefused(args.listen));
    }
    tracing::warn!(
        listen = %args.listen,
        "demo on an address other than loopback (--allow-remote-demo): anyone who reaches it \
         can run commands on this host, as this user, without credentials"
    );
    Ok(())
}

/// A simulated cluster of the demo: its name (`None`: the unnamed upstream) and kind.
struct DemoCluster {
    name: Option<&'static str>,
    sim: SimCluster,
}

/// The demo's simulated clusters: the three of [`FLEET`], or one of `single`'s kind.
async fn start_clusters(single: Option<SimStreaming>) -> Result<Vec<DemoCluster>, BoxError> {
    let kinds: Vec<(Option<&'static str>, SimStreaming)> = match single {
        Some(kind) => vec![(None, kind)],
        None => FLEET.iter().map(|(n, k)| (Some(*n), *k)).collect(),
    };
    let mut clusters = Vec::new();
    for (name, streaming) in kinds {
        let sim = SimCluster::start(SimConfig {
            streaming,
            ..SimConfig::default()
        })
        .await?;
        clusters.push(DemoCluster { name, sim });
    }
    Ok(clusters)
}

/// Runs the demo until Ctrl-C.
pub async fn run(args: DemoArgs) -> Result<(), BoxError> {
    check_listen(&args)?;
    let clusters = start_clusters(args.sim_streaming).await?;
    let mut argv = vec![
        "kube-ws-proxy".to_owned(),
        format!("--listen={}", args.listen),
        "--admin-listen=127.0.0.1:0".to_owned(),
        "--drain-timeout=5s".to_owned(),
    ];
    argv.extend(clusters.iter().map(|c| match c.name {
        Some(name) => format!("--cluster={name}={}", c.sim.url()),
        None => format!("--upstream={}", c.sim.url()),
    }));
    // Parsed like the command line, so every flag keeps its documented default.
    let serve = crate::cli::Cli::try_parse_from(argv)?.serve;
    let proxy = crate::app::start(&serve).await?;
    let server = format!("http://{}", proxy.addr);
    // The kubeconfig `kube-ws-proxy kubeconfig --server URL` makes of these flags.
    let doc = crate::kubeconfig::for_clusters(&Front::at(&server)?, &serve)?;
    crate::kubeconfig::write(&args.kubeconfig, &doc.render())?;
    println!(
        "{}",
        usage(&clusters, &doc, &args.kubeconfig, proxy.admin_addr)
    );
    crate::app::wait_for_signal().await;
    proxy.shutdown().await;
    for c in clusters {
        c.sim.shutdown().await;
    }
    Ok(())
}

/// What the demo runs and commands to try, one context per cluster.
fn usage(clusters: &[DemoCluster], doc: &Document, kubeconfig: &Path, admin: SocketAddr) -> String {
    let k = kubeconfig.display();
    let mut out = String::from("\n");
    for (c, entry) in clusters.iter().zip(&doc.entries) {
        out += &format!(
            "Simulated cluster {:<8} ({}): {}\n  through kube-ws-proxy: {}\n",
            entry.name,
            c.sim.streaming(),
            c.sim.url(),
            entry.server
        );
    }
    let names: Vec<&str> = doc.entries.iter().map(|e| e.name.as_str()).collect();
    let first = names[0];
    let last = names[names.len() - 1];
    out += &format!(
        "kube-ws-proxy's admin listener: http://{admin} (/clusters, /readyz, /metrics)\n\
         Kubeconfig written to {k}, a context per cluster: {contexts} (current: {first})\n\n\
         Try (kubectl 1.31+ speaks WebSocket: translated to SPDY for an SPDY-only cluster, passed \
         through to the others):\n\
         \x20 kubectl --kubeconfig {k} config get-contexts\n\
         \x20 kubectl --kubeconfig {k} --context {first} get pods demo\n\
         \x20 kubectl --kubeconfig {k} --context {first} exec demo -- sh -c 'echo hello from the pod; uname -a'\n\
         \x20 kubectl --kubeconfig {k} --context {last} exec -it demo -- sh\n\
         \x20 echo hi | kubectl --kubeconfig {k} --context {last} exec -i demo -- cat\n\
         \x20 kubectl --kubeconfig {k} --context {first} attach -i demo\n\
         \x20 kubectl --kubeconfig {k} --context {last} logs -f demo\n\
         \x20 kubectl --kubeconfig {k} --context {first} port-forward pod/demo 9000:<a local port with a server>\n\
         \nPress Ctrl-C to stop.",
        contexts = names.join(", "),
    );
    out
}

/// A `sim-cluster` flag file that could not be read.
#[derive(Debug, thiserror::Error)]
#[error("cannot read {path}: {source}")]
pub struct SimFileError {
    pub path: PathBuf,
    pub source: std::io::Error,
}

fn read_pem(path: &Path) -> Result<String, SimFileError> {
    std::fs::read_to_string(path).map_err(|source| SimFileError {
        path: path.to_owned(),
        source,
    })
}

/// The simulated cluster's configuration from `sim-cluster` flags (PEM files read now).
pub fn sim_config(args: SimArgs) -> Result<SimConfig, SimFileError> {
    let tls = match (&args.tls_cert_file, &args.tls_private_key_file) {
        (Some(cert), Some(key)) => Some(SimTls {
            cert_chain_pem: read_pem(cert)?,
            private_key_pem: read_pem(key)?,
            client_ca_pem: args.client_ca_file.as_deref().map(read_pem).transpose()?,
        }),
        _ => None,
    };
    let front_proxy = match &args.requestheader_client_ca_file {
        Some(ca) => Some(SimFrontProxy {
            requestheader_client_ca_pem: read_pem(ca)?,
            allowed_names: args.requestheader_allowed_names,
            username_headers: args.requestheader_username_headers,
            group_headers: args.requestheader_group_headers,
            extra_header_prefixes: args.requestheader_extra_headers_prefix,
        }),
        None => None,
    };
    Ok(SimConfig {
        listen: args.listen,
        require_bearer_token: args.require_token,
        tls,
        users: args.token_users,
        impersonators: args.impersonators,
        front_proxy,
        streaming: args.streaming,
        exec_start_delay: args.exec_start_delay,
        ..SimConfig::default()
    })
}

/// Runs only the simulated cluster until Ctrl-C.
pub async fn run_sim(args: SimArgs) -> Result<(), BoxError> {
    let sim = SimCluster::start(sim_config(args)?).await?;
    println!(
        "simulated cluster ({}) listening on {}",
        sim.streaming(),
        sim.url()
    );
    crate::app::wait_for_signal().await;
    sim.shutdown().await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn demo(args: &[&str]) -> DemoArgs {
        let argv = ["kube-ws-proxy", "demo"].iter().chain(args);
        match crate::cli::Cli::try_parse_from(argv).unwrap().command {
            Some(crate::cli::Command::Demo(args)) => args,
            _ => panic!("not the demo"),
        }
    }

    #[test]
    fn a_demo_beyond_loopback_needs_allow_remote_demo() {
        assert!(check_listen(&demo(&[])).is_ok());
        assert!(check_listen(&demo(&["--listen", "[::1]:8080"])).is_ok());
        let e = check_listen(&demo(&["--listen", "0.0.0.0:8080"])).unwrap_err();
        assert!(e.to_string().contains("--allow-remote-demo"), "{e}");
        assert!(check_listen(&demo(&["--listen", "10.1.2.3:8080"])).is_err());
        assert!(check_listen(&demo(&["--listen", "0.0.0.0:8080", "--allow-remote-demo"])).is_ok());
    }
}
