//! The checker: the history and the final rows against the promise.
//!
//! - every acknowledged activity completed (an activity submitted with
//!   `max_attempts = 1` may instead have failed, if a fault that loses attempts
//!   overlaps its last attempt: that is what the user asked for);
//! - no activity was accepted twice;
//! - no attempt reached a handler twice: one attempt number is one run, so a
//!   second start of it means two nodes (or one node twice) handed out one claim;
//! - an accepted result is the stored one: same attempt, same worker's output;
//! - nothing is left SCHEDULED or RUNNING.
//!
//! It also counts deliveries beyond the first, charged to the latest fault before
//! each: the price of each kind of fault in work done again.

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;
use spool_proto::v1::{ActivityStatus, ErrorKind};

use super::history::{DriverEvent, WorkerEvent};

/// A fault kind whose effect is a planned handover, not a loss: a drain releases
/// what it cannot finish, uncounted.
pub const PLANNED: &[&str] = &["node-term"];

/// Fault windows are widened by this much on each side when explaining a failure:
/// the server's and the driver's stamps of one moment differ a little.
const SLACK_MS: i64 = 1_500;

/// What the store holds of one activity at the end.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub status: ActivityStatus,
    pub attempt: u32,
    /// The worker incarnation and attempt the stored output names, if it parses.
    pub output: Option<(String, u32)>,
    pub error_kind: Option<ErrorKind>,
    pub started_at: Option<i64>,
    pub finished_at: Option<i64>,
}

#[derive(Debug, Default, Serialize)]
pub struct Verdict {
    pub acknowledged: usize,
    pub unknown_submits: usize,
    pub completed: usize,
    /// `max_attempts = 1` activities that failed with a fault to explain it.
    pub failed_as_asked: usize,
    pub deliveries: usize,
    /// Completed, but no worker logged the accepting ack (it died first).
    pub ack_unseen: usize,
    pub lost: Vec<String>,
    pub twice: Vec<String>,
    /// `key#attempt` that reached a handler more than once.
    pub ran_twice: Vec<String>,
    pub wrong_attempt: Vec<String>,
    pub unexplained_failures: Vec<String>,
    pub left_unfinished: Vec<String>,
    /// Fault kind: (faults injected, deliveries beyond the first charged to it).
    pub faults: BTreeMap<String, (usize, usize)>,
}

impl Verdict {
    pub fn passed(&self) -> bool {
        self.lost.is_empty()
            && self.twice.is_empty()
            && self.ran_twice.is_empty()
            && self.wrong_attempt.is_empty()
            && self.unexplained_failures.is_empty()
            && self.left_unfinished.is_empty()
    }

    /// One line per broken promise, with a few examples each.
    pub fn failures(&self) -> Vec<String> {
        let mut out = Vec::new();
        for (what, keys) in [
            ("acknowledged but not completed", &self.lost),
            ("accepted twice", &self.twice),
            ("one attempt started twice", &self.ran_twice),
            (
                "accepted attempt is not the stored one",
                &self.wrong_attempt,
            ),
            (
                "failed with no fault to explain it",
                &self.unexplained_failures,
            ),
            ("left scheduled or running", &self.left_unfinished),
        ] {
            if !keys.is_empty() {
                let shown: Vec<&str> = keys.iter().take(5).map(String::as_str).collect();
                out.push(format!("{} {what} (e.g. {})", keys.len(), shown.join(", ")));
            }
        }
        out
    }
}

