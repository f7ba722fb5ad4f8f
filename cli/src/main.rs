//! The `spool` binary: `spool serve` runs the server; the other subcommands are
//! clients of a running server. Parsing only: the work is in the library.

use std::{net::SocketAddr, path::PathBuf, time::Duration};

use anyhow::Context;
use clap::{Parser, Subcommand};
use spool_proto::v1;
use spool_server::Config;

mod bench;
mod commands;
mod soak;

use commands::{Commands, Target};

#[derive(Parser)]
#[command(
    name = "spool",
    version,
    about = "Spool: a durable activity server",
    after_help = "Exit codes of the client commands: 0 done (a waited-for activity COMPLETED), \
1 the server refused or failed the call, 2 wrong usage or input, 3 the activity FAILED or \
was CANCELLED, 4 --timeout passed before it finished, 5 no such activity, 6 no Spool \
server answers at --server."
)]
struct Cli {
    /// The client flags, given before the command's name.
    #[command(
        flatten,
        next_help_heading = "Client options (for the client commands)"
    )]
    client: ClientArgs,
    #[command(subcommand)]
    command: Command,
}

/// How a client command reaches the server. Every client command takes these, after
/// its name or before it (`spool --server X stats`); after wins, then before, then
/// the environment.
#[derive(clap::Args, Clone, Default)]
struct ClientArgs {
    /// The server: host:port (plaintext), http://host:port, or https://host:port
    /// (TLS) [env: SPOOL_SERVER] [default: 127.0.0.1:7070]. For `bench`: benchmark
    /// this server instead of starting one.
    #[arg(long)]
    server: Option<String>,
    /// Bearer token, for a server started with --auth-token or --tokens-file
    /// [env: SPOOL_TOKEN].
    #[arg(long)]
    token: Option<String>,
    /// Print JSON instead of tables: one object per activity, the same shape in
    /// every command.
    #[arg(long)]
    json: bool,
    /// A CA certificate (PEM) to trust for an https:// server, besides the system's
    /// roots [env: SPOOL_CA_CERT].
    #[arg(long)]
    ca_cert: Option<PathBuf>,
    /// A client certificate (PEM) for a server that requires mutual TLS
    /// [env: SPOOL_CLIENT_CERT].
    #[arg(long)]
    client_cert: Option<PathBuf>,
    /// The key (PEM) of --client-cert [env: SPOOL_CLIENT_KEY].
    #[arg(long)]
    client_key: Option<PathBuf>,
}

impl ClientArgs {
    /// These flags, with what they leave unset taken from `before` (the flags given
    /// before the command's name), then from the environment.
    fn or(&self, before: &ClientArgs) -> ClientArgs {
        let env = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        let path = |name: &str| env(name).map(PathBuf::from);
        ClientArgs {
            server: self
                .server
                .clone()
                .or_else(|| before.server.clone())
                .or_else(|| env("SPOOL_SERVER")),
            token: self
                .token
                .clone()
                .or_else(|| before.token.clone())
                .or_else(|| env("SPOOL_TOKEN")),
            json: self.json || before.json,
            ca_cert: self
                .ca_cert
                .clone()
                .or_else(|| before.ca_cert.clone())
                .or_else(|| path("SPOOL_CA_CERT")),
            client_cert: self
                .client_cert
                .clone()
                .or_else(|| before.client_cert.clone())
                .or_else(|| path("SPOOL_CLIENT_CERT")),
            client_key: self
                .client_key
                .clone()
                .or_else(|| before.client_key.clone())
                .or_else(|| path("SPOOL_CLIENT_KEY")),
        }
    }
}

#[derive(Subcommand)]
enum Command {
    /// Run the server.
    Serve(Box<ServeArgs>),
    /// Submit an activity.
    Submit(SubmitArgs),
    /// Show an activity (with --history, each attempt: who ran it, when, how it
    /// ended).
    Get(GetArgs),
    /// Wait until an activity is finished (exit 3 if it FAILED or was CANCELLED, 4
    /// if --timeout passed first).
    Wait(WaitArgs),
    /// Cancel a scheduled or running activity, or with --all every one matching
    /// --type and --status.
    Cancel(CancelArgs),
    /// Run a FAILED or CANCELLED activity again, with a fresh attempt budget; with
    /// --all, every one matching --type and --status (default: failed).
    Retry(Selection),
    /// List activities, newest first.
    Ls(LsArgs),
    /// Count activities by status, and say whether the node is draining.
    Stats(NamespaceArgs),
    /// List connected workers.
    Workers(NamespaceArgs),
    /// Drain the node: stop dispatching, let running activities finish, hand back the
    /// rest. The node stays up, refusing workers, until `spool resume`.
    Drain(DrainArgs),
    /// End a drain: the node takes workers and dispatches again.
    Resume(ClientOnly),
    /// Rate limits of activity types, on every node sharing the database: a row
    /// held back waits, using no attempt and no worker slot.
    #[command(subcommand)]
    RateLimit(RateLimitCommand),
    /// Concurrency limits of activity types, on every node: of the activities of
    /// the type sharing a concurrency key (`submit --concurrency-key`), at most
    /// --max run at once.
    #[command(subcommand)]
    ConcurrencyLimit(ConcurrencyLimitCommand),
    /// Weights of fairness keys, on every node: activities of the key
    /// (`submit --fairness-key`) submitted from then on are placed with the key's
    /// weight, whatever --fairness-weight they are given.
    #[command(subcommand)]
    FairnessWeight(FairnessWeightCommand),
    /// Print a shell completion script: `spool completions bash >
    /// /etc/bash_completion.d/spool` (or zsh, fish, elvish, powershell).
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
    /// Measure throughput and latency (starts a server unless --server is given).
    Bench(Box<BenchArgs>),
    /// Load under random faults, then check nothing was lost or done twice.
    ///
    /// Nodes and workers run as processes; a seeded injector kills, stops and
    /// restarts them, cuts the network, restarts PostgreSQL and fills the disk.
    /// Exit 1 if any acknowledged activity was not completed exactly once.
    Soak(SoakArgs),
    /// A soak worker process (started by `spool soak`).
    #[command(hide = true)]
    SoakWorker {
        #[arg(long)]
        server: String,
        #[arg(long)]
        history: std::path::PathBuf,
        #[arg(long)]
        identity: String,
        #[arg(long, default_value_t = 16)]
        concurrency: u32,
    },
}

