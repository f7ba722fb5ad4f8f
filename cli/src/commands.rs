//! The client half of the `spool` binary: one method per subcommand, each one call of
//! `spool-client` that prints a human table (default) or JSON (`--json`) to
//! stdout. Errors go to stderr with a message naming what to do, and a non-zero exit.

use std::{fmt::Write as _, time::Duration};

use spool_client::Client;
use spool_proto::v1::{self, ActivityStatus};
use tonic::{Code, Status};

/// The exit codes of the client subcommands (README, "Exit codes").
pub mod exit {
    /// Done; a waited-for activity COMPLETED.
    pub const OK: i32 = 0;
    /// The server refused or failed the call (permission, conflict, internal).
    pub const ERROR: i32 = 1;
    /// The command line or an input is wrong (also what the server calls an invalid
    /// argument).
    pub const USAGE: i32 = 2;
    /// The waited-for activity finished FAILED or CANCELLED.
    pub const NOT_COMPLETED: i32 = 3;
    /// `--timeout` passed before the waited-for activity finished.
    pub const TIMEOUT: i32 = 4;
    /// No such activity.
    pub const NOT_FOUND: i32 = 5;
    /// No Spool server answers at the address.
    pub const UNREACHABLE: i32 = 6;
}

/// What `stats` and `workers` say under their table while the node drains.
const DRAINING: &str =
    "this node is draining: it dispatches nothing and refuses workers until `spool resume`";

/// Where and how to reach the server.
#[derive(Debug, Clone)]
pub struct Target {
    pub server: String,
    pub token: Option<String>,
    pub json: bool,
    /// TLS settings for an `https://` server.
    pub tls: spool_proto::endpoint::ClientTls,
}

/// What went wrong, said for a person.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(
        "cannot reach the Spool server at {server}: {reason} (is `spool serve` running? set --server or SPOOL_SERVER)"
    )]
    Unreachable { server: String, reason: String },
    #[error("{server} broke off the call ({reason}): {}", not_grpc_hint(.server))]
    NotGrpc { server: String, reason: String },
    #[error("{}", describe(.0))]
    Server(Status),
    #[error("{0}")]
    Usage(String),
}

/// Why a server may break off a call below gRPC, for the address given.
fn not_grpc_hint(server: &str) -> &'static str {
    if server.starts_with("https://") {
        "it refused this client's TLS (does it require --client-cert and --client-key?), \
         or it does not speak gRPC (is it a Spool server's address?)"
    } else {
        "it does not speak gRPC: is it a Spool server's address? (`spool serve` listens on \
         127.0.0.1:7070 unless --listen says otherwise; a TLS server needs https://)"
    }
}

impl Error {
    /// The exit code this error ends the command with.
    pub fn exit_code(&self) -> i32 {
        match self {
            Error::Unreachable { .. } | Error::NotGrpc { .. } => exit::UNREACHABLE,
            Error::Usage(_) => exit::USAGE,
            Error::Server(status) => match status.code() {
                Code::NotFound => exit::NOT_FOUND,
                Code::InvalidArgument => exit::USAGE,
                _ => exit::ERROR,
            },
        }
    }
}

fn describe(status: &Status) -> String {
    let hint = match status.code() {
        Code::Unauthenticated => " (pass --token or set SPOOL_TOKEN)",
        Code::Unavailable => " (the server is unreachable or shutting down)",
        _ => "",
    };
    format!("{:?}: {}{hint}", status.code(), status.message())
}

impl From<spool_client::Error> for Error {
    fn from(e: spool_client::Error) -> Self {
        match e {
            spool_client::Error::Status(status) => Error::Server(status),
            spool_client::Error::Unreachable { server, reason } => {
                Error::Unreachable { server, reason }
            }
            spool_client::Error::InvalidEndpoint(why) => Error::Usage(format!("--server: {why}")),
            spool_client::Error::InvalidToken => {
                Error::Usage("the token is not a valid header value".to_owned())
            }
            spool_client::Error::NotGrpc { server, reason } => Error::NotGrpc { server, reason },
            // The typed calls' errors; the CLI makes none of those calls.
            e @ (spool_client::Error::Encode { .. }
            | spool_client::Error::Decode { .. }
            | spool_client::Error::NotCompleted { .. }) => Error::Usage(e.to_string()),
        }
    }
}

/// The client subcommands: each one call of [`spool_client::Client`], printed.
pub struct Commands {
    client: Client,
    json: bool,
}

