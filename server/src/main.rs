//! The `spool` binary: `spool serve` runs the server; the other subcommands are
//! clients of a running server. Parsing only: the work is in the library.

use std::{net::SocketAddr, time::Duration};

use anyhow::Context;
use clap::{Parser, Subcommand};
use spool_proto::v1;
use spool_server::{
    Config,
    cli::{self, Client, Target},
};

#[derive(Parser)]
#[command(name = "spool", version, about = "Spool: a durable activity server")]
struct Cli {
    /// The server a client command talks to [default: http://127.0.0.1:7070]. For
    /// `bench`: benchmark this server instead of starting one.
    #[arg(long, global = true, env = "SPOOL_SERVER")]
    server: Option<String>,
    /// Bearer token for a server started with --auth-token.
    #[arg(long, global = true, env = "SPOOL_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// Print JSON instead of tables.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the server.
    Serve(ServeArgs),
    /// Submit an activity.
    Submit(SubmitArgs),
    /// Show an activity.
    Get(KeyArgs),
    /// Wait until an activity is finished (exit 3 if it FAILED or was CANCELLED).
    Wait {
        #[command(flatten)]
        key: KeyArgs,
        /// Give up after this long and show the current state.
        #[arg(long, value_parser = duration)]
        timeout: Option<Duration>,
    },
    /// Cancel a scheduled or running activity.
    Cancel {
        #[command(flatten)]
        key: KeyArgs,
        #[arg(long, default_value = "")]
        reason: String,
    },
    /// Re-drive a FAILED or CANCELLED activity with a fresh attempt budget.
    Retry(KeyArgs),
    /// List activities.
    Ls {
        #[arg(long, default_value = "")]
        namespace: String,
        /// scheduled, running, completed, failed or cancelled.
        #[arg(long, value_parser = cli::parse_status)]
        status: Option<v1::ActivityStatus>,
        #[arg(long = "type")]
        activity_type: Option<String>,
        #[arg(long, default_value_t = 50)]
        limit: usize,
    },
    /// Count activities by status.
    Stats {
        #[arg(long, default_value = "")]
        namespace: String,
    },
    /// List connected workers.
    Workers {
        #[arg(long, default_value = "")]
        namespace: String,
    },
    /// Measure throughput and latency (starts a server unless --server is given).
    Bench(BenchArgs),
    /// Drain the server: stop dispatching, let running activities finish.
    Drain {
        #[arg(long, value_parser = duration)]
        timeout: Option<Duration>,
    },
}

#[derive(clap::Args)]
struct BenchArgs {
    /// The in-process server's database (default: a fresh temporary SQLite file).
    #[arg(long)]
    database: Option<String>,
    /// Activities per throughput phase.
    #[arg(long, default_value_t = 20_000)]
    activities: usize,
    /// Concurrent submit callers.
    #[arg(long, default_value_t = 16)]
    submit_concurrency: usize,
    /// Activities per SubmitBatch call.
    #[arg(long, default_value_t = 500)]
    batch: usize,
    /// Total worker concurrency.
    #[arg(long, default_value_t = 50)]
    concurrency: u32,
    /// Worker connections sharing that concurrency.
    #[arg(long, default_value_t = 2)]
    workers: u32,
    /// Offered rate of the latency phase, activities per second.
    #[arg(long, default_value_t = 500)]
    rate: u32,
    /// Length of the latency phase.
    #[arg(long, default_value = "10s", value_parser = duration)]
    duration: Duration,
    /// Input size of each activity.
    #[arg(long, default_value_t = 64)]
    payload_bytes: usize,
    /// Rows of a type no worker serves, stored before the phases run.
    #[arg(long, default_value_t = 0)]
    preload: usize,
    /// Workers kept connected for the whole run, serving a type nobody submits.
    #[arg(long, default_value_t = 0)]
    idle_workers: usize,
    /// Phases to run, in order: submit, drain, latency, e2e.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "submit,drain,latency,e2e"
    )]
    phases: Vec<spool_server::bench::Phase>,
}

#[derive(clap::Args)]
struct KeyArgs {
    workflow_id: String,
    activity_id: String,
    #[arg(long, default_value = "")]
    namespace: String,
}