#[derive(clap::Subcommand)]
enum RateLimitCommand {
    /// Set (or replace) a type's limit: at most --limit rows each --per; or with
    /// --key, one concurrency key's.
    Set(RateLimitSetArgs),
    /// List the limits, with what each has available now.
    List(NamespaceArgs),
    /// Remove a type's limit, or with --key that key's.
    Delete(LimitDeleteArgs),
}

#[derive(clap::Subcommand)]
enum ConcurrencyLimitCommand {
    /// Set (or replace) a type's limit: at most --max running per key; or with
    /// --key, one key's own --max and --weight.
    Set(ConcurrencyLimitSetArgs),
    /// List the limits, the types' then their keys', with their use now.
    List(NamespaceArgs),
    /// Remove a type's limit, or with --key what was set for that key.
    Delete(LimitDeleteArgs),
}

#[derive(clap::Subcommand)]
enum FairnessWeightCommand {
    /// Set (or replace) one fairness key's weight: its share of claims against
    /// the type's other keys waiting, 1 to 1000.
    Set(FairnessWeightSetArgs),
    /// List the weights set.
    List(NamespaceArgs),
    /// Remove a key's weight: its activities are placed by their own weights again.
    Delete(FairnessWeightDeleteArgs),
}

#[derive(clap::Args)]
struct FairnessWeightSetArgs {
    /// The activity type.
    activity_type: String,
    /// The fairness key (a tenant, say).
    #[arg(long)]
    key: String,
    /// 1 to 1000: a key of weight 3 is served three times as often as one of 1.
    #[arg(long)]
    weight: u32,
    /// The namespace (default: "default").
    #[arg(long, env = "SPOOL_NAMESPACE", default_value = "")]
    namespace: String,
    #[command(flatten)]
    client: ClientArgs,
}

#[derive(clap::Args)]
struct FairnessWeightDeleteArgs {
    /// The activity type.
    activity_type: String,
    /// The fairness key.
    #[arg(long)]
    key: String,
    /// The namespace (default: "default").
    #[arg(long, env = "SPOOL_NAMESPACE", default_value = "")]
    namespace: String,
    #[command(flatten)]
    client: ClientArgs,
}

#[derive(clap::Args)]
struct ConcurrencyLimitSetArgs {
    /// The activity type.
    activity_type: String,
    /// Activities per concurrency key running at once (with --key, for that key;
    /// left out, the type's).
    #[arg(long)]
    max: Option<u32>,
    /// Set this one key's own limit and weight, beside the type's.
    #[arg(long)]
    key: Option<String>,
    /// With --key: its share of claims against the type's other keys waiting,
    /// 1 to 1000 (a key of weight 3 is served three times as often as one of 1).
    #[arg(long, requires = "key")]
    weight: Option<u32>,
    /// What happens beyond --max: queue (they wait), cancel-newest (new ones are
    /// cancelled), cancel-in-progress (the oldest are cancelled for new ones).
    #[arg(long, default_value = "queue", value_parser = ["queue", "cancel-newest", "cancel-in-progress"])]
    strategy: String,
    /// The namespace (default: "default").
    #[arg(long, env = "SPOOL_NAMESPACE", default_value = "")]
    namespace: String,
    #[command(flatten)]
    client: ClientArgs,
}

#[derive(clap::Args)]
struct RateLimitSetArgs {
    /// The activity type.
    activity_type: String,
    /// Rows per period.
    #[arg(long)]
    limit: u32,
    /// The period (whole milliseconds, up to 1h).
    #[arg(long, default_value = "1s", value_parser = duration)]
    per: Duration,
    /// Rows at once after a quiet spell (default: --limit).
    #[arg(long, default_value_t = 0)]
    burst: u32,
    /// Limit this one concurrency key's activities of the type, beside the
    /// type's own limit.
    #[arg(long)]
    key: Option<String>,
    /// The namespace (default: "default").
    #[arg(long, env = "SPOOL_NAMESPACE", default_value = "")]
    namespace: String,
    #[command(flatten)]
    client: ClientArgs,
}

#[derive(clap::Args)]
struct LimitDeleteArgs {
    /// The activity type.
    activity_type: String,
    /// Only this concurrency key's limit.
    #[arg(long)]
    key: Option<String>,
    /// The namespace (default: "default").
    #[arg(long, env = "SPOOL_NAMESPACE", default_value = "")]
    namespace: String,
    #[command(flatten)]
    client: ClientArgs,
}

/// Only the connection flags.
#[derive(clap::Args)]
struct ClientOnly {
    #[command(flatten)]
    client: ClientArgs,
}

#[derive(clap::Args)]
struct NamespaceArgs {
    /// The namespace (default: "default"; for `workers` and the limits' and
    /// weights' `list`, every namespace).
    #[arg(long, env = "SPOOL_NAMESPACE", default_value = "")]
    namespace: String,
    #[command(flatten)]
    client: ClientArgs,
}

#[derive(clap::Args)]
struct WaitArgs {
    #[command(flatten)]
    key: KeyArgs,
    /// Give up after this long (e.g. 30s, 5m) and show the state so far, exit 4.
    #[arg(long, value_parser = duration)]
    timeout: Option<Duration>,
}