impl Commands {
    pub async fn connect(target: Target) -> Result<Self, Error> {
        let mut builder = Client::builder(target.server).tls(target.tls);
        if let Some(token) = target.token {
            builder = builder.token(token);
        }
        Ok(Self {
            client: builder.connect().await?,
            json: target.json,
        })
    }

    pub async fn submit(
        &self,
        request: v1::SubmitRequest,
        wait: Option<Option<Duration>>,
    ) -> Result<i32, Error> {
        let response = self.client.submit(request).await?;
        let activity = response.activity.unwrap_or_default();
        let Some(timeout) = wait else {
            if self.json {
                let mut json = activity_json(&activity);
                json["created"] = response.created.into();
                print_json(&json);
            } else {
                let verb = if response.created {
                    "submitted"
                } else {
                    "exists"
                };
                println!("{verb} {}", key_text(activity.key.as_ref()));
            }
            return Ok(exit::OK);
        };
        let done = self
            .client
            .wait(activity.key.unwrap_or_default(), timeout)
            .await?;
        if self.json {
            let mut json = activity_json(&done);
            json["created"] = response.created.into();
            print_json(&json);
        } else {
            print!("{}", activity_text(&done));
        }
        Ok(exit_for(&done))
    }

    pub async fn get(&self, key: v1::ActivityKey, history: bool) -> Result<i32, Error> {
        if !history {
            let activity = self.client.get(key).await?;
            self.print_activity(&activity);
            return Ok(exit::OK);
        }
        let activity = self.client.get_with_history(key).await?;
        if self.json {
            let mut value = activity_json(&activity);
            value["history"] = activity.history.iter().map(attempt_json).collect();
            print_json(&value);
        } else {
            print!("{}", activity_text(&activity));
            println!();
            print!("{}", history_text(&activity.history));
        }
        Ok(exit::OK)
    }

    /// Re-drives or cancels every activity `request` lists; with `dry_run`, only
    /// says which. The keys are read first, then acted on one by one: an activity
    /// that changed in between is reported, not forced.
    pub async fn bulk(
        &self,
        request: v1::ListRequest,
        action: Bulk,
        dry_run: bool,
    ) -> Result<i32, Error> {
        use tokio_stream::StreamExt as _;
        let mut keys = Vec::new();
        let mut listed = std::pin::pin!(self.client.list_stream(request));
        while let Some(activity) = listed.next().await {
            if let Some(key) = activity?.key {
                keys.push(key);
            }
        }
        let verb = match &action {
            Bulk::Retry => "re-drive",
            Bulk::Cancel { .. } => "cancel",
        };
        if dry_run {
            for key in &keys {
                println!("{}", key_text(Some(key)));
            }
            eprintln!("would {verb} {} activities (--dry-run)", keys.len());
            return Ok(exit::OK);
        }
        let mut failures = Vec::new();
        for key in &keys {
            let done = match &action {
                Bulk::Retry => self.client.retry(key.clone()).await,
                Bulk::Cancel { reason } => self.client.cancel(key.clone(), reason.clone()).await,
            };
            if let Err(e) = done {
                failures.push((key_text(Some(key)), e.to_string()));
            }
        }
        if self.json {
            print_json(&serde_json::json!({
                "matched": keys.len(),
                "done": keys.len() - failures.len(),
                "failed": failures.iter().map(|(k, e)| serde_json::json!({"key": k, "error": e})).collect::<Vec<_>>(),
            }));
        } else {
            for (key, error) in &failures {
                println!("{key}: {error}");
            }
            println!(
                "{verb}: {} of {} done",
                keys.len() - failures.len(),
                keys.len()
            );
        }
        Ok(if failures.is_empty() {
            exit::OK
        } else {
            exit::ERROR
        })
    }

    pub async fn wait(
        &self,
        key: v1::ActivityKey,
        timeout: Option<Duration>,
    ) -> Result<i32, Error> {
        let activity = self.client.wait(key, timeout).await?;
        self.print_activity(&activity);
        Ok(exit_for(&activity))
    }

    pub async fn cancel(&self, key: v1::ActivityKey, reason: String) -> Result<i32, Error> {
        let activity = self.client.cancel(key, reason).await?;
        self.print_activity(&activity);
        Ok(exit::OK)
    }

    pub async fn retry(&self, key: v1::ActivityKey) -> Result<i32, Error> {
        let activity = self.client.retry(key).await?;
        self.print_activity(&activity);
        Ok(exit::OK)
    }