impl KeyArgs {
    fn key(self) -> v1::ActivityKey {
        v1::ActivityKey {
            namespace: self.namespace,
            workflow_id: self.workflow_id,
            activity_id: self.activity_id,
        }
    }
}

#[derive(clap::Args)]
struct SubmitArgs {
    /// The activity type a worker registered.
    activity_type: String,
    /// Input as inline JSON, or @FILE.
    #[arg(long)]
    input: Option<String>,
    /// Generated (UUIDv7) when empty.
    #[arg(long, default_value = "")]
    workflow_id: String,
    /// Generated (UUIDv7) when empty.
    #[arg(long, default_value = "")]
    activity_id: String,
    #[arg(long, default_value = "")]
    namespace: String,
    /// Run no earlier than this from now.
    #[arg(long, value_parser = duration)]
    delay: Option<Duration>,
    #[arg(long)]
    max_attempts: Option<u32>,
    #[arg(long, default_value_t = 0, allow_hyphen_values = true)]
    priority: i32,
    /// Wait for the outcome (exit 3 if it FAILED or was CANCELLED).
    #[arg(long)]
    wait: bool,
    /// With --wait: give up after this long.
    #[arg(long, value_parser = duration, requires = "wait")]
    timeout: Option<Duration>,
}

fn duration(s: &str) -> Result<Duration, String> {
    spool_proto::duration::parse(s).map_err(|e| e.to_string())
}

#[derive(clap::Args)]
struct ServeArgs {
    /// Address to listen on.
    #[arg(long, env = "SPOOL_LISTEN", default_value = "127.0.0.1:7070")]
    listen: SocketAddr,
    /// Database URL: sqlite://PATH (created if missing).
    #[arg(long, env = "SPOOL_DATABASE_URL", default_value = "sqlite://spool.db")]
    database: String,
    /// How long in-flight activities may finish when draining.
    #[arg(long, env = "SPOOL_DRAIN_TIMEOUT", default_value = "30s", value_parser = duration)]
    drain_timeout: Duration,
    /// How long a running activity's lease lasts without renewal.
    #[arg(long, env = "SPOOL_LEASE_TIMEOUT", default_value = "30s", value_parser = duration)]
    lease_timeout: Duration,
    /// How often workers must send a keep-alive.
    #[arg(long, env = "SPOOL_HEARTBEAT_INTERVAL", default_value = "5s", value_parser = duration)]
    heartbeat_interval: Duration,
    /// A bearer token every client and worker must present.
    #[arg(long, env = "SPOOL_AUTH_TOKEN", hide_env_values = true)]
    auth_token: Option<String>,
    /// A JSON file of tokens with roles and namespaces (see README).
    #[arg(long, env = "SPOOL_TOKENS_FILE")]
    tokens_file: Option<std::path::PathBuf>,
    /// The largest payload accepted, in bytes.
    #[arg(long, env = "SPOOL_MAX_PAYLOAD_BYTES", default_value_t = 4 * 1024 * 1024)]
    max_payload_bytes: usize,
    /// Serve Prometheus metrics at http://ADDR/metrics.
    #[arg(long, env = "SPOOL_METRICS_LISTEN")]
    metrics_listen: Option<SocketAddr>,
    /// How long finished activities are kept.
    #[arg(long, env = "SPOOL_RETENTION", default_value = "7d", value_parser = duration)]
    retention: Duration,
    /// Log format: text or json (level from RUST_LOG, default info).
    #[arg(long, env = "SPOOL_LOG_FORMAT", default_value = "text", value_parser = ["text", "json"])]
    log_format: String,
}

fn init_logging(format: &str, default_level: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_level));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if format == "json" {
        builder.json().init();
    } else {
        builder.init();
    }
}