#[derive(clap::Args)]
struct CancelArgs {
    #[command(flatten)]
    selection: Selection,
    /// Why, shown as the activity's last error.
    #[arg(long, default_value = "")]
    reason: String,
}

#[derive(clap::Args)]
struct LsArgs {
    /// The namespace (default: "default").
    #[arg(long, env = "SPOOL_NAMESPACE", default_value = "")]
    namespace: String,
    /// Only this status: scheduled, running, completed, failed or cancelled.
    #[arg(long, value_parser = commands::parse_status)]
    status: Option<v1::ActivityStatus>,
    /// Only this activity type.
    #[arg(long = "type")]
    activity_type: Option<String>,
    /// The most activities to show.
    #[arg(long, default_value_t = 50, conflicts_with = "all")]
    limit: usize,
    /// Show every matching activity.
    #[arg(long)]
    all: bool,
    /// Start after the page a previous `ls` ended with (it prints the token to use).
    #[arg(long, default_value = "")]
    page_token: String,
    /// Oldest first instead of newest first.
    #[arg(long)]
    oldest_first: bool,
    #[command(flatten)]
    client: ClientArgs,
}

#[derive(clap::Args)]
struct DrainArgs {
    /// How long running activities may take to finish before they are handed back
    /// (default: the server's --drain-timeout).
    #[arg(long, value_parser = duration)]
    timeout: Option<Duration>,
    #[command(flatten)]
    client: ClientArgs,
}

#[derive(clap::Args)]
struct BenchArgs {
    #[command(flatten)]
    client: ClientArgs,
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
    phases: Vec<bench::Phase>,
    /// Start this many `spool serve` processes on --database (PostgreSQL when
    /// more than one) instead of a server in this process; callers and workers
    /// are spread over them, and each phase reports each process's CPU.
    #[arg(long, default_value_t = 0, conflicts_with = "server")]
    nodes: usize,
    /// The started servers' --retention: short, with a long latency phase, to
    /// watch the queue table level off on PostgreSQL (default: the server's).
    #[arg(long, value_parser = duration, conflicts_with = "server")]
    retention: Option<Duration>,
    /// Spread the activities over this many concurrency keys, round robin.
    #[arg(long, default_value_t = 0)]
    keys: usize,
    /// With --keys: a concurrency limit of this many running per key, on the
    /// measured types.
    #[arg(long, requires = "keys")]
    key_limit: Option<u32>,
    /// A rate limit of this many activities a second (burst as many), on the
    /// measured types.
    #[arg(long)]
    rate_limit: Option<u32>,
    /// Before the latency phase, store this many rows of one concurrency key of
    /// its type; the phase's own rows come with another key, and their pickup is
    /// measured beside that backlog (fairness between keys).
    #[arg(long, default_value_t = 0)]
    backlog: usize,
    /// The keys of --keys and --backlog are fairness keys (`submit
    /// --fairness-key`), not concurrency keys.
    #[arg(long, conflicts_with = "key_limit")]
    fairness_keys: bool,
}

#[derive(clap::Args)]
struct SoakArgs {
    /// Run N nodes sharing a fresh schema on this PostgreSQL server (default: one
    /// node on SQLite).
    #[arg(long, env = "SPOOL_SOAK_POSTGRES_URL")]
    postgres: Option<String>,
    /// Nodes (PostgreSQL only).
    #[arg(long, default_value_t = 2)]
    nodes: usize,
    /// How long faults are injected and activities submitted.
    #[arg(long, default_value = "60s", value_parser = duration)]
    duration: Duration,
    /// Seeds the fault schedule and the workload (default: random, printed).
    #[arg(long)]
    seed: Option<u64>,
    /// Submits per second.
    #[arg(long, default_value_t = 100)]
    rate: u32,
    /// Worker processes.
    #[arg(long, default_value_t = 3)]
    workers: usize,
    /// Concurrency of each worker.
    #[arg(long, default_value_t = 16)]
    concurrency: u32,
    /// Fault kinds to pick from (default: all the store supports): node-kill,
    /// node-term, node-pause, worker-kill, worker-stop, network-cut, pg-restart,
    /// disk-full.
    #[arg(long, value_delimiter = ',', value_parser = soak::Fault::parse)]
    faults: Vec<soak::Fault>,
    /// Shortest time between faults.
    #[arg(long, default_value = "2s", value_parser = duration)]
    fault_min: Duration,
    /// Longest time between faults.
    #[arg(long, default_value = "6s", value_parser = duration)]
    fault_max: Duration,
    /// Run directory for logs, histories and report.json (default: a fresh one).
    #[arg(long)]
    dir: Option<std::path::PathBuf>,
    /// Deliberate breakages for the nodes (a build with the breakages feature):
    /// fencing, release-counted, ack-before-commit.
    #[arg(long = "break", value_delimiter = ',')]
    breakages: Vec<String>,
    /// Size of the filesystem for the SQLite file, in MiB (disk-full faults).
    #[arg(long, default_value_t = 1024)]
    disk_mb: u64,
    /// Command that restarts PostgreSQL (pg-restart faults).
    #[arg(
        long,
        default_value = "pg_ctlcluster --skip-systemctl-redirect 15 main restart"
    )]
    pg_restart: String,
    /// How long to wait after the faults for every activity to finish.
    #[arg(long, default_value = "120s", value_parser = duration)]
    settle: Duration,
    /// The nodes' keep-alive interval (a worker silent for three is evicted).
    #[arg(long, default_value = "1s", value_parser = duration)]
    heartbeat_interval: Duration,
    /// The spool binary nodes and workers run (default: this one).
    #[arg(long)]
    binary: Option<std::path::PathBuf>,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args)]
