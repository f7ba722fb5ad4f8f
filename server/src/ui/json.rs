//! The dashboard API's JSON shapes, made from the wire messages. Payloads travel as
//! text (lossy UTF-8, cut at [`MAX_TEXT`]) with their content type and size: the
//! page shows them, it never interprets them.

use serde::{Deserialize, Serialize};
use spool_proto::v1;

use crate::api::{Error, status_name};
use crate::store::{ActivityStatus, TypeCounts};

/// The most bytes of one payload the detail view shows.
pub const MAX_TEXT: usize = 64 * 1024;

#[derive(Serialize)]
pub struct Session {
    pub version: &'static str,
    pub role: &'static str,
    pub namespaces: Option<Vec<String>>,
    pub can_write: bool,
    pub can_admin: bool,
    pub read_only: bool,
    /// Whether the server checks tokens: without, there is nothing to sign in
    /// or out of.
    pub auth_required: bool,
}

#[derive(Serialize)]
pub struct Page {
    pub activities: Vec<Summary>,
    pub next_page_token: String,
}

#[derive(Deserialize)]
pub struct KeyIn {
    pub workflow_id: String,
    pub activity_id: String,
}

#[derive(Serialize)]
pub struct BulkResult {
    pub workflow_id: String,
    pub activity_id: String,
    pub ok: bool,
    pub error: Option<String>,
}

#[derive(Serialize)]
pub struct ErrorOut {
    #[serde(rename = "type")]
    r#type: String,
    message: String,
    kind: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    details: Option<PayloadOut>,
}

#[derive(Serialize)]
pub struct PayloadOut {
    content_type: String,
    size: usize,
    text: String,
    truncated: bool,
}

#[derive(Serialize)]
pub struct Summary {
    namespace: String,
    workflow_id: String,
    activity_id: String,
    activity_type: String,
    status: &'static str,
    attempt: u32,
    max_attempts: u32,
    created_at: Option<String>,
    next_at: Option<String>,
    started_at: Option<String>,
    finished_at: Option<String>,
    worker_id: Option<String>,
    last_error: Option<ErrorOut>,
}

#[derive(Serialize)]
pub struct Detail {
    #[serde(flatten)]
    summary: Summary,
    counted_attempts: u32,
    input: Option<PayloadOut>,
    output: Option<PayloadOut>,
    heartbeat_details: Option<PayloadOut>,
    headers: std::collections::BTreeMap<String, String>,
    concurrency_key: Option<String>,
    fairness_key: Option<String>,
    /// Why a due SCHEDULED activity is held back by a limit, if one is.
    waiting_reason: Option<String>,
    history: Vec<AttemptOut>,
}

#[derive(Serialize)]
pub struct AttemptOut {
    attempt: u32,
    worker_id: String,
    identity: String,
    node: String,
    started_at: Option<String>,
    ended_at: Option<String>,
    outcome: String,
    error: Option<ErrorOut>,
}

/// `InvalidArgument` → `INVALID_ARGUMENT`: gRPC's own spelling of a code.
pub fn screaming(camel: &str) -> String {
    let mut out = String::with_capacity(camel.len() + 4);
    for (i, c) in camel.chars().enumerate() {
        if c.is_ascii_uppercase() && i > 0 {
            out.push('_');
        }
        out.push(c.to_ascii_uppercase());
    }
    out
}

/// A status filter by name; empty for any.
pub fn status_from_name(name: &str) -> Result<ActivityStatus, Error> {
    if name.is_empty() {
        return Ok(ActivityStatus::Unspecified);
    }
    [
        ActivityStatus::Scheduled,
        ActivityStatus::Running,
        ActivityStatus::Completed,
        ActivityStatus::Failed,
        ActivityStatus::Cancelled,
    ]
    .into_iter()
    .find(|s| status_name(*s).eq_ignore_ascii_case(name))
    .ok_or_else(|| {
        Error::InvalidArgument(format!(
            "status {name:?} is not one of SCHEDULED, RUNNING, COMPLETED, FAILED, CANCELLED"
        ))
    })
}

fn time(t: Option<prost_types::Timestamp>) -> Option<String> {
    t.map(|t| t.to_string())
}

