//! The `kvgate` command line: parse arguments, load config, bind, run.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use kvgate::Config;

/// jemalloc instead of glibc's malloc: a proxied request makes a few dozen
/// short-lived allocations across worker threads, and glibc's arenas spent
/// 18% of the gateway's CPU on them under load (bench/results/proxy-profile.md;
/// mimalloc was as fast but idled at 28 MiB against jemalloc's 19).
#[global_allocator]
static ALLOC: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

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
    /// Run the gateway in front of a simulated fleet: no config, no GPUs.
    Demo {
        #[arg(long, default_value = "127.0.0.1:8080")]
        listen: std::net::SocketAddr,
        /// Simulated instances.
        #[arg(long, default_value_t = 4)]
        instances: usize,
        /// Simulated time per real time: 1.0 real time, 0.1 ten times faster.
        #[arg(long, default_value_t = 1.0)]
        time_scale: f64,
        /// Routing strategy: kv_aware (the simulated instances publish KV events),
        /// longest_prefix, prefix_aware, least_outstanding_requests, random, round_robin.
        #[arg(long, default_value = "kv_aware")]
        strategy: kvgate_routing::Strategy,
    },
    /// GET a URL and exit 0 on a 2xx (the container's HEALTHCHECK; the image has no curl).
    Probe {
        #[arg(long, default_value = "http://127.0.0.1:8080/health")]
        url: String,
    },
    /// Validate a config file; exit non-zero naming the bad field.
    Check {
        #[arg(long, short)]
        config: PathBuf,
    },
    /// Explain how the request on stdin would be routed (nothing is sent).
    Explain {
        #[arg(long, short)]
        config: PathBuf,
        /// Gateway path the request is sent to; guessed from the body when absent
        /// (`prompt` → /v1/completions, otherwise /v1/chat/completions).
        #[arg(long)]
        path: Option<String>,
        /// Extra request header, `name: value` (e.g. the prefix-aware id). Repeatable.
        #[arg(long = "header", short = 'H')]
        headers: Vec<String>,
        /// Tenant the request is authenticated as.
        #[arg(long, default_value = "anonymous")]
        tenant: String,
    },
    /// Print kvgate's `endpoints:` for a SageMaker endpoint config (the JSON of
    /// `aws sagemaker describe-endpoint-config`): one endpoint per production
    /// variant, its RoutingConfig as the routing.
    ImportSagemaker {
        /// The endpoint-config JSON file.
        file: PathBuf,
        /// An instance URL for every variant (repeatable); placeholders otherwise.
        #[arg(long = "instance")]
        instances: Vec<String>,
    },
    /// Replay a Mooncake trace through the routing policies onto a simulated
    /// fleet, offline in virtual time; sweep prefix_aware's prefix_length ×
    /// concurrency_threshold and longest_prefix's block_chars × assumed cache size,
    /// and recommend a setting of each.
    Simulate(kvgate_simulate::SimulateArgs),
}