    /// Lists up to `limit` activities, following page tokens; says how to go on
    /// when more match.
    pub async fn list(&self, request: v1::ListRequest, limit: usize) -> Result<i32, Error> {
        let (activities, next) = self.client.list_page_up_to(request, limit).await?;
        if self.json {
            print_json(&serde_json::json!({
                "activities": activities.iter().map(activity_json).collect::<Vec<_>>(),
                "next_page_token": next,
            }));
            return Ok(exit::OK);
        }
        let rows: Vec<Vec<String>> = activities
            .iter()
            .map(|a| {
                vec![
                    key_text(a.key.as_ref()),
                    a.activity_type.clone(),
                    status_label(a.status),
                    a.attempt.to_string(),
                    a.created_at.as_ref().map(format_time).unwrap_or_default(),
                    a.last_error.as_ref().map(short_error).unwrap_or_default(),
                ]
            })
            .collect();
        print!(
            "{}",
            table(
                &["KEY", "TYPE", "STATUS", "ATTEMPT", "CREATED", "LAST_ERROR"],
                &rows
            )
        );
        if !next.is_empty() {
            eprintln!("more match: add --page-token {next} for the next page, or --all");
        }
        Ok(exit::OK)
    }

    pub async fn stats(&self, namespace: String) -> Result<i32, Error> {
        let s = self.client.stats(namespace).await?;
        if self.json {
            print_json(&serde_json::json!({
                "scheduled": s.scheduled, "running": s.running, "completed": s.completed,
                "failed": s.failed, "cancelled": s.cancelled, "connected_workers": s.connected_workers,
                "draining": s.draining, "claimed_ahead": s.claimed_ahead,
            }));
        } else {
            let rows = vec![vec![
                s.scheduled.to_string(),
                s.running.to_string(),
                s.completed.to_string(),
                s.failed.to_string(),
                s.cancelled.to_string(),
                s.connected_workers.to_string(),
            ]];
            print!(
                "{}",
                table(
                    &[
                        "SCHEDULED",
                        "RUNNING",
                        "COMPLETED",
                        "FAILED",
                        "CANCELLED",
                        "WORKERS"
                    ],
                    &rows
                )
            );
            if s.claimed_ahead > 0 {
                println!(
                    "{} of the running rows are claimed ahead: sent to a worker as its next slot frees",
                    s.claimed_ahead
                );
            }
            if s.draining {
                println!("{DRAINING}");
            }
        }
        Ok(exit::OK)
    }

    pub async fn workers(&self, namespace: String) -> Result<i32, Error> {
        let answer = self.client.list_workers(namespace).await?;
        let workers = answer.workers;
        if self.json {
            let list: Vec<serde_json::Value> = workers
                .iter()
                .map(|w| {
                    serde_json::json!({
                        "worker_id": w.worker_id, "identity": w.identity, "namespace": w.namespace,
                        "activity_types": w.activity_types, "max_concurrency": w.max_concurrency,
                        "in_flight": w.in_flight,
                        "connected_at": w.connected_at.as_ref().map(format_time),
                        "last_seen_at": w.last_seen_at.as_ref().map(format_time),
                        "node": w.node,
                    })
                })
                .collect();
            print_json(&serde_json::json!({"workers": list, "draining": answer.draining}));
            return Ok(exit::OK);
        }
        let rows: Vec<Vec<String>> = workers
            .iter()
            .map(|w| {
                vec![
                    w.worker_id.clone(),
                    w.identity.clone(),
                    w.node.clone(),
                    w.namespace.clone(),
                    w.activity_types.join(","),
                    format!("{}/{}", w.in_flight, w.max_concurrency),
                    w.connected_at.as_ref().map(format_time).unwrap_or_default(),
                ]
            })
            .collect();
        print!(
            "{}",
            table(
                &[
                    "WORKER_ID",
                    "IDENTITY",
                    "NODE",
                    "NAMESPACE",
                    "TYPES",
                    "IN_FLIGHT",
                    "CONNECTED"
                ],
                &rows
            )
        );
        if answer.draining {
            println!("{DRAINING}");
        }
        Ok(exit::OK)
    }

    pub async fn drain(&self, timeout: Option<Duration>) -> Result<i32, Error> {
        let r = self.client.drain(timeout).await?;
        if self.json {
            print_json(&serde_json::json!({
                "completed": r.completed,
                "released": r.released,
                "handed_over": r.handed_over,
                "ended_otherwise": r.ended_otherwise,
            }));
        } else {
            let otherwise = match r.ended_otherwise {
                0 => String::new(),
                n => format!(", {n} ended otherwise (timed out, lost or cancelled)"),
            };
            println!(
                "drained: {} completed, {} released{otherwise}; the node refuses workers until `spool resume`",
                r.completed, r.released
            );
        }
        Ok(exit::OK)
    }