struct KeyArgs {
    /// The activity: NAMESPACE/WORKFLOW_ID/ACTIVITY_ID as `spool` prints it, or
    /// WORKFLOW_ID/ACTIVITY_ID, or the workflow id alone followed by ACTIVITY_ID (for
    /// ids holding a '/').
    #[arg(value_name = "KEY")]
    key: String,
    /// The activity id, when KEY is the workflow id alone.
    activity_id: Option<String>,
    /// The namespace, when KEY does not name one (default: SPOOL_NAMESPACE, else
    /// "default").
    #[arg(long)]
    namespace: Option<String>,
    #[command(flatten)]
    client: ClientArgs,
}

impl KeyArgs {
    fn key(&self) -> Result<v1::ActivityKey, commands::Error> {
        Self::resolve(
            &self.key,
            self.activity_id.as_deref(),
            self.namespace.as_deref(),
        )
    }

    fn resolve(
        key: &str,
        activity_id: Option<&str>,
        namespace: Option<&str>,
    ) -> Result<v1::ActivityKey, commands::Error> {
        let mut key = commands::parse_key(key, activity_id, namespace)?;
        // The environment's namespace only where neither the key nor a flag names one.
        if key.namespace.is_empty()
            && let Ok(namespace) = std::env::var("SPOOL_NAMESPACE")
        {
            key.namespace = namespace;
        }
        Ok(key)
    }
}

#[derive(clap::Args)]
struct GetArgs {
    #[command(flatten)]
    key: KeyArgs,
    /// Also show each ended attempt: outcome, times, worker and node, error.
    #[arg(long)]
    history: bool,
}

/// One activity by key, or with --all every activity matching the filters.
#[derive(clap::Args)]
struct Selection {
    /// The activity, as for `get`; leave it out and pass --all to act on every
    /// activity matching --type and --status.
    #[arg(value_name = "KEY", required_unless_present = "all")]
    key: Option<String>,
    /// The activity id, when KEY is the workflow id alone.
    activity_id: Option<String>,
    /// The namespace (default: SPOOL_NAMESPACE, else "default").
    #[arg(long)]
    namespace: Option<String>,
    /// Act on every activity matching --type and --status, not on one key.
    #[arg(long, conflicts_with = "key")]
    all: bool,
    /// With --all: only this activity type.
    #[arg(long = "type", requires = "all")]
    activity_type: Option<String>,
    /// With --all: only this status (retry: failed by default; cancel: scheduled
    /// and running).
    #[arg(long, requires = "all", value_parser = commands::parse_status)]
    status: Option<v1::ActivityStatus>,
    /// With --all: list the activities it would act on, and change nothing.
    #[arg(long, requires = "all")]
    dry_run: bool,
    #[command(flatten)]
    client: ClientArgs,
}

impl Selection {
    fn key(&self) -> Result<v1::ActivityKey, commands::Error> {
        KeyArgs::resolve(
            self.key.as_deref().unwrap_or_default(),
            self.activity_id.as_deref(),
            self.namespace.as_deref(),
        )
    }

    /// The lists --all acts on: one per status.
    fn lists(&self, default_statuses: &[v1::ActivityStatus]) -> Vec<v1::ListRequest> {
        let namespace = self
            .namespace
            .clone()
            .or_else(|| std::env::var("SPOOL_NAMESPACE").ok())
            .unwrap_or_default();
        let statuses = match self.status {
            Some(s) => vec![s],
            None => default_statuses.to_vec(),
        };
        statuses
            .into_iter()
            .map(|status| v1::ListRequest {
                namespace: namespace.clone(),
                status: status as i32,
                activity_type: self.activity_type.clone().unwrap_or_default(),
                page_size: 500,
                ..Default::default()
            })
            .collect()
    }

    /// Runs `action` on the key, or on every match with --all.
    async fn run(
        &self,
        cli: Commands,
        action: commands::Bulk,
        default_statuses: &[v1::ActivityStatus],
    ) -> Result<i32, commands::Error> {
        if !self.all {
            let key = self.key()?;
            return match action {
                commands::Bulk::Retry => cli.retry(key).await,
                commands::Bulk::Cancel { reason } => cli.cancel(key, reason).await,
            };
        }
        let mut code = commands::exit::OK;
        for list in self.lists(default_statuses) {
            let reason = match &action {
                commands::Bulk::Retry => commands::Bulk::Retry,
                commands::Bulk::Cancel { reason } => commands::Bulk::Cancel {
                    reason: reason.clone(),
                },
            };
            code = code.max(cli.bulk(list, reason, self.dry_run).await?);
        }
        Ok(code)
    }
}

#[derive(clap::Args)]
struct SubmitArgs {
    /// The activity type a worker registered.
    activity_type: String,
    /// Input as inline JSON, or @FILE for a file's contents.
    #[arg(long, default_value = "{}")]
    input: String,
    /// The workflow id (default: a new UUIDv7).
    #[arg(long, default_value = "")]
    workflow_id: String,
    /// The activity id (default: a new UUIDv7).
    #[arg(long, default_value = "")]
    activity_id: String,
    /// The namespace (default: "default").
    #[arg(long, env = "SPOOL_NAMESPACE", default_value = "")]
    namespace: String,
    /// Run no earlier than this from now (e.g. 30s, 5m).
    #[arg(long, value_parser = duration)]
    delay: Option<Duration>,
    /// Attempts before the activity is FAILED for good, at least 1 (default: the
    /// server's, 10).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    max_attempts: Option<u32>,
    /// Higher runs first among due activities of its type (may be negative).
    #[arg(long, default_value_t = 0, allow_hyphen_values = true)]
    priority: i32,
    /// Activities of the type sharing this key run at most the type's concurrency
    /// limit at once (`spool concurrency-limit set`).
    #[arg(long, default_value = "")]
    concurrency_key: String,
    /// Activities of the type are served fairly over these keys (a tenant, say):
    /// one key's backlog does not delay another key's activities.
    #[arg(long, default_value = "")]
    fairness_key: String,
    /// This activity's weight within its fairness key, 1 to 1,000: a key whose
    /// activities weigh 3 is served three times as often as one whose weigh 1.
    #[arg(long, requires = "fairness_key", value_parser = clap::value_parser!(u32).range(1..=1000))]
    fairness_weight: Option<u32>,
    /// Wait for the outcome (exit 3 if it FAILED or was CANCELLED).
    #[arg(long)]
    wait: bool,
    /// With --wait: give up after this long and exit 4.
    #[arg(long, value_parser = duration, requires = "wait")]
    timeout: Option<Duration>,
    #[command(flatten)]
    client: ClientArgs,
}