/// Logs to stderr, and traces over OTLP when the standard OpenTelemetry
/// environment names a collector (see `kvgate::otel`). The guard flushes
/// the last spans when dropped.
fn init_logs(json: bool) -> Option<kvgate::telemetry::otel::Guard> {
    use tracing_subscriber::Layer as _;
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // Colours only for a terminal: a log file or collector gets plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let fmt = tracing_subscriber::fmt::layer()
        .with_ansi(ansi)
        .with_writer(std::io::stderr);
    let fmt = if json {
        fmt.json().with_filter(filter).boxed()
    } else {
        fmt.with_filter(filter).boxed()
    };
    let mut guard = None;
    let otel = kvgate::telemetry::otel::endpoint_from_env().and_then(|url| {
        match kvgate::telemetry::otel::layer(&url) {
            Ok((layer, g)) => {
                guard = Some((g, url));
                // kvgate's own spans at INFO, whatever RUST_LOG says to the logs.
                Some(
                    layer.with_filter(
                        tracing_subscriber::filter::Targets::new()
                            .with_target("kvgate", tracing::Level::INFO)
                            .with_target("tower_http", tracing::Level::INFO),
                    ),
                )
            }
            Err(e) => {
                eprintln!("OpenTelemetry traces off: {e}");
                None
            }
        }
    });
    tracing_subscriber::registry().with(fmt).with(otel).init();
    guard.map(|(g, url)| {
        g.enable();
        tracing::info!(collector = %url, "exporting traces over OTLP/HTTP");
        g
    })
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let _traces = init_logs(cli.log_json);
    match cli.command {
        Command::Simulate(args) => match kvgate_simulate::run(&args) {
            Ok(out) => {
                print!("{out}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("kvgate simulate: {e:#}");
                ExitCode::from(2)
            }
        },
        Command::ImportSagemaker { file, instances } => {
            let imported = std::fs::read_to_string(&file)
                .map_err(|e| format!("{}: {e}", file.display()))
                .and_then(|json| kvgate::sagemaker::import::import(&json, &instances));
            match imported {
                Ok(yaml) => {
                    print!("{yaml}");
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("kvgate import-sagemaker: {e}");
                    ExitCode::from(2)
                }
            }
        }
        Command::Check { config } => match Config::load(&config) {
            Ok(c) => {
                println!("{}: ok ({} endpoints)", config.display(), c.endpoints.len());
                let text = std::fs::read_to_string(&config).unwrap_or_default();
                for w in c.secret_warnings(&text) {
                    println!("  warning: {w}");
                }
                for ep in &c.endpoints {
                    let r = &ep.routing;
                    let written = r
                        .strategy_as_written
                        .as_deref()
                        .map_or_else(|| "the default".to_owned(), |s| format!("{s:?}"));
                    println!(
                        "  endpoint {}: strategy {} ({written}): {}",
                        ep.name,
                        r.strategy.as_str(),
                        r.strategy.describe()
                    );
                    if let Some(d) = &ep.discovery {
                        let how = match &d.source {
                            kvgate::config::discovery::Source::Dns { server, .. } => format!(
                                "from DNS {} every {} ms{}",
                                d.target(),
                                d.interval.as_millis(),
                                server.map_or_else(
                                    || " (system resolver)".to_owned(),
                                    |s| format!(" (asking {s})")
                                )
                            ),
                            kvgate::config::discovery::Source::Kubernetes { .. } => {
                                format!("watched from {}", d.target())
                            }
                        };
                        println!("    {} static instance(s), more {how}", ep.instances.len());
                    }
                    if let Some(kv) = &r.kv {
                        let following = ep
                            .instances
                            .iter()
                            .filter(|i| i.kv_events.is_some())
                            .count();
                        println!(
                            "    {}, block_size {}; {following} of {} instances publish KV events (the rest: approximate index)",
                            kv.describe_tokenizer(),
                            kv.block_size,
                            ep.instances.len(),
                        );
                    }
                }
                if c.queue.enabled {
                    println!(
                        "  queue: an instance is saturated at {} in flight or as its engine's /metrics says; until the first reading (every {} ms) only the {} bound holds{}",
                        c.queue.max_in_flight,
                        c.queue.engine_poll.as_millis(),
                        c.queue.max_in_flight,
                        if c.queue.max_in_flight >= 256 {
                            " (the default, vLLM's max_num_seqs: it protects no engine; set max_in_flight to the engines' batch size)"
                        } else {
                            ""
                        }
                    );
                }
                if let Some(cl) = &c.cluster {
                    match cl.sync {
                        Some(every) => println!(
                            "  cluster: tenant limits, load, placements and fair service shared through Redis every {} ms",
                            every.as_millis()
                        ),
                        None => println!(
                            "  cluster: tenant limits shared through Redis; routing state not shared (sync_ms: 0)"
                        ),
                    }
                }
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("{}: invalid: {e}", config.display());
                ExitCode::from(2)
            }
        },
        Command::Explain {
            config,
            path,
            headers,
            tenant,
        } => match explain(&config, path, &headers, &tenant) {
            Ok(text) => {
                println!("{text}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("kvgate explain: {e:#}");
                ExitCode::from(2)
            }
        },
        Command::Demo {
            listen,
            instances,
            time_scale,
            strategy,
        } => run(async move {
            let opts = kvgate::demo::DemoOptions {
                instances,
                time_scale,
                strategy,
            };
            let demo = kvgate::demo::start_fleet(&opts, listen).await?;
            let listener = bind(listen).await?;
            let addr = listener.local_addr()?;
            println!("{}", kvgate::demo::banner(&demo, addr));
            kvgate::serve(
                listener,
                std::sync::Arc::clone(&demo.state),
                shutdown_signal(),
            )
            .await?;
            Ok(())
        }),
        Command::Probe { url } => run(async move {
            let client = reqwest::Client::builder()
                .timeout(std::time::Duration::from_secs(3))
                .build()?;
            let status = client.get(&url).send().await?.status();
            anyhow::ensure!(status.is_success(), "{url} answered {status}");
            Ok(())
        }),
        Command::Serve { config, listen } => run(async move {
            let mut cfg = Config::load(&config)?;
            let text = std::fs::read_to_string(&config)?;
            let placeholders = kvgate::config::placeholder_secrets(&text);
            if !placeholders.is_empty() {
                anyhow::bail!(
                    "{}: still has config.example.yaml's placeholder secret {placeholders:?}: set your own (32+ random bytes) before serving",
                    config.display()
                );
            }
            if let Some(l) = listen {
                cfg.server.listen = l;
            }
            serve(cfg, Some(config)).await
        }),
    }
}

fn explain(
    config: &std::path::Path,
    path: Option<String>,
    headers: &[String],
    tenant: &str,
) -> anyhow::Result<String> {
    use std::io::Read;
    let cfg = Config::load(config)?;
    let mut body = Vec::new();
    std::io::stdin().read_to_end(&mut body)?;
    let mut map = axum::http::HeaderMap::new();
    for h in headers {
        let (k, v) = h
            .split_once(':')
            .ok_or_else(|| anyhow::anyhow!("header {h:?} is not `name: value`"))?;
        map.append(
            axum::http::HeaderName::try_from(k.trim())?,
            axum::http::HeaderValue::try_from(v.trim())?,
        );
    }
    let path = path.unwrap_or_else(|| {
        let has_prompt = serde_json::from_slice::<serde_json::Value>(&body)
            .is_ok_and(|v| v.get("prompt").is_some() && v.get("messages").is_none());
        if has_prompt {
            "/v1/completions"
        } else {
            "/v1/chat/completions"
        }
        .to_owned()
    });
    let runtime = kvgate::Runtime::build(cfg, None)?;
    let v = kvgate::request::explain::explain(&runtime, &path, &map, body.into(), tenant)
        .map_err(|e| anyhow::anyhow!("{} ({})", e.message, e.status()))?;
    Ok(serde_json::to_string_pretty(&v)?)
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

async fn serve(cfg: Config, path: Option<PathBuf>) -> anyhow::Result<()> {
    let listen = cfg.server.listen;
    let state = kvgate::build_state(cfg)?;
    if let Some(path) = path {
        tokio::spawn(kvgate::fleet::reload::watch(
            path,
            std::sync::Arc::clone(&state),
        ));
    }
    let listener = bind(listen).await?;
    tracing::info!(addr = %listener.local_addr()?, "kvgate listening");
    kvgate::serve(listener, state, shutdown_signal()).await?;
    Ok(())
}

/// Bind, naming the address when that fails ("address already in use" alone
/// does not say which).
async fn bind(addr: std::net::SocketAddr) -> anyhow::Result<tokio::net::TcpListener> {
    use anyhow::Context as _;
    tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen on {addr}"))
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