fn payload(p: Option<v1::Payload>) -> Option<PayloadOut> {
    let p = p?;
    let size = p.data.len();
    let cut = &p.data[..size.min(MAX_TEXT)];
    Some(PayloadOut {
        content_type: p.content_type,
        size,
        text: String::from_utf8_lossy(cut).into_owned(),
        truncated: size > MAX_TEXT,
    })
}

fn error(e: Option<v1::ActivityError>, with_details: bool) -> Option<ErrorOut> {
    let e = e?;
    let kind = match v1::ErrorKind::try_from(e.kind) {
        Ok(v1::ErrorKind::Retryable) => "RETRYABLE",
        Ok(v1::ErrorKind::Terminal) => "TERMINAL",
        Ok(v1::ErrorKind::WorkerLost) => "WORKER_LOST",
        Ok(v1::ErrorKind::Timeout) => "TIMEOUT",
        _ => "UNSPECIFIED",
    };
    Some(ErrorOut {
        r#type: e.r#type,
        message: e.message,
        kind,
        details: if with_details {
            payload(e.details)
        } else {
            None
        },
    })
}

fn status(raw: i32) -> &'static str {
    status_name(ActivityStatus::try_from(raw).unwrap_or(ActivityStatus::Unspecified))
}

fn summary_of(a: &mut v1::Activity, with_details: bool) -> Summary {
    let key = a.key.take().unwrap_or_default();
    Summary {
        namespace: key.namespace,
        workflow_id: key.workflow_id,
        activity_id: key.activity_id,
        activity_type: std::mem::take(&mut a.activity_type),
        status: status(a.status),
        attempt: a.attempt,
        max_attempts: a.max_attempts,
        created_at: time(a.created_at.take()),
        next_at: time(a.next_at.take()),
        started_at: time(a.started_at.take()),
        finished_at: time(a.finished_at.take()),
        worker_id: Some(std::mem::take(&mut a.worker_id)).filter(|w| !w.is_empty()),
        last_error: error(a.last_error.take(), with_details),
    }
}

pub fn summary(mut a: v1::Activity) -> Summary {
    summary_of(&mut a, false)
}

pub fn detail(mut a: v1::Activity) -> Detail {
    let summary = summary_of(&mut a, true);
    Detail {
        summary,
        counted_attempts: a.counted_attempts,
        input: payload(a.input),
        output: payload(a.output),
        heartbeat_details: payload(a.heartbeat_details),
        headers: a.headers.into_iter().collect(),
        concurrency_key: Some(a.concurrency_key).filter(|k| !k.is_empty()),
        fairness_key: Some(a.fairness_key).filter(|k| !k.is_empty()),
        waiting_reason: Some(a.waiting_reason).filter(|r| !r.is_empty()),
        history: a
            .history
            .into_iter()
            .map(|h| AttemptOut {
                attempt: h.attempt,
                worker_id: h.worker_id,
                identity: h.identity,
                node: h.node,
                started_at: time(h.started_at),
                ended_at: time(h.ended_at),
                outcome: h.outcome,
                error: error(h.error, true),
            })
            .collect(),
    }
}

/// The overview: totals, and per type the backlog, running and failed counts with
/// this node's completions per minute.
pub fn overview(
    namespace: &str,
    stats: v1::StatsResponse,
    counts: Vec<TypeCounts>,
    recent: Vec<(String, [u64; crate::metrics::recent::MINUTES])>,
) -> serde_json::Value {
    let idle = [0u64; crate::metrics::recent::MINUTES];
    let mut types: std::collections::BTreeMap<String, serde_json::Value> = counts
        .into_iter()
        .filter(|c| c.namespace == namespace)
        .map(|c| {
            (
                c.activity_type.clone(),
                serde_json::json!({
                    "activity_type": c.activity_type,
                    "due": c.due,
                    "delayed": c.delayed,
                    "running": c.running,
                    "failed": c.failed,
                    "throughput": idle,
                }),
            )
        })
        .collect();
    for (ty, series) in recent {
        let entry = types.entry(ty.clone()).or_insert_with(|| {
            serde_json::json!({
                "activity_type": ty, "due": 0, "delayed": 0, "running": 0, "failed": 0,
                "throughput": idle,
            })
        });
        entry["throughput"] = serde_json::json!(series);
    }
    serde_json::json!({
        "namespace": namespace,
        "draining": stats.draining,
        "connected_workers": stats.connected_workers,
        "claimed_ahead": stats.claimed_ahead,
        "totals": {
            "scheduled": stats.scheduled,
            "running": stats.running,
            "completed": stats.completed,
            "failed": stats.failed,
            "cancelled": stats.cancelled,
        },
        "types": types.into_values().collect::<Vec<_>>(),
        "throughput_minutes": crate::metrics::recent::MINUTES,
    })
}