fn duration(s: &str) -> Result<Duration, String> {
    spool_proto::duration::parse(s).map_err(|e| e.to_string())
}

#[derive(clap::Args)]
struct ServeArgs {
    /// Address to listen on.
    #[arg(long, env = "SPOOL_LISTEN", default_value = "127.0.0.1:7070")]
    listen: SocketAddr,
    /// Database URL: sqlite://PATH (one file, created if missing) or
    /// postgres://USER:PASSWORD@HOST/DB (several nodes may share it).
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
    /// The most (namespace, activity type) pairs labelled in metrics; later ones
    /// are counted as `_other`.
    #[arg(long, env = "SPOOL_METRICS_MAX_TYPES", default_value_t = spool_server::metrics::DEFAULT_MAX_TYPES)]
    metrics_max_types: usize,
    /// Serve the web dashboard at http://ADDR/ (off unless set). It takes the same
    /// tokens as the API.
    #[arg(long, env = "SPOOL_UI_LISTEN")]
    ui_listen: Option<SocketAddr>,
    /// The dashboard shows everything and changes nothing, whatever the token.
    #[arg(long, env = "SPOOL_UI_READ_ONLY")]
    ui_read_only: bool,
    /// This server's name in attempt histories and worker lists (default: the
    /// host name and the port; nodes sharing a database need different names).
    #[arg(long, env = "SPOOL_NODE_NAME")]
    node_name: Option<String>,
    /// How long a worker whose connection dropped may reconnect and resume its
    /// session, keeping its running attempts (default: 5s, or half the lease if
    /// shorter; 0s: attempts are lost at once, as WORKER_LOST).
    #[arg(long, env = "SPOOL_RESUME_GRACE", value_parser = duration)]
    resume_grace: Option<Duration>,
    /// How much waiting outweighs one level of priority: with 10s, a row waits
    /// at most 10s per level of difference before rows of higher priority due
    /// after it stop overtaking it (0s: strict priority, highest first). Stored
    /// in the database, for every node sharing it; without the flag a node keeps
    /// what is stored (strict, on a new database).
    #[arg(long, env = "SPOOL_PRIORITY_AGING", value_parser = duration)]
    priority_aging: Option<Duration>,
    /// How long finished activities are kept.
    #[arg(long, env = "SPOOL_RETENTION", default_value = "7d", value_parser = duration)]
    retention: Duration,
    /// Log format: text or json (level from RUST_LOG, default info).
    #[arg(long, env = "SPOOL_LOG_FORMAT", default_value = "text", value_parser = ["text", "json"])]
    log_format: String,
    /// TLS certificate chain (PEM); with --tls-key, the server speaks TLS only.
    #[arg(long, env = "SPOOL_TLS_CERT", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// TLS private key (PEM) for --tls-cert.
    #[arg(long, env = "SPOOL_TLS_KEY", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// CA (PEM) whose certificates clients must present (mutual TLS).
    #[arg(long, env = "SPOOL_TLS_CLIENT_CA", requires = "tls_cert")]
    tls_client_ca: Option<PathBuf>,
    #[command(flatten)]
    limits: LimitArgs,
    /// Export the server's spans over OTLP/gRPC to this collector (for example
    /// http://127.0.0.1:4317); logs still go to stderr.
    #[cfg(feature = "otel")]
    #[arg(long, env = "OTEL_EXPORTER_OTLP_ENDPOINT")]
    otlp_endpoint: Option<String>,
}

