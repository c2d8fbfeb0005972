use std::io::IsTerminal;

use kube_ws_proxy::cli::{Command, LogFormat};
use kube_ws_proxy::config_file::ConfigError;
use tracing_subscriber::EnvFilter;

fn init_logging(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    // Colour only for a person at a terminal: files, pipes and log collectors get plain text
    // (NO_COLOR turns it off at a terminal too).
    let colour = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(colour)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = match kube_ws_proxy::config_file::parse_args(std::env::args_os()) {
        Ok(cli) => cli,
        // Usage errors, --help and --version exactly as clap prints them.
        Err(ConfigError::Cli(e)) => e.exit(),
        Err(e) => {
            eprintln!("kube-ws-proxy: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    init_logging(cli.serve.process.log_format);
    let result = match cli.command {
        None => serve(cli.serve).await,
        Some(Command::Demo(args)) => kube_ws_proxy::demo::run(args).await,
        Some(Command::SimCluster(args)) => kube_ws_proxy::demo::run_sim(*args).await,
        Some(Command::Kubeconfig(args)) => {
            kube_ws_proxy::kubeconfig::run(&args).map_err(Into::into)
        }
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("kube-ws-proxy: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn serve(args: kube_ws_proxy::cli::ServeArgs) -> Result<(), Box<dyn std::error::Error>> {
    let proxy = kube_ws_proxy::app::start(&args).await?;
    kube_ws_proxy::app::wait_for_signal().await;
    tracing::info!("shutting down");
    proxy.shutdown().await;
    Ok(())
}