    pub async fn resume(&self) -> Result<i32, Error> {
        let r = self.client.resume().await?;
        if self.json {
            print_json(&serde_json::json!({"was_draining": r.was_draining}));
        } else if r.was_draining {
            println!("resumed: the node takes workers and dispatches again");
        } else {
            println!("the node was not draining: nothing changed");
        }
        Ok(exit::OK)
    }

    pub async fn set_rate_limit(&self, limit: v1::RateLimit) -> Result<i32, Error> {
        let set = self.client.set_rate_limit(limit).await?;
        self.print_rate_limits(std::slice::from_ref(&set));
        Ok(exit::OK)
    }

    pub async fn rate_limits(&self, namespace: String) -> Result<i32, Error> {
        let limits = self.client.list_rate_limits(namespace).await?;
        self.print_rate_limits(&limits);
        Ok(exit::OK)
    }

    pub async fn set_concurrency_limit(&self, limit: v1::ConcurrencyLimit) -> Result<i32, Error> {
        let set = self.client.set_concurrency_limit(limit).await?;
        self.print_concurrency_limits(std::slice::from_ref(&set));
        Ok(exit::OK)
    }

    pub async fn concurrency_limits(&self, namespace: String) -> Result<i32, Error> {
        let limits = self.client.list_concurrency_limits(namespace).await?;
        self.print_concurrency_limits(&limits);
        Ok(exit::OK)
    }

    pub async fn set_fairness_weight(&self, weight: v1::FairnessWeight) -> Result<i32, Error> {
        let set = self.client.set_fairness_weight(weight).await?;
        self.print_fairness_weights(std::slice::from_ref(&set), false);
        Ok(exit::OK)
    }

    pub async fn fairness_weights(&self, namespace: String) -> Result<i32, Error> {
        let weights = self.client.list_fairness_weights(namespace).await?;
        self.print_fairness_weights(&weights, true);
        Ok(exit::OK)
    }

    pub async fn delete_fairness_weight(
        &self,
        namespace: String,
        activity_type: String,
        key: String,
    ) -> Result<i32, Error> {
        let what = limited(&activity_type, Some(&key));
        let deleted = self
            .client
            .delete_fairness_weight(namespace, activity_type, key)
            .await?;
        self.print_deleted(deleted, "fairness weight", &what);
        Ok(exit::OK)
    }

    /// Deletes the `kind` limit of `activity_type`, or with `key`, that key's own.
    pub async fn delete_limit(
        &self,
        kind: LimitKind,
        namespace: String,
        activity_type: String,
        key: Option<String>,
    ) -> Result<i32, Error> {
        let client = &self.client;
        let of = activity_type.clone();
        let deleted = match (kind, key.clone()) {
            (LimitKind::Rate, None) => client.delete_rate_limit(namespace, of).await?,
            (LimitKind::Rate, Some(key)) => {
                client.delete_key_rate_limit(namespace, of, key).await?
            }
            (LimitKind::Concurrency, None) => {
                client.delete_concurrency_limit(namespace, of).await?
            }
            (LimitKind::Concurrency, Some(key)) => {
                client
                    .delete_concurrency_key_limit(namespace, of, key)
                    .await?
            }
        };
        let what = match kind {
            LimitKind::Rate => "rate limit",
            LimitKind::Concurrency => "concurrency limit",
        };
        self.print_deleted(deleted, what, &limited(&activity_type, key.as_deref()));
        Ok(exit::OK)
    }

    /// What a delete of `activity_type`'s `what` did.
    fn print_deleted(&self, deleted: bool, what: &str, activity_type: &str) {
        if self.json {
            print_json(&serde_json::json!({"deleted": deleted}));
        } else if deleted {
            println!("{activity_type}: no {what} now");
        } else {
            println!("{activity_type} had no {what}: nothing changed");
        }
    }

    fn print_concurrency_limits(&self, limits: &[v1::ConcurrencyLimit]) {
        if self.json {
            let list: Vec<serde_json::Value> = limits
                .iter()
                .map(|l| {
                    serde_json::json!({
                        "namespace": l.namespace, "activity_type": l.activity_type,
                        "concurrency_key": l.concurrency_key, "max_running": l.max_running,
                        "weight": l.weight, "keys": l.keys, "running": l.running,
                        "strategy": strategy_label(l.strategy), "held": l.held,
                    })
                })
                .collect();
            print_json(&serde_json::json!({"concurrency_limits": list}));
            return;
        }
        let rows: Vec<Vec<String>> = limits
            .iter()
            .map(|l| {
                let keyed = !l.concurrency_key.is_empty();
                vec![
                    l.namespace.clone(),
                    l.activity_type.clone(),
                    key_column(&l.concurrency_key),
                    match l.max_running {
                        0 => "type's".to_owned(),
                        max => max.to_string(),
                    },
                    if keyed {
                        l.weight.to_string()
                    } else {
                        "-".to_owned()
                    },
                    strategy_label(l.strategy),
                    l.keys.to_string(),
                    l.running.to_string(),
                    l.held.to_string(),
                ]
            })
            .collect();
        print!(
            "{}",
            table(
                &[
                    "NAMESPACE",
                    "TYPE",
                    "KEY",
                    "PER_KEY",
                    "WEIGHT",
                    "STRATEGY",
                    "KEYS",
                    "RUNNING",
                    "HELD"
                ],
                &rows
            )
        );
    }