pub fn check(
    driver: &[DriverEvent],
    workers: &[WorkerEvent],
    rows: &HashMap<String, Row>,
) -> Verdict {
    let mut v = Verdict::default();
    let faults: Vec<(&str, i64, i64)> = driver
        .iter()
        .filter_map(|e| match e {
            DriverEvent::Fault { kind, t, until, .. } => Some((kind.as_str(), *t, *until)),
            _ => None,
        })
        .collect();
    for (kind, _, _) in &faults {
        v.faults.entry((*kind).to_owned()).or_default().0 += 1;
    }

    let mut accepted: HashMap<&str, Vec<(u32, &str)>> = HashMap::new();
    let mut starts: HashMap<&str, Vec<i64>> = HashMap::new();
    let mut runs: HashMap<(&str, u32), usize> = HashMap::new();
    for e in workers {
        match e {
            WorkerEvent::Start { k, n, t, .. } => {
                starts.entry(k).or_default().push(*t);
                *runs.entry((k, *n)).or_default() += 1;
            }
            WorkerEvent::Ack {
                k, n, ok: true, w, ..
            } => accepted.entry(k).or_default().push((*n, w)),
            WorkerEvent::Ack { .. } => {}
        }
    }

    for e in driver {
        match e {
            DriverEvent::Submitted { k, once, .. } => {
                v.acknowledged += 1;
                match rows.get(k) {
                    None => v.lost.push(k.clone()),
                    Some(row) => match row.status {
                        ActivityStatus::Completed => v.completed += 1,
                        ActivityStatus::Failed if *once => {
                            if explained(row, &faults) {
                                v.failed_as_asked += 1;
                            } else {
                                v.unexplained_failures.push(k.clone());
                            }
                        }
                        ActivityStatus::Scheduled | ActivityStatus::Running => {}
                        _ => v.lost.push(k.clone()),
                    },
                }
            }
            DriverEvent::Unknown { .. } => v.unknown_submits += 1,
            DriverEvent::Fault { .. } => {}
        }
    }
    let mut unfinished: Vec<&String> = rows
        .iter()
        .filter(|(_, r)| {
            matches!(
                r.status,
                ActivityStatus::Scheduled | ActivityStatus::Running
            )
        })
        .map(|(k, _)| k)
        .collect();
    unfinished.sort();
    v.left_unfinished = unfinished.into_iter().cloned().collect();

    let mut keys: Vec<&&str> = accepted.keys().collect();
    keys.sort();
    for k in keys {
        let acks = &accepted[*k];
        if acks.len() > 1 {
            v.twice.push((*k).to_owned());
        }
        for (n, w) in acks {
            let stored = rows.get(*k);
            let matches = stored.is_some_and(|r| {
                r.status == ActivityStatus::Completed
                    && r.attempt == *n
                    && r.output.as_ref() == Some(&((*w).to_owned(), *n))
            });
            if !matches {
                v.wrong_attempt.push(format!("{k}#{n}"));
            }
        }
    }
    let mut ran_twice: Vec<String> = runs
        .into_iter()
        .filter(|(_, count)| *count > 1)
        .map(|((k, n), _)| format!("{k}#{n}"))
        .collect();
    ran_twice.sort();
    v.ran_twice = ran_twice;
    for (k, row) in rows {
        if row.status == ActivityStatus::Completed && !accepted.contains_key(k.as_str()) {
            v.ack_unseen += 1;
        }
    }

    for times in starts.values_mut() {
        times.sort_unstable();
        v.deliveries += times.len();
        for t in times.iter().skip(1) {
            let kind = faults
                .iter()
                .filter(|(_, start, _)| start <= t)
                .max_by_key(|(_, start, _)| *start)
                .map_or("none", |(kind, _, _)| *kind);
            v.faults.entry(kind.to_owned()).or_default().1 += 1;
        }
    }
    v
}