async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    init_logging(&args.log_format, "info");
    let mut config = Config::new(args.database);
    config.drain_timeout = args.drain_timeout;
    config.lease_timeout = args.lease_timeout;
    config.heartbeat_interval = args.heartbeat_interval;
    config.auth_token = args.auth_token.filter(|t| !t.is_empty());
    config.tokens_file = args.tokens_file;
    config.max_payload_bytes = args.max_payload_bytes;
    config.retention = args.retention;
    if config.auth_token.is_none()
        && config.tokens_file.is_none()
        && !args.listen.ip().is_loopback()
    {
        tracing::warn!(listen = %args.listen, "no --auth-token set and the address is not loopback: anyone who can reach it can submit and run activities");
    }
    if let Some(addr) = args.metrics_listen {
        spool_server::metrics::serve(addr)
            .with_context(|| format!("cannot serve metrics on {addr}"))?;
        tracing::info!(%addr, "metrics at http://{addr}/metrics");
    }
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    let shutdown = async {
        shutdown_signal().await;
        tracing::info!("signal received: draining; a second signal exits at once");
        tokio::spawn(async {
            shutdown_signal().await;
            eprintln!("second signal: exiting now");
            std::process::exit(130);
        });
    };
    spool_server::run(config, listener, shutdown).await?;
    Ok(())
}

/// Completes at the first SIGTERM or SIGINT.
async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = ctrl_c => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = ctrl_c.await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}

async fn bench(args: BenchArgs, server: Option<String>, target: &Target) -> anyhow::Result<()> {
    // The in-process server's log would drown the progress line: warnings only,
    // unless RUST_LOG says otherwise.
    init_logging("text", "warn");
    let json = target.json;
    let options = spool_server::bench::Options {
        server: server.clone(),
        database: args.database,
        token: target.token.clone(),
        activities: args.activities,
        submit_concurrency: args.submit_concurrency,
        batch: args.batch,
        concurrency: args.concurrency,
        workers: args.workers,
        rate: args.rate,
        duration: args.duration,
        payload_bytes: args.payload_bytes,
        preload: args.preload,
        idle_workers: args.idle_workers,
        phases: args.phases,
        json,
    };
    let report = spool_server::bench::run(options).await?;
    if json {
        println!("{report}");
    } else {
        print!("{}", spool_server::bench::summary(&report));
    }
    Ok(())
}

async fn client_command(target: Target, command: Command) -> Result<i32, cli::Error> {
    let client = Client::connect(target).await?;
    match command {
        Command::Serve(_) | Command::Bench(_) => Ok(0),
        Command::Submit(a) => {
            let request = v1::SubmitRequest {
                namespace: a.namespace,
                workflow_id: a.workflow_id,
                activity_id: a.activity_id,
                activity_type: a.activity_type,
                input: cli::input(a.input.as_deref())?,
                delay: a.delay.map(spool_proto::duration::to_proto),
                retry_policy: a.max_attempts.map(|max_attempts| v1::RetryPolicy {
                    max_attempts,
                    ..Default::default()
                }),
                priority: a.priority,
                ..Default::default()
            };
            client.submit(request, a.wait.then_some(a.timeout)).await
        }
        Command::Get(key) => client.get(key.key()).await,
        Command::Wait { key, timeout } => client.wait(key.key(), timeout).await,
        Command::Cancel { key, reason } => client.cancel(key.key(), reason).await,
        Command::Retry(key) => client.retry(key.key()).await,
        Command::Ls {
            namespace,
            status,
            activity_type,
            limit,
        } => {
            let request = v1::ListRequest {
                namespace,
                status: status.map_or(0, |s| s as i32),
                activity_type: activity_type.unwrap_or_default(),
                ..Default::default()
            };
            client.list(request, limit).await
        }
        Command::Stats { namespace } => client.stats(namespace).await,
        Command::Workers { namespace } => client.workers(namespace).await,
        Command::Drain { timeout } => client.drain(timeout).await,
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    if let Command::Serve(args) = cli.command {
        return serve(args).await;
    }
    let target = Target {
        server: cli
            .server
            .clone()
            .unwrap_or_else(|| "http://127.0.0.1:7070".to_owned()),
        token: cli.token.filter(|t| !t.is_empty()),
        json: cli.json,
    };
    if let Command::Bench(args) = cli.command {
        return bench(args, cli.server, &target).await;
    }
    let code = match client_command(target, cli.command).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e}");
            1
        }
    };
    std::process::exit(code);
}