    /// `listed`: the weights come from a listing, which counts their keys'
    /// waiting activities (a set weight comes back without).
    fn print_fairness_weights(&self, weights: &[v1::FairnessWeight], listed: bool) {
        if self.json {
            let list: Vec<serde_json::Value> = weights
                .iter()
                .map(|w| {
                    let mut item = serde_json::json!({
                        "namespace": w.namespace, "activity_type": w.activity_type,
                        "fairness_key": w.fairness_key, "weight": w.weight,
                    });
                    if listed {
                        item["waiting"] = w.waiting.into();
                        item["waiting_truncated"] = w.waiting_truncated.into();
                    }
                    item
                })
                .collect();
            print_json(&serde_json::json!({"fairness_weights": list}));
            return;
        }
        let rows: Vec<Vec<String>> = weights
            .iter()
            .map(|w| {
                let mut row = vec![
                    w.namespace.clone(),
                    w.activity_type.clone(),
                    w.fairness_key.clone(),
                    w.weight.to_string(),
                ];
                if listed {
                    // Counted among the type's first 100,000 waiting activities.
                    let more = if w.waiting_truncated { "+" } else { "" };
                    row.push(format!("{}{more}", w.waiting));
                }
                row
            })
            .collect();
        let mut headers = vec!["NAMESPACE", "TYPE", "FAIRNESS KEY", "WEIGHT"];
        if listed {
            headers.push("WAITING");
        }
        print!("{}", table(&headers, &rows));
    }

    fn print_rate_limits(&self, limits: &[v1::RateLimit]) {
        let period = |l: &v1::RateLimit| {
            l.period
                .as_ref()
                .and_then(|p| spool_proto::duration::from_proto(Some(p)).ok().flatten())
                .map(spool_proto::duration::format)
                .unwrap_or_default()
        };
        if self.json {
            let list: Vec<serde_json::Value> = limits
                .iter()
                .map(|l| {
                    serde_json::json!({
                        "namespace": l.namespace, "activity_type": l.activity_type,
                        "concurrency_key": l.concurrency_key,
                        "limit": l.limit, "period": period(l), "burst": l.burst,
                        "available": l.available,
                    })
                })
                .collect();
            print_json(&serde_json::json!({"rate_limits": list}));
            return;
        }
        let rows: Vec<Vec<String>> = limits
            .iter()
            .map(|l| {
                vec![
                    l.namespace.clone(),
                    l.activity_type.clone(),
                    if l.concurrency_key.is_empty() {
                        "(type)".to_owned()
                    } else {
                        l.concurrency_key.clone()
                    },
                    format!("{}/{}", l.limit, period(l)),
                    l.burst.to_string(),
                    l.available.to_string(),
                ]
            })
            .collect();
        print!(
            "{}",
            table(
                &["NAMESPACE", "TYPE", "KEY", "LIMIT", "BURST", "AVAILABLE"],
                &rows
            )
        );
    }

    fn print_activity(&self, activity: &v1::Activity) {
        if self.json {
            print_json(&activity_json(activity));
        } else {
            print!("{}", activity_text(activity));
        }
    }
}

/// A limit's KEY column: the key, or `*` for the type's own limit (every key).
fn key_column(key: &str) -> String {
    if key.is_empty() {
        "*".to_owned()
    } else {
        key.to_owned()
    }
}

/// The kinds of limit `AdminService` keeps.
#[derive(Clone, Copy)]
pub enum LimitKind {
    Rate,
    Concurrency,
}

/// What a limit deleted was on: a type, or one key of it.
fn limited(activity_type: &str, key: Option<&str>) -> String {
    match key {
        None => activity_type.to_owned(),
        Some(key) => format!("{activity_type} key {key:?}"),
    }
}