/// A failed attempt is explained by a fault that loses attempts overlapping it.
fn explained(row: &Row, faults: &[(&str, i64, i64)]) -> bool {
    if !matches!(
        row.error_kind,
        Some(ErrorKind::WorkerLost | ErrorKind::Timeout)
    ) {
        return false;
    }
    let (Some(from), Some(to)) = (row.started_at, row.finished_at) else {
        return false;
    };
    faults.iter().any(|(kind, t, until)| {
        !PLANNED.contains(kind) && *t <= to + SLACK_MS && *until >= from - SLACK_MS
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn submitted(k: &str, once: bool) -> DriverEvent {
        DriverEvent::Submitted {
            k: k.into(),
            once,
            t: 0,
        }
    }

    fn fault(kind: &str, t: i64, until: i64) -> DriverEvent {
        DriverEvent::Fault {
            kind: kind.into(),
            target: "n0".into(),
            t,
            until,
        }
    }

    fn start(k: &str, n: u32, t: i64) -> WorkerEvent {
        WorkerEvent::Start {
            k: k.into(),
            n,
            w: "w0.0".into(),
            t,
        }
    }

    fn ack(k: &str, n: u32, w: &str) -> WorkerEvent {
        WorkerEvent::Ack {
            k: k.into(),
            n,
            ok: true,
            w: w.into(),
            t: 0,
        }
    }

    fn completed(n: u32, by: &str) -> Row {
        Row {
            status: ActivityStatus::Completed,
            attempt: n,
            output: Some((by.into(), n)),
            error_kind: None,
            started_at: Some(0),
            finished_at: Some(10),
        }
    }

    fn failed(kind: ErrorKind, started: i64, finished: i64) -> Row {
        Row {
            status: ActivityStatus::Failed,
            attempt: 1,
            output: None,
            error_kind: Some(kind),
            started_at: Some(started),
            finished_at: Some(finished),
        }
    }

    fn rows(items: Vec<(&str, Row)>) -> HashMap<String, Row> {
        items.into_iter().map(|(k, r)| (k.to_owned(), r)).collect()
    }

    #[test]
    fn a_clean_history_passes_and_counts_extra_deliveries_by_fault() {
        let driver = vec![
            submitted("a", false),
            submitted("b", false),
            fault("worker-kill", 100, 200),
        ];
        let workers = vec![
            start("a", 1, 50),
            start("a", 2, 150),
            ack("a", 2, "w1.0"),
            start("b", 1, 10),
            ack("b", 1, "w0.0"),
        ];
        let v = check(
            &driver,
            &workers,
            &rows(vec![
                ("a", completed(2, "w1.0")),
                ("b", completed(1, "w0.0")),
            ]),
        );
        assert!(v.passed(), "{:?}", v.failures());
        assert_eq!((v.acknowledged, v.completed, v.deliveries), (2, 2, 3));
        assert_eq!(v.faults.get("worker-kill"), Some(&(1, 1)));
    }

    #[test]
    fn each_broken_promise_is_reported() {
        let driver = vec![
            submitted("missing", false),
            submitted("failed", false),
            submitted("twice", false),
            submitted("stale", false),
            submitted("running", false),
            submitted("claimed-twice", false),
        ];
        let workers = vec![
            start("claimed-twice", 1, 10),
            start("claimed-twice", 1, 12),
            ack("claimed-twice", 1, "w0.0"),
            ack("twice", 1, "w0.0"),
            ack("twice", 2, "w1.0"),
            ack("stale", 1, "w0.0"),
        ];
        let mut running = completed(1, "w0.0");
        running.status = ActivityStatus::Running;
        let v = check(
            &driver,
            &workers,
            &rows(vec![
                ("failed", failed(ErrorKind::WorkerLost, 0, 10)),
                ("twice", completed(2, "w1.0")),
                ("stale", completed(2, "w1.0")),
                ("running", running),
                ("claimed-twice", completed(1, "w0.0")),
            ]),
        );
        assert!(!v.passed());
        assert_eq!(v.ran_twice, ["claimed-twice#1"]);
        assert_eq!(v.lost, ["missing", "failed"]);
        assert_eq!(v.twice, ["twice"]);
        assert_eq!(v.wrong_attempt, ["stale#1", "twice#1"]);
        assert_eq!(v.left_unfinished, ["running"]);
    }

    #[test]
    fn a_single_attempt_failure_needs_a_losing_fault_over_its_attempt() {
        let driver = vec![
            submitted("lost-worker", true),
            submitted("drained", true),
            submitted("handler-error", true),
            fault("worker-kill", 1_000, 1_100),
            fault("node-term", 20_000, 21_000),
        ];
        let v = check(
            &driver,
            &[],
            &rows(vec![
                ("lost-worker", failed(ErrorKind::WorkerLost, 900, 1_200)),
                ("drained", failed(ErrorKind::WorkerLost, 19_900, 20_500)),
                ("handler-error", failed(ErrorKind::Retryable, 900, 1_200)),
            ]),
        );
        assert_eq!(v.failed_as_asked, 1);
        assert_eq!(v.unexplained_failures, ["drained", "handler-error"]);
    }
}