/// What one client may take of the server (see docs/SECURITY.md).
#[derive(clap::Args)]
struct LimitArgs {
    /// Open connections; more wait until one closes.
    #[arg(long, env = "SPOOL_MAX_CONNECTIONS", default_value_t = 4096)]
    max_connections: usize,
    /// Open connections from one IP address; more are closed at once (raise it
    /// behind a proxy, whose connections all come from its address).
    #[arg(long, env = "SPOOL_MAX_CONNECTIONS_PER_PEER", default_value_t = 1024)]
    max_connections_per_peer: usize,
    /// How long a connection may stay open before its first authenticated
    /// request (health checks do not count).
    #[arg(long, env = "SPOOL_FIRST_REQUEST_TIMEOUT", default_value = "30s", value_parser = duration)]
    first_request_timeout: Duration,
    /// HTTP/2 streams per connection (SETTINGS_MAX_CONCURRENT_STREAMS).
    #[arg(long, env = "SPOOL_MAX_CONCURRENT_STREAMS", default_value_t = 1024)]
    max_concurrent_streams: u32,
    /// Streams a client may reset before the server accepts them, before GOAWAY.
    #[arg(long, env = "SPOOL_MAX_PENDING_RESET_STREAMS", default_value_t = 20)]
    max_pending_reset_streams: usize,
    /// Streams the server may reset for protocol errors on a connection, before GOAWAY.
    #[arg(long, env = "SPOOL_MAX_LOCAL_RESET_STREAMS", default_value_t = 1024)]
    max_local_reset_streams: usize,
    /// The largest request header list (metadata), in bytes.
    #[arg(long, env = "SPOOL_MAX_HEADER_LIST_BYTES", default_value_t = 16 * 1024)]
    max_header_list_bytes: u32,
    /// Worker sessions one token may hold open (one caller, without tokens).
    #[arg(long, env = "SPOOL_MAX_SESSIONS_PER_TOKEN", default_value_t = 4096)]
    max_sessions_per_token: usize,
    /// The most slots a worker session is granted (its Hello may ask for fewer).
    #[arg(long, env = "SPOOL_MAX_WORKER_CONCURRENCY", default_value_t = spool_server::api::validate::DEFAULT_WORKER_CONCURRENCY)]
    max_worker_concurrency: u32,
    /// Open health Watch and reflection streams, which need no token.
    #[arg(long, env = "SPOOL_MAX_UNAUTHENTICATED_STREAMS", default_value_t = 64)]
    max_unauthenticated_streams: usize,
    /// The longest a unary call (but Wait and Drain) may take.
    #[arg(long, env = "SPOOL_REQUEST_TIMEOUT", default_value = "60s", value_parser = duration)]
    request_timeout: Duration,
    /// The longest one Wait parks before answering with the current state.
    #[arg(long, env = "SPOOL_MAX_WAIT", default_value = "1h", value_parser = duration)]
    max_wait: Duration,
    /// Wait calls one token may have parked at once (one caller, without tokens).
    #[arg(long, env = "SPOOL_MAX_WAITS_PER_TOKEN", default_value_t = 10_000)]
    max_waits_per_token: usize,
    /// Wait calls parked at once on this node.
    #[arg(long, env = "SPOOL_MAX_WAITS", default_value_t = 100_000)]
    max_waits: usize,
    /// HTTP/2 keep-alive PING interval.
    #[arg(long, env = "SPOOL_KEEPALIVE_INTERVAL", default_value = "10s", value_parser = duration)]
    keepalive_interval: Duration,
    /// A peer that does not answer a PING this long is disconnected.
    #[arg(long, env = "SPOOL_KEEPALIVE_TIMEOUT", default_value = "10s", value_parser = duration)]
    keepalive_timeout: Duration,
}

impl LimitArgs {
    fn into_limits(self) -> spool_server::config::Limits {
        spool_server::config::Limits {
            max_connections: self.max_connections,
            max_connections_per_peer: self.max_connections_per_peer,
            first_request_timeout: self.first_request_timeout,
            max_concurrent_streams: self.max_concurrent_streams,
            max_pending_accept_reset_streams: self.max_pending_reset_streams,
            max_local_error_reset_streams: self.max_local_reset_streams,
            max_header_list_bytes: self.max_header_list_bytes,
            max_sessions_per_token: self.max_sessions_per_token,
            max_worker_concurrency: self.max_worker_concurrency,
            max_open_streams_unauthenticated: self.max_unauthenticated_streams,
            request_timeout: self.request_timeout,
            max_wait: self.max_wait,
            max_waits_per_token: self.max_waits_per_token,
            max_waits: self.max_waits,
            keepalive_interval: self.keepalive_interval,
            keepalive_timeout: self.keepalive_timeout,
        }
    }
}

fn init_logging(format: &str, default_level: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_level));
    use std::io::IsTerminal;
    // Colours only for a person at a terminal, never into a log file.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    if format == "json" {
        builder.json().init();
    } else {
        builder.init();
    }
}

