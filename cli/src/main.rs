//! The `spool` binary: `spool serve` runs the server; the other subcommands are
//! clients of a running server. Parsing only: the work is in the library.

use clap::{Parser, Subcommand};

mod args;
mod bench;
mod commands;
mod logging;
mod serve;
mod soak;

use args::{
    ClientArgs, ClientOnly, DrainArgs, NamespaceArgs,
    activities::{CancelArgs, GetArgs, LsArgs, Selection, SubmitArgs, WaitArgs},
    connect,
    limits::{ConcurrencyLimitCommand, FairnessWeightCommand, RateLimitCommand},
};
use bench::args::BenchArgs;
use commands::exit;
use logging::init_logging;
use serve::ServeArgs;
use soak::args::Options as SoakArgs;

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

/// Runs a client command; its exit code.
async fn client_command(before: &ClientArgs, command: Command) -> Result<i32, commands::Error> {
    match command {
        Command::Serve(_)
        | Command::Bench(_)
        | Command::Soak(_)
        | Command::SoakWorker { .. }
        | Command::Completions { .. } => Ok(exit::OK),
        Command::Submit(a) => a.run(before).await,
        Command::Get(g) => g.run(before).await,
        Command::Wait(w) => w.run(before).await,
        Command::Cancel(c) => c.run(before).await,
        Command::Retry(r) => r.retry(before).await,
        Command::Ls(ls) => ls.run(before).await,
        Command::Stats(n) => connect(&n.client, before).await?.stats(n.namespace).await,
        Command::Workers(n) => connect(&n.client, before).await?.workers(n.namespace).await,
        Command::Drain(d) => connect(&d.client, before).await?.drain(d.timeout).await,
        Command::Resume(r) => connect(&r.client, before).await?.resume().await,
        Command::RateLimit(c) => c.run(before).await,
        Command::ConcurrencyLimit(c) => c.run(before).await,
        Command::FairnessWeight(c) => c.run(before).await,
    }
}

// See the dependency's note in Cargo.toml: a drain's CPU per activity.
#[cfg(not(target_env = "msvc"))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

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
        Command::Serve(args) => serve::serve(*args).await.map_or_else(failed, |()| 0),
        Command::Completions { shell } => {
            use clap::CommandFactory;
            clap_complete::generate(shell, &mut Cli::command(), "spool", &mut std::io::stdout());
            0
        }
        Command::Bench(mut args) => {
            args.client = args.client.or(&cli.client);
            args.run().await.map_or_else(failed, |()| 0)
        }
        Command::Soak(mut args) => {
            args.json |= cli.client.json;
            init_logging("text", "warn");
            args.run().await.unwrap_or_else(failed)
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
