//! How the client commands print: an activity, its history, tables and JSON,
//! the same shapes in every command.

use std::fmt::Write as _;

use spool_proto::v1::{self, ActivityStatus};

/// A key as the CLI prints it, and reads it back: NAMESPACE/WORKFLOW_ID/ACTIVITY_ID.
pub(super) fn key_text(key: Option<&v1::ActivityKey>) -> String {
    let key = key.cloned().unwrap_or_default();
    format!("{}/{}/{}", key.namespace, key.workflow_id, key.activity_id)
}

pub(super) fn status_label(status: i32) -> String {
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
pub(super) fn format_time(ts: &prost_types::Timestamp) -> String {
    ts.to_string()
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

pub(super) fn activity_json(a: &v1::Activity) -> serde_json::Value {
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
        "last_error": a.last_error.as_ref().map(error_json),
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

fn error_json(e: &v1::ActivityError) -> serde_json::Value {
    serde_json::json!({
        "kind": error_kind_label(e.kind), "type": e.r#type, "message": e.message,
        "details": e.details.as_ref().map(payload_json),
    })
}

pub(super) fn activity_text(a: &v1::Activity) -> String {
    let mut out = String::new();
    let mut line = |k: &str, v: String| {
        if !v.is_empty() {
            let _ = writeln!(out, "{k:<13} {v}");
        }
    };
    let time = |t: &Option<prost_types::Timestamp>| t.as_ref().map(format_time).unwrap_or_default();
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
    line("created_at", time(&a.created_at));
    line("next_at", time(&a.next_at));
    line("started_at", time(&a.started_at));
    line("finished_at", time(&a.finished_at));
    line("worker_id", a.worker_id.clone());
    out
}

pub(super) fn attempt_json(a: &v1::AttemptRecord) -> serde_json::Value {
    serde_json::json!({
        "attempt": a.attempt,
        "outcome": a.outcome,
        "started_at": a.started_at.as_ref().map(format_time),
        "ended_at": a.ended_at.as_ref().map(format_time),
        "worker_id": a.worker_id,
        "identity": a.identity,
        "node": a.node,
        "error": a.error.as_ref().map(error_json),
    })
}

/// The attempt history as a table, oldest first.
pub(super) fn history_text(history: &[v1::AttemptRecord]) -> String {
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

/// An error on one line of a table: its type and the start of its message.
pub(super) fn short_error(e: &v1::ActivityError) -> String {
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

pub(super) fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
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

pub(super) fn print_json(value: &serde_json::Value) {
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
    fn tables_align() {
        let t = table(&["A", "BB"], &[vec!["long".into(), "x".into()]]);
        assert_eq!(t, "A     BB\nlong  x\n");
    }
}