async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    // Kept for the life of the server: dropping it flushes the last spans.
    #[cfg(feature = "otel")]
    let _otel = match &args.otlp_endpoint {
        Some(endpoint) => Some(spool_proto::otel::install("spool-server", endpoint)?),
        None => {
            init_logging(&args.log_format, "info");
            None
        }
    };
    #[cfg(not(feature = "otel"))]
    init_logging(&args.log_format, "info");
    let mut config = Config::new(args.database);
    config.drain_timeout = args.drain_timeout;
    config.lease_timeout = args.lease_timeout;
    config.heartbeat_interval = args.heartbeat_interval;
    config.auth_token = args.auth_token.filter(|t| !t.is_empty());
    config.tokens_file = args.tokens_file;
    config.max_payload_bytes = args.max_payload_bytes;
    config.retention = args.retention;
    config.limits = args.limits.into_limits();
    config.ui_listen = args.ui_listen;
    config.ui_read_only = args.ui_read_only;
    config.resume_grace = args.resume_grace;
    config.priority_aging = args.priority_aging;
    config.node_name = args.node_name.filter(|n| !n.is_empty());
    config.tls = match (args.tls_cert, args.tls_key) {
        (Some(cert), Some(key)) => Some(spool_server::config::Tls {
            cert,
            key,
            client_ca: args.tls_client_ca,
        }),
        _ => None,
    };
    // Refuse what cannot work before binding anything, naming the flag.
    config.check()?;
    if config.auth_token.is_none()
        && config.tokens_file.is_none()
        && !args.listen.ip().is_loopback()
    {
        tracing::warn!(listen = %args.listen, "no --auth-token set and the address is not loopback: anyone who can reach it can submit and run activities");
    }
    if config.tls.is_none()
        && (config.auth_token.is_some() || config.tokens_file.is_some())
        && !args.listen.ip().is_loopback()
    {
        tracing::warn!(listen = %args.listen, "tokens and payloads cross the network in clear text: set --tls-cert and --tls-key");
    }
    if let Some(addr) = args.metrics_listen {
        spool_server::metrics::serve(addr, args.metrics_max_types)
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

/// The client TLS files the flags name, read now so a bad path fails before any call.
fn client_tls(cli: &ClientArgs) -> anyhow::Result<spool_proto::endpoint::ClientTls> {
    let read = |flag: &str, path: &PathBuf| {
        std::fs::read(path).with_context(|| format!("{flag} {}", path.display()))
    };
    Ok(spool_proto::endpoint::ClientTls {
        ca_pem: cli
            .ca_cert
            .as_ref()
            .map(|p| read("--ca-cert", p))
            .transpose()?,
        identity_pem: match (&cli.client_cert, &cli.client_key) {
            (Some(cert), Some(key)) => {
                Some((read("--client-cert", cert)?, read("--client-key", key)?))
            }
            _ => None,
        },
        domain: None,
    })
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

async fn bench(args: BenchArgs) -> anyhow::Result<()> {
    // The in-process server's log would drown the progress line: warnings only,
    // unless RUST_LOG says otherwise.
    init_logging("text", "warn");
    let server = args.client.server.clone();
    let target = target(&args.client)?;
    let json = target.json;
    let options = bench::Options {
        server: server.clone(),
        database: args.database,
        token: target.token.clone(),
        tls: target.tls.clone(),
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
        nodes: args.nodes,
        retention: args.retention,
        keys: args.keys,
        key_limit: args.key_limit,
        rate_limit: args.rate_limit,
        backlog: args.backlog,
        fairness_keys: args.fairness_keys,
    };
    let report = bench::run(options).await?;
    if json {
        println!("{report}");
    } else {
        print!("{}", bench::summary(&report));
    }
    Ok(())
}

async fn soak(args: SoakArgs) -> anyhow::Result<i32> {
    let json = args.json;
    let binary = match args.binary {
        Some(b) => b,
        None => std::env::current_exe()?,
    };
    let seed = args.seed.unwrap_or_else(rand::random);
    let options = soak::Options {
        binary,
        postgres: args.postgres,
        nodes: args.nodes,
        duration: args.duration,
        seed,
        rate: args.rate,
        workers: args.workers,
        concurrency: args.concurrency,
        faults: args.faults,
        fault_every: (args.fault_min, args.fault_max),
        dir: args.dir,
        breakages: args.breakages,
        disk_mb: args.disk_mb,
        pg_restart: args.pg_restart,
        settle: args.settle,
        heartbeat_interval: args.heartbeat_interval,
    };
    let report = soak::run(options).await?;
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", report.summary());
    }
    Ok(if report.passed { 0 } else { 1 })
}

/// Where and how a client command reaches the server (`client` already merged).
fn target(client: &ClientArgs) -> anyhow::Result<Target> {
    if client.client_cert.is_some() != client.client_key.is_some() {
        anyhow::bail!("--client-cert and --client-key go together: give both or neither");
    }
    Ok(Target {
        server: client
            .server
            .clone()
            .unwrap_or_else(|| "127.0.0.1:7070".to_owned()),
        token: client.token.clone().filter(|t| !t.is_empty()),
        json: client.json,
        tls: client_tls(client)?,
    })
}

/// Runs a client command; its exit code.
async fn client_command(before: &ClientArgs, command: Command) -> Result<i32, commands::Error> {
    let connect = |client: &ClientArgs| {
        let target =
            target(&client.or(before)).map_err(|e| commands::Error::Usage(format!("{e:#}")));
        async move { Commands::connect(target?).await }
    };
    match command {
        Command::Serve(_)
        | Command::Bench(_)
        | Command::Soak(_)
        | Command::SoakWorker { .. }
        | Command::Completions { .. } => Ok(commands::exit::OK),
        Command::Submit(a) => {
            let request = v1::SubmitRequest {
                namespace: a.namespace,
                workflow_id: a.workflow_id,
                activity_id: a.activity_id,
                activity_type: a.activity_type,
                input: Some(commands::input(&a.input)?),
                delay: a.delay.map(spool_proto::duration::to_proto),
                retry_policy: a.max_attempts.map(|max_attempts| v1::RetryPolicy {
                    max_attempts,
                    ..Default::default()
                }),
                priority: a.priority,
                concurrency_key: a.concurrency_key,
                fairness_key: a.fairness_key,
                fairness_weight: a.fairness_weight.unwrap_or_default(),
                ..Default::default()
            };
            let wait = a.wait.then_some(a.timeout);
            connect(&a.client).await?.submit(request, wait).await
        }
        Command::Get(g) => {
            let key = g.key.key()?;
            connect(&g.key.client).await?.get(key, g.history).await
        }
        Command::Wait(w) => {
            let key = w.key.key()?;
            connect(&w.key.client).await?.wait(key, w.timeout).await
        }
        Command::Cancel(c) => {
            let running = [v1::ActivityStatus::Scheduled, v1::ActivityStatus::Running];
            let action = commands::Bulk::Cancel { reason: c.reason };
            let cli = connect(&c.selection.client).await?;
            c.selection.run(cli, action, &running).await
        }
        Command::Retry(r) => {
            let cli = connect(&r.client).await?;
            r.run(cli, commands::Bulk::Retry, &[v1::ActivityStatus::Failed])
                .await
        }
        Command::Ls(ls) => {
            let request = v1::ListRequest {
                namespace: ls.namespace,
                status: ls.status.map_or(0, |s| s as i32),
                activity_type: ls.activity_type.unwrap_or_default(),
                page_token: ls.page_token,
                newest_first: !ls.oldest_first,
                ..Default::default()
            };
            let limit = if ls.all { usize::MAX } else { ls.limit };
            connect(&ls.client).await?.list(request, limit).await
        }
        Command::Stats(n) => connect(&n.client).await?.stats(n.namespace).await,
        Command::Workers(n) => connect(&n.client).await?.workers(n.namespace).await,
        Command::Drain(d) => connect(&d.client).await?.drain(d.timeout).await,
        Command::Resume(r) => connect(&r.client).await?.resume().await,
        Command::RateLimit(RateLimitCommand::Set(a)) => {
            let limit = v1::RateLimit {
                namespace: a.namespace,
                activity_type: a.activity_type,
                limit: a.limit,
                period: Some(spool_proto::duration::to_proto(a.per)),
                burst: a.burst,
                concurrency_key: a.key.unwrap_or_default(),
                available: 0,
            };
            connect(&a.client).await?.set_rate_limit(limit).await
        }
        Command::ConcurrencyLimit(ConcurrencyLimitCommand::Set(a)) => {
            let limit = v1::ConcurrencyLimit {
                namespace: a.namespace,
                activity_type: a.activity_type,
                max_running: a.max.unwrap_or_default(),
                concurrency_key: a.key.unwrap_or_default(),
                weight: a.weight.unwrap_or_default(),
                strategy: match a.strategy.as_str() {
                    "cancel-newest" => v1::ConcurrencyStrategy::CancelNewest,
                    "cancel-in-progress" => v1::ConcurrencyStrategy::CancelInProgress,
                    _ => v1::ConcurrencyStrategy::Queue,
                } as i32,
                ..Default::default()
            };
            connect(&a.client).await?.set_concurrency_limit(limit).await
        }
        Command::ConcurrencyLimit(ConcurrencyLimitCommand::List(n)) => {
            connect(&n.client)
                .await?
                .concurrency_limits(n.namespace)
                .await
        }
        Command::ConcurrencyLimit(ConcurrencyLimitCommand::Delete(a)) => {
            connect(&a.client)
                .await?
                .delete_limit(
                    commands::LimitKind::Concurrency,
                    a.namespace,
                    a.activity_type,
                    a.key,
                )
                .await
        }
        Command::FairnessWeight(FairnessWeightCommand::Set(a)) => {
            let weight = v1::FairnessWeight {
                namespace: a.namespace,
                activity_type: a.activity_type,
                fairness_key: a.key,
                weight: a.weight,
                ..Default::default()
            };
            connect(&a.client).await?.set_fairness_weight(weight).await
        }
        Command::FairnessWeight(FairnessWeightCommand::List(n)) => {
            connect(&n.client)
                .await?
                .fairness_weights(n.namespace)
                .await
        }
        Command::FairnessWeight(FairnessWeightCommand::Delete(a)) => {
            connect(&a.client)
                .await?
                .delete_fairness_weight(a.namespace, a.activity_type, a.key)
                .await
        }
        Command::RateLimit(RateLimitCommand::List(n)) => {
            connect(&n.client).await?.rate_limits(n.namespace).await
        }
        Command::RateLimit(RateLimitCommand::Delete(a)) => {
            connect(&a.client)
                .await?
                .delete_limit(
                    commands::LimitKind::Rate,
                    a.namespace,
                    a.activity_type,
                    a.key,
                )
                .await
        }
    }
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let code = runtime.block_on(run(cli));
    std::process::ExitCode::from(u8::try_from(code).unwrap_or(1))
}

/// An error and its causes on one line, each cause once: wrapped errors often
/// repeat their source's text in their own.
fn one_line(e: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if !line.contains(&text) {
            if !line.is_empty() {
                line.push_str(": ");
            }
            line.push_str(&text);
        }
    }
    line
}

