//! `kube-ws-proxy demo`: the simulated SPDY-only cluster with the proxy in front of it, a
//! kubeconfig pointing at the proxy, and commands to try.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use clap::Parser;

use crate::cli::{DemoArgs, SimArgs};
use crate::sim::{SimCluster, SimConfig, SimFrontProxy, SimTls};

type BoxError = Box<dyn std::error::Error>;

/// A kubeconfig for a plain-HTTP server without credentials (or with a bearer token).
pub fn kubeconfig(server: &str, token: Option<&str>) -> String {
    let user = match token {
        Some(t) => format!("  user:\n    token: {t}\n"),
        None => "  user: {}\n".to_owned(),
    };
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: demo\n  cluster:\n    server: {server}\n\
         contexts:\n- name: demo\n  context:\n    cluster: demo\n    user: demo\n    namespace: default\n\
         current-context: demo\nusers:\n- name: demo\n{user}"
    )
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

/// Runs the demo until Ctrl-C.
pub async fn run(args: DemoArgs) -> Result<(), BoxError> {
    check_listen(&args)?;
    let sim = SimCluster::start(SimConfig {
        streaming: args.sim_streaming,
        ..SimConfig::default()
    })
    .await?;
    // Parsed like the command line, so every flag keeps its documented default.
    let serve = crate::cli::Cli::try_parse_from([
        "kube-ws-proxy".to_owned(),
        format!("--listen={}", args.listen),
        "--admin-listen=127.0.0.1:0".to_owned(),
        format!("--upstream={}", sim.url()),
        "--drain-timeout=5s".to_owned(),
    ])?
    .serve;
    let proxy = crate::app::start(&serve).await?;
    let server = format!("http://{}", proxy.addr);
    write_kubeconfig(&args.kubeconfig, &kubeconfig(&server, None))?;
    let k = args.kubeconfig.display();
    println!(
        "\nSimulated cluster ({streaming}): {sim_url}\nkube-ws-proxy in front of it: {server} (admin {admin})\n\
         Kubeconfig written to {k}\n\nTry (kubectl 1.31+ speaks WebSocket and is translated to SPDY):\n\
         \x20 kubectl --kubeconfig {k} get pods demo\n\
         \x20 kubectl --kubeconfig {k} exec demo -- sh -c 'echo hello from the pod; uname -a'\n\
         \x20 kubectl --kubeconfig {k} exec -it demo -- sh\n\
         \x20 echo hi | kubectl --kubeconfig {k} exec -i demo -- cat\n\
         \x20 kubectl --kubeconfig {k} attach -i demo\n\
         \x20 kubectl --kubeconfig {k} port-forward pod/demo 9000:<a local port with a server>\n\
         \nPress Ctrl-C to stop.",
        sim_url = sim.url(),
        streaming = args.sim_streaming,
        admin = proxy.admin_addr,
    );
    crate::app::wait_for_signal().await;
    proxy.shutdown().await;
    sim.shutdown().await;
    Ok(())
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

fn write_kubeconfig(path: &Path, contents: &str) -> std::io::Result<()> {
    std::fs::write(path, contents)
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
