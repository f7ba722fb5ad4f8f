//! The `spool` binary: `spool serve` runs the server; the other subcommands are
//! clients of a running server. Parsing only: the work is in the library.

use std::{net::SocketAddr, time::Duration};

use anyhow::Context;
use clap::{Parser, Subcommand};
use spool_server::Config;

#[derive(Parser)]
#[command(name = "spool", version, about = "Spool: a durable activity server")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the server.
    Serve(ServeArgs),
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
    /// The largest payload accepted, in bytes.
    #[arg(long, env = "SPOOL_MAX_PAYLOAD_BYTES", default_value_t = 4 * 1024 * 1024)]
    max_payload_bytes: usize,
    /// How long finished activities are kept.
    #[arg(long, env = "SPOOL_RETENTION", default_value = "7d", value_parser = duration)]
    retention: Duration,
    /// Log format: text or json (level from RUST_LOG, default info).
    #[arg(long, env = "SPOOL_LOG_FORMAT", default_value = "text", value_parser = ["text", "json"])]
    log_format: String,
}

fn init_logging(format: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    if format == "json" {
        builder.json().init();
    } else {
        builder.init();
    }
}

async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    init_logging(&args.log_format);
    let mut config = Config::new(args.database);
    config.drain_timeout = args.drain_timeout;
    config.lease_timeout = args.lease_timeout;
    config.heartbeat_interval = args.heartbeat_interval;
    config.auth_token = args.auth_token.filter(|t| !t.is_empty());
    config.max_payload_bytes = args.max_payload_bytes;
    config.retention = args.retention;
    if config.auth_token.is_none() && !args.listen.ip().is_loopback() {
        tracing::warn!(listen = %args.listen, "no --auth-token set and the address is not loopback: anyone who can reach it can submit and run activities");
    }
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    spool_server::run(config, listener, shutdown_signal()).await?;
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

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Serve(args) => serve(args).await,
    }
}
