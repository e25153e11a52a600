//! The `kvgate` command line: parse arguments, load config, bind, run.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use kvgate::Config;

#[derive(Parser)]
#[command(
    name = "kvgate",
    version,
    about = "Prefix-cache-aware gateway for fleets of LLM servers"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Log as JSON lines instead of text.
    #[arg(long, global = true)]
    log_json: bool,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the gateway.
    Serve {
        #[arg(long, short)]
        config: PathBuf,
        /// Override server.listen.
        #[arg(long)]
        listen: Option<std::net::SocketAddr>,
    },
    /// Validate a config file; exit non-zero naming the bad field.
    Check {
        #[arg(long, short)]
        config: PathBuf,
    },
}

fn init_logs(json: bool) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if json {
        builder.json().init();
    } else {
        builder.init();
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logs(cli.log_json);
    match cli.command {
        Command::Check { config } => match Config::load(&config) {
            Ok(c) => {
                println!("{}: ok ({} endpoints)", config.display(), c.endpoints.len());
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("{}: invalid: {e}", config.display());
                ExitCode::from(2)
            }
        },
        Command::Serve { config, listen } => run(async move {
            let mut cfg = Config::load(&config)?;
            if let Some(l) = listen {
                cfg.server.listen = l;
            }
            serve(cfg).await
        }),
    }
}

fn run(fut: impl std::future::Future<Output = anyhow::Result<()>>) -> ExitCode {
    let rt = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("kvgate: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(fut) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("kvgate: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn serve(cfg: Config) -> anyhow::Result<()> {
    let listen = cfg.server.listen;
    let state = kvgate::build_state(cfg)?;
    let listener = tokio::net::TcpListener::bind(listen).await?;
    tracing::info!(addr = %listener.local_addr()?, "kvgate listening");
    kvgate::serve(listener, state, shutdown_signal()).await?;
    Ok(())
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = term => {},
    }
}