/// How waiting for `activity` ends the command: it COMPLETED, finished otherwise,
/// or is not finished yet (the wait timed out).
fn exit_for(activity: &v1::Activity) -> i32 {
    match ActivityStatus::try_from(activity.status) {
        Ok(ActivityStatus::Completed) => exit::OK,
        Ok(ActivityStatus::Failed | ActivityStatus::Cancelled) => exit::NOT_COMPLETED,
        _ => exit::TIMEOUT,
    }
}

/// Reads `--input`: inline JSON, or `@path` for a file's contents.
pub fn input(value: &str) -> Result<v1::Payload, Error> {
    let data = match value.strip_prefix('@') {
        Some(path) => std::fs::read(path)
            .map_err(|e| Error::Usage(format!("cannot read --input file {path:?}: {e}")))?,
        None => value.as_bytes().to_vec(),
    };
    serde_json::from_slice::<serde_json::Value>(&data)
        .map_err(|e| Error::Usage(format!("--input is not valid JSON: {e}")))?;
    Ok(v1::Payload {
        content_type: "application/json".to_owned(),
        data,
    })
}

/// An activity's key from the command line: `key` is NAMESPACE/WORKFLOW_ID/ACTIVITY_ID
/// (as [`key_text`] prints it) or WORKFLOW_ID/ACTIVITY_ID, or, with `activity_id`,
/// the workflow id alone. The namespace part, when there is none, is `namespace`.
pub fn parse_key(
    key: &str,
    activity_id: Option<&str>,
    namespace: Option<&str>,
) -> Result<v1::ActivityKey, Error> {
    let (ns, workflow_id, activity_id) = match activity_id {
        Some(activity_id) => (None, key, activity_id),
        None => match key.split('/').collect::<Vec<_>>().as_slice() {
            [workflow_id, activity_id] => (None, *workflow_id, *activity_id),
            [ns, ..] if key.matches('/').count() >= 2 => {
                // Namespaces hold no '/': the first part is one; the last part is
                // the activity id, everything between the workflow id.
                let rest = &key[ns.len() + 1..];
                let (workflow_id, activity_id) = rest.rsplit_once('/').unwrap_or((rest, ""));
                (Some(*ns), workflow_id, activity_id)
            }
            _ => {
                return Err(Error::Usage(format!(
                    "{key:?} is not an activity key: give NAMESPACE/WORKFLOW_ID/ACTIVITY_ID (as \
                     spool prints it), WORKFLOW_ID/ACTIVITY_ID, or WORKFLOW_ID ACTIVITY_ID"
                )));
            }
        },
    };
    let namespace = match (ns, namespace) {
        (Some(a), Some(b)) if a != b => {
            return Err(Error::Usage(format!(
                "the key names namespace {a:?} but --namespace says {b:?}"
            )));
        }
        (Some(ns), _) | (None, Some(ns)) => ns,
        (None, None) => "",
    };
    if workflow_id.is_empty() || activity_id.is_empty() {
        return Err(Error::Usage(format!(
            "{key:?} leaves the workflow id or the activity id empty"
        )));
    }
    Ok(v1::ActivityKey {
        namespace: namespace.to_owned(),
        workflow_id: workflow_id.to_owned(),
        activity_id: activity_id.to_owned(),
    })
}

/// A key as the CLI prints it, and reads it back: NAMESPACE/WORKFLOW_ID/ACTIVITY_ID.
fn key_text(key: Option<&v1::ActivityKey>) -> String {
    let key = key.cloned().unwrap_or_default();
    format!("{}/{}/{}", key.namespace, key.workflow_id, key.activity_id)
}

pub fn parse_status(s: &str) -> Result<ActivityStatus, String> {
    ActivityStatus::from_str_name(&format!("ACTIVITY_STATUS_{}", s.to_ascii_uppercase()))
        .filter(|s| *s != ActivityStatus::Unspecified)
        .ok_or_else(|| {
            format!("unknown status {s:?}: use scheduled, running, completed, failed or cancelled")
        })
}

fn status_label(status: i32) -> String {
    ActivityStatus::try_from(status)
        .map(|s| {
            s.as_str_name()
                .trim_start_matches("ACTIVITY_STATUS_")
                .to_owned()
        })
        .unwrap_or_else(|_| status.to_string())
}

fn error_kind_label(kind: i32) -> String {
    v1::ErrorKind::try_from(kind)
        .map(|k| k.as_str_name().trim_start_matches("ERROR_KIND_").to_owned())
        .unwrap_or_else(|_| kind.to_string())
}

/// RFC 3339 in UTC (prost-types' rendering: the fraction only as long as needed).
fn format_time(ts: &prost_types::Timestamp) -> String {
    ts.to_string()
}