pub fn workers(listed: v1::ListWorkersResponse) -> serde_json::Value {
    let workers: Vec<serde_json::Value> = listed
        .workers
        .into_iter()
        .map(|w| {
            serde_json::json!({
                "worker_id": w.worker_id,
                "identity": w.identity,
                "namespace": w.namespace,
                "activity_types": w.activity_types,
                "max_concurrency": w.max_concurrency,
                "in_flight": w.in_flight,
                "connected_at": time(w.connected_at),
                "last_seen_at": time(w.last_seen_at),
                "node": w.node,
            })
        })
        .collect();
    serde_json::json!({ "draining": listed.draining, "workers": workers })
}

pub fn limits(
    rate: v1::ListRateLimitsResponse,
    concurrency: v1::ListConcurrencyLimitsResponse,
    fairness: v1::ListFairnessWeightsResponse,
) -> serde_json::Value {
    let period = |p: Option<prost_types::Duration>| {
        spool_proto::duration::from_proto(p.as_ref())
            .ok()
            .flatten()
            .map(spool_proto::duration::format)
    };
    let rate: Vec<serde_json::Value> = rate
        .rate_limits
        .into_iter()
        .map(|l| {
            serde_json::json!({
                "namespace": l.namespace,
                "activity_type": l.activity_type,
                "concurrency_key": l.concurrency_key,
                "limit": l.limit,
                "period": period(l.period),
                "burst": l.burst,
                "available": l.available,
            })
        })
        .collect();
    let concurrency: Vec<serde_json::Value> = concurrency
        .concurrency_limits
        .into_iter()
        .map(|l| {
            let strategy = match v1::ConcurrencyStrategy::try_from(l.strategy) {
                Ok(v1::ConcurrencyStrategy::CancelNewest) => "cancel newest",
                Ok(v1::ConcurrencyStrategy::CancelInProgress) => "cancel in progress",
                _ => "queue",
            };
            serde_json::json!({
                "namespace": l.namespace,
                "activity_type": l.activity_type,
                "concurrency_key": l.concurrency_key,
                "max_running": l.max_running,
                "weight": l.weight,
                "strategy": strategy,
                "keys": l.keys,
                "running": l.running,
                "held": l.held,
            })
        })
        .collect();
    let fairness: Vec<serde_json::Value> = fairness
        .fairness_weights
        .into_iter()
        .map(|w| {
            serde_json::json!({
                "namespace": w.namespace,
                "activity_type": w.activity_type,
                "fairness_key": w.fairness_key,
                "weight": w.weight,
                "waiting": w.waiting,
                "waiting_truncated": w.waiting_truncated,
            })
        })
        .collect();
    serde_json::json!({
        "rate_limits": rate,
        "concurrency_limits": concurrency,
        "fairness_weights": fairness,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_and_statuses_read_as_grpc_spells_them() {
        assert_eq!(screaming("InvalidArgument"), "INVALID_ARGUMENT");
        assert_eq!(screaming("NotFound"), "NOT_FOUND");
        assert_eq!(
            status_from_name("failed").ok(),
            Some(ActivityStatus::Failed)
        );
        assert_eq!(status_from_name("").ok(), Some(ActivityStatus::Unspecified));
        assert!(status_from_name("DONE").is_err());
    }

    #[test]
    fn a_payload_is_text_cut_at_the_limit() {
        let big = v1::Payload {
            content_type: "text/plain".into(),
            data: vec![b'a'; MAX_TEXT + 10],
        };
        let shown = payload(Some(big)).map(|p| (p.size, p.text.len(), p.truncated));
        assert_eq!(shown, Some((MAX_TEXT + 10, MAX_TEXT, true)));
        let markup = v1::Payload {
            content_type: "application/json".into(),
            data: b"\"<script>alert(1)</script>\"".to_vec(),
        };
        assert_eq!(
            payload(Some(markup)).map(|p| p.text),
            Some("\"<script>alert(1)</script>\"".to_owned()),
            "kept as it is: the page sets it as text"
        );
    }
}