/// Runs the command; its exit code. An operator's error (a flag, a port in use, a
/// locked database) is one line on stderr, never a backtrace: those are for bugs,
/// which panic.
async fn run(cli: Cli) -> i32 {
    let failed = |e: anyhow::Error| {
        eprintln!("error: {}", one_line(&e));
        1
    };
    match cli.command {
        Command::Serve(args) => serve(*args).await.map_or_else(failed, |()| 0),
        Command::Completions { shell } => {
            use clap::CommandFactory;
            clap_complete::generate(shell, &mut Cli::command(), "spool", &mut std::io::stdout());
            0
        }
        Command::Bench(mut args) => {
            args.client = args.client.or(&cli.client);
            bench(*args).await.map_or_else(failed, |()| 0)
        }
        Command::Soak(mut args) => {
            args.json |= cli.client.json;
            init_logging("text", "warn");
            soak(args).await.unwrap_or_else(failed)
        }
        Command::SoakWorker {
            server,
            history,
            identity,
            concurrency,
        } => {
            init_logging("text", "warn");
            soak::worker::run(soak::worker::Options {
                server,
                history,
                identity,
                concurrency,
            })
            .await
            .map_or_else(failed, |()| 0)
        }
        command => match client_command(&cli.client, command).await {
            Ok(code) => code,
            Err(e) => {
                eprintln!("error: {e}");
                e.exit_code()
            }
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    /// Every flag and argument of every command a person may type says what it is
    /// for (`--help` shows it), and `serve` carries none of the client's flags.
    #[test]
    fn every_flag_and_argument_is_described() {
        fn walk(command: &clap::Command, path: &str, missing: &mut Vec<String>) {
            for arg in command.get_arguments() {
                let id = arg.get_id().as_str();
                if arg.is_hide_set() || id == "help" || id == "version" {
                    continue;
                }
                if arg.get_help().is_none() {
                    missing.push(format!("{path} {id}"));
                }
            }
            for sub in command.get_subcommands() {
                if !sub.is_hide_set() && sub.get_name() != "help" {
                    walk(sub, &format!("{path} {}", sub.get_name()), missing);
                }
            }
        }
        let cli = Cli::command();
        cli.clone().debug_assert();
        let mut missing = Vec::new();
        walk(&cli, "spool", &mut missing);
        assert!(missing.is_empty(), "undescribed: {missing:?}");
        let serve = cli
            .find_subcommand("serve")
            .unwrap_or_else(|| panic!("no serve"));
        for client_only in ["server", "token", "json", "ca_cert"] {
            assert!(
                serve.get_arguments().all(|a| a.get_id() != client_only),
                "serve takes --{client_only}"
            );
        }
    }
}