fn strategy_label(code: i32) -> String {
    match v1::ConcurrencyStrategy::try_from(code) {
        Ok(v1::ConcurrencyStrategy::CancelNewest) => "cancel-newest",
        Ok(v1::ConcurrencyStrategy::CancelInProgress) => "cancel-in-progress",
        _ => "queue",
    }
    .to_owned()
}

fn payload_json(p: &v1::Payload) -> serde_json::Value {
    let is_json = p.content_type.is_empty() || p.content_type == "application/json";
    if is_json && let Ok(value) = serde_json::from_slice::<serde_json::Value>(&p.data) {
        return value;
    }
    match std::str::from_utf8(&p.data) {
        Ok(text) => serde_json::json!({"content_type": p.content_type, "text": text}),
        Err(_) => serde_json::json!({"content_type": p.content_type, "base64": base64(&p.data)}),
    }
}

fn base64(data: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(data)
}

pub fn activity_json(a: &v1::Activity) -> serde_json::Value {
    let key = a.key.clone().unwrap_or_default();
    serde_json::json!({
        "namespace": key.namespace,
        "workflow_id": key.workflow_id,
        "activity_id": key.activity_id,
        "activity_type": a.activity_type,
        "status": status_label(a.status),
        "attempt": a.attempt,
        "counted_attempts": a.counted_attempts,
        "max_attempts": a.max_attempts,
        "input": a.input.as_ref().map(payload_json),
        "output": a.output.as_ref().map(payload_json),
        "last_error": a.last_error.as_ref().map(|e| serde_json::json!({
            "kind": error_kind_label(e.kind), "type": e.r#type, "message": e.message,
            "details": e.details.as_ref().map(payload_json),
        })),
        "heartbeat_details": a.heartbeat_details.as_ref().map(payload_json),
        "created_at": a.created_at.as_ref().map(format_time),
        "next_at": a.next_at.as_ref().map(format_time),
        "started_at": a.started_at.as_ref().map(format_time),
        "finished_at": a.finished_at.as_ref().map(format_time),
        "worker_id": a.worker_id,
        "concurrency_key": a.concurrency_key,
        "fairness_key": a.fairness_key,
        "waiting_reason": a.waiting_reason,
    })
}

fn activity_text(a: &v1::Activity) -> String {
    let mut out = String::new();
    let mut line = |k: &str, v: String| {
        if !v.is_empty() {
            let _ = writeln!(out, "{k:<13} {v}");
        }
    };
    line("key", key_text(a.key.as_ref()));
    line("type", a.activity_type.clone());
    line("status", status_label(a.status));
    line("waiting", a.waiting_reason.clone());
    line("attempt", attempt_text(a));
    line("concurrency", a.concurrency_key.clone());
    line("fairness", a.fairness_key.clone());
    line(
        "input",
        a.input
            .as_ref()
            .map(|p| payload_json(p).to_string())
            .unwrap_or_default(),
    );
    line(
        "output",
        a.output
            .as_ref()
            .map(|p| payload_json(p).to_string())
            .unwrap_or_default(),
    );
    line(
        "last_error",
        a.last_error
            .as_ref()
            .map(|e| format!("{} {}: {}", error_kind_label(e.kind), e.r#type, e.message))
            .unwrap_or_default(),
    );
    line(
        "created_at",
        a.created_at.as_ref().map(format_time).unwrap_or_default(),
    );
    line(
        "next_at",
        a.next_at.as_ref().map(format_time).unwrap_or_default(),
    );
    line(
        "started_at",
        a.started_at.as_ref().map(format_time).unwrap_or_default(),
    );
    line(
        "finished_at",
        a.finished_at.as_ref().map(format_time).unwrap_or_default(),
    );
    line("worker_id", a.worker_id.clone());
    out
}

fn attempt_json(a: &v1::AttemptRecord) -> serde_json::Value {
    serde_json::json!({
        "attempt": a.attempt,
        "outcome": a.outcome,
        "started_at": a.started_at.as_ref().map(format_time),
        "ended_at": a.ended_at.as_ref().map(format_time),
        "worker_id": a.worker_id,
        "identity": a.identity,
        "node": a.node,
        "error": a.error.as_ref().map(|e| serde_json::json!({
            "kind": error_kind_label(e.kind), "type": e.r#type, "message": e.message,
            "details": e.details.as_ref().map(payload_json),
        })),
    })
}

/// The attempt history as a table, oldest first.
fn history_text(history: &[v1::AttemptRecord]) -> String {
    if history.is_empty() {
        return "no attempt has ended yet\n".to_owned();
    }
    let rows: Vec<Vec<String>> = history
        .iter()
        .map(|a| {
            let took = match (&a.started_at, &a.ended_at) {
                (Some(s), Some(e)) => {
                    let ms =
                        (e.seconds - s.seconds) * 1000 + i64::from(e.nanos - s.nanos) / 1_000_000;
                    format!("{:.3}s", ms as f64 / 1000.0)
                }
                _ => String::new(),
            };
            vec![
                a.attempt.to_string(),
                a.outcome.clone(),
                a.started_at.as_ref().map(format_time).unwrap_or_default(),
                took,
                format!("{}@{}", a.identity, a.node),
                a.error.as_ref().map(short_error).unwrap_or_default(),
            ]
        })
        .collect();
    table(
        &[
            "ATTEMPT",
            "OUTCOME",
            "STARTED",
            "TOOK",
            "WORKER@NODE",
            "ERROR",
        ],
        &rows,
    )
}

/// What `bulk` does to each activity.
pub enum Bulk {
    Retry,
    Cancel { reason: String },
}

/// An error on one line of a table: its type and the start of its message.
fn short_error(e: &v1::ActivityError) -> String {
    const MAX: usize = 60;
    let message: String = e.message.lines().next().unwrap_or_default().to_owned();
    let cut = if message.chars().count() > MAX {
        format!("{}…", message.chars().take(MAX).collect::<String>())
    } else {
        message
    };
    format!("{}: {cut}", e.r#type)
}

/// The attempt number, and how many of the attempts count against the budget: a
/// snooze, a release by a draining server and a re-drive's fresh budget leave
/// attempts uncounted, so the two differ.
fn attempt_text(a: &v1::Activity) -> String {
    format!(
        "{} ({} of {} counted)",
        a.attempt, a.counted_attempts, a.max_attempts
    )
}

fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.len()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let mut write_row = |cells: Vec<&str>| {
        let line: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        let _ = writeln!(out, "{}", line.join("  ").trim_end());
    };
    write_row(headers.to_vec());
    for row in rows {
        write_row(row.iter().map(String::as_str).collect());
    }
    out
}

fn print_json(value: &serde_json::Value) {
    println!("{value}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_times_as_rfc3339() {
        let ts = spool_proto::time::to_proto(1_700_000_000_123);
        assert_eq!(format_time(&ts), "2023-11-14T22:13:20.123Z");
        assert_eq!(
            format_time(&spool_proto::time::to_proto(0)),
            "1970-01-01T00:00:00Z"
        );
    }

    #[test]
    fn base64_pads() {
        assert_eq!(base64(b"f"), "Zg==");
        assert_eq!(base64(b"fo"), "Zm8=");
        assert_eq!(base64(b"foo"), "Zm9v");
    }

    #[test]
    fn statuses_parse_case_insensitively() {
        assert_eq!(parse_status("failed"), Ok(ActivityStatus::Failed));
        assert_eq!(parse_status("FAILED"), Ok(ActivityStatus::Failed));
        assert_eq!(parse_status("Running"), Ok(ActivityStatus::Running));
        assert!(parse_status("unspecified").is_err());
        assert!(parse_status("done").is_err());
    }

    #[test]
    fn keys_read_back_as_printed() {
        let key = |ns: &str, wf: &str, act: &str| v1::ActivityKey {
            namespace: ns.into(),
            workflow_id: wf.into(),
            activity_id: act.into(),
        };
        let printed = key_text(Some(&key("default", "wf1", "a1")));
        assert_eq!(printed, "default/wf1/a1");
        assert_eq!(
            parse_key(&printed, None, None).ok(),
            Some(key("default", "wf1", "a1"))
        );
        assert_eq!(
            parse_key("wf1/a1", None, Some("ns")).ok(),
            Some(key("ns", "wf1", "a1"))
        );
        assert_eq!(
            parse_key("wf/with/slash", Some("a1"), None).ok(),
            Some(key("", "wf/with/slash", "a1"))
        );
        assert_eq!(
            parse_key("ns/wf/with/slash/a1", None, None).ok(),
            Some(key("ns", "wf/with/slash", "a1"))
        );
        assert!(parse_key("default/wf1/a1", None, Some("other")).is_err());
        assert!(parse_key("wf1", None, None).is_err());
        assert!(parse_key("ns//a1", None, None).is_err());
    }

    #[test]
    fn tables_align() {
        let t = table(&["A", "BB"], &[vec!["long".into(), "x".into()]]);
        assert_eq!(t, "A     BB\nlong  x\n");
    }
}
