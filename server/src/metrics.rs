//! Prometheus metrics, served at `/metrics` on `--metrics-listen` when set.
//!
//! Per type (labels `namespace` and `activity_type`): gauges `backlog{state}` (due
//! now, or delayed), `running` and `dead_letters` (refreshed every few seconds from
//! the store), histograms `pickup_seconds` (due to dispatched) and `run_seconds`
//! (an attempt's start to its end), and the counter `outcomes_total{outcome}` (how
//! attempts ended: completed, retried, failed, timed_out, lost, cancelled, snoozed,
//! released; and dead_lettered, counted once more when an activity becomes FAILED).
//! Label cardinality is bounded: the first `--metrics-max-types` (namespace, type)
//! pairs seen get their own labels, later ones are counted as `_other`/`_other`.
//! `worker_slots{namespace,group,state}` (used/free slots of the sessions serving
//! one set of types, `group` their types joined by `+`, bounded the same way), and
//! `build_info{version}`.
//!
//! Node-wide: counters `submitted_total`, `dispatched_total`,
//! `finished_total{transition}` (completed, retried, snoozed, failed, released),
//! `results_refused_total`, `cancelled_total`, `workers_lost_total`,
//! `timeouts_total{kind}`, `commit_batches_total`, `commit_ops_total`,
//! `commit_failures_total`, `rows_unreadable_total{read}` (stored rows a read left
//! out because they cannot be decoded), `connections_refused_total{reason}`;
//! histogram `commit_seconds` (one write transaction); gauges `workers_connected`,
//! `attempts_running`, `connections_open`.
//!
//! Without `--metrics-listen` no recorder is installed and every update is a no-op.

use std::{
    collections::HashSet,
    net::SocketAddr,
    sync::{
        Mutex, OnceLock,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
};

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};

use crate::store::{AttemptOutcome, TypeCounts};

/// The default of `--metrics-max-types`.
pub const DEFAULT_MAX_TYPES: usize = 100;

/// What stands for the (namespace, type) pairs past the cap.
const OTHER: &str = "_other";

static ENABLED: AtomicBool = AtomicBool::new(false);
static MAX_TYPES: AtomicUsize = AtomicUsize::new(DEFAULT_MAX_TYPES);
static LABELLED: OnceLock<Mutex<HashSet<(String, String)>>> = OnceLock::new();

/// Installs the process-wide recorder and starts the HTTP listener, with at most
/// `max_types` (namespace, type) label pairs. Call once, from the binary, inside
/// the runtime.
pub fn serve(
    addr: SocketAddr,
    max_types: usize,
) -> Result<(), metrics_exporter_prometheus::BuildError> {
    PrometheusBuilder::new()
        .with_http_listener(addr)
        .set_buckets(&[
            0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1.0,
        ])?
        // Pickup waits and run times span milliseconds to hours.
        .set_buckets_for_metric(
            Matcher::Full("spool_pickup_seconds".to_owned()),
            &[
                0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 60.0, 300.0, 1800.0, 3600.0,
            ],
        )?
        .set_buckets_for_metric(
            Matcher::Full("spool_run_seconds".to_owned()),
            &[
                0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 60.0, 300.0, 1800.0, 3600.0,
            ],
        )?
        .install()?;
    MAX_TYPES.store(max_types, Ordering::Relaxed);
    ENABLED.store(true, Ordering::Relaxed);
    describe();
    metrics::gauge!("spool_build_info", "version" => env!("CARGO_PKG_VERSION")).set(1.0);
    Ok(())
}

/// Whether a recorder is installed: the store is only read for gauges then.
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

fn describe() {
    use metrics::{Unit, describe_counter, describe_gauge, describe_histogram};
    describe_gauge!("spool_build_info", "The server's version (always 1).");
    describe_gauge!(
        "spool_backlog",
        "SCHEDULED activities by namespace and type: state=due (claimable now) or delayed (a delay or a retry backoff)."
    );
    describe_gauge!("spool_running", "RUNNING activities by namespace and type.");
    describe_gauge!(
        "spool_dead_letters",
        "FAILED activities kept (until retention), by namespace and type."
    );
    describe_histogram!(
        "spool_pickup_seconds",
        Unit::Seconds,
        "From when an attempt was due to when it was dispatched to a worker."
    );
    describe_histogram!(
        "spool_run_seconds",
        Unit::Seconds,
        "From an attempt's dispatch to its end (result, timeout, loss, cancel)."
    );
    describe_counter!(
        "spool_outcomes_total",
        "How attempts ended (completed, retried, failed, timed_out, lost, cancelled, snoozed, released), and dead_lettered: activities that became FAILED."
    );
    describe_gauge!(
        "spool_worker_slots",
        "Slots of connected worker sessions, state=used or free, by namespace and group (the types a session serves, joined by +)."
    );
    describe_gauge!(
        "spool_rate_limit_available",
        "Rows a type's rate limit would let a claim take now."
    );
    describe_gauge!(
        "spool_limit_held",
        "Due SCHEDULED activities a limit holds back, limit=rate (the bucket is empty) or concurrency (their key is at its limit)."
    );
    describe_gauge!(
        "spool_concurrency_keys",
        "Concurrency keys of a limited type with activities waiting or running."
    );
    describe_gauge!(
        "spool_concurrency_running",
        "RUNNING activities with a concurrency key, of a limited type."
    );
    describe_counter!(
        "spool_claims_throttled_total",
        "Claims a type's rate limit held back, by namespace and type."
    );
    describe_counter!("spool_submitted_total", "Activities stored by submits.");
    describe_counter!("spool_dispatched_total", "Attempts sent to workers.");
    describe_counter!(
        "spool_finished_total",
        "Results written, by transition (completed, retried, snoozed, failed, released)."
    );
    describe_counter!(
        "spool_results_refused_total",
        "Results that came too late or twice: their attempt had already ended."
    );
    describe_counter!("spool_cancelled_total", "Activities cancelled.");
    describe_counter!(
        "spool_workers_lost_total",
        "Worker sessions that ended without answering their attempts."
    );
    describe_counter!(
        "spool_timeouts_total",
        "Attempts ended by a timeout, by kind."
    );
    describe_node();
}

/// HELP of the node-wide families: the committer, connections, sessions.
fn describe_node() {
    use metrics::{Unit, describe_counter, describe_gauge, describe_histogram};
    describe_counter!("spool_commit_batches_total", "Write transactions.");
    describe_counter!("spool_commit_ops_total", "Writes, in all transactions.");
    describe_counter!(
        "spool_commit_failures_total",
        "Write transactions that failed."
    );
    describe_histogram!(
        "spool_commit_seconds",
        Unit::Seconds,
        "How long one write transaction took."
    );
    describe_counter!(
        "spool_rows_unreadable_total",
        "Stored rows a read left out because they cannot be decoded."
    );
    describe_counter!(
        "spool_connections_refused_total",
        "Connections and streams refused by a limit, by reason."
    );
    describe_counter!(
        "spool_peer_events_dropped_total",
        "Committed batches whose events for other nodes were dropped: publication fell behind."
    );
    describe_gauge!(
        "spool_workers_connected",
        "Worker sessions connected to this node."
    );
    describe_gauge!(
        "spool_attempts_running",
        "Attempts running on this node's workers."
    );
    describe_gauge!("spool_connections_open", "Open client connections.");
    describe_counter!(
        "spool_sessions_detached_total",
        "Worker streams that dropped with their session kept for a resume (--resume-grace)."
    );
    describe_counter!(
        "spool_sessions_resumed_total",
        "Worker sessions resumed on a new stream."
    );
    describe_counter!(
        "spool_attempts_reattached_total",
        "Attempts a resumed session kept: not lost, not retried."
    );
    describe_counter!(
        "spool_tasks_resent_total",
        "Tasks sent again to a resumed worker that had not received them."
    );
    describe_counter!(
        "spool_resumes_refused_total",
        "Resumes refused, by reason (unknown_session, bad_ticket, registration_changed)."
    );
}

/// The labels of `(namespace, activity_type)`: themselves while under the cap,
/// `_other` past it, so a caller inventing types cannot grow the scrape for ever.
fn labels(namespace: &str, activity_type: &str) -> (String, String) {
    let labelled = LABELLED.get_or_init(Default::default);
    let mut set = labelled.lock().unwrap_or_else(|e| e.into_inner());
    let pair = (namespace.to_owned(), activity_type.to_owned());
    if set.contains(&pair) || set.len() < MAX_TYPES.load(Ordering::Relaxed) {
        set.insert(pair.clone());
        pair
    } else {
        (OTHER.to_owned(), OTHER.to_owned())
    }
}

/// An attempt of this type was dispatched `waited` seconds after it was due.
pub fn picked_up(namespace: &str, activity_type: &str, waited: f64) {
    if !enabled() {
        return;
    }
    let (ns, ty) = labels(namespace, activity_type);
    metrics::histogram!("spool_pickup_seconds", "namespace" => ns, "activity_type" => ty)
        .record(waited.max(0.0));
}

/// A claim of this type took fewer rows than it could have: its rate limit
/// held the rest back.
pub fn throttled(namespace: &str, activity_type: &str) {
    if !enabled() {
        return;
    }
    let (ns, ty) = labels(namespace, activity_type);
    metrics::counter!("spool_claims_throttled_total", "namespace" => ns, "activity_type" => ty)
        .increment(1);
}

/// An attempt of this type ran for `ran` seconds and ended so; `dead_lettered` when
/// the activity became FAILED with it.
pub fn attempt_ended(
    namespace: &str,
    activity_type: &str,
    outcome: AttemptOutcome,
    ran: Option<f64>,
    dead_lettered: bool,
) {
    if outcome == AttemptOutcome::Completed {
        recent::completed(namespace, activity_type);
    }
    if !enabled() {
        return;
    }
    let (ns, ty) = labels(namespace, activity_type);
    if let Some(ran) = ran {
        metrics::histogram!("spool_run_seconds", "namespace" => ns.clone(), "activity_type" => ty.clone())
            .record(ran.max(0.0));
    }
    if dead_lettered {
        metrics::counter!("spool_outcomes_total", "namespace" => ns.clone(), "activity_type" => ty.clone(), "outcome" => "dead_lettered")
            .increment(1);
    }
    metrics::counter!("spool_outcomes_total", "namespace" => ns, "activity_type" => ty, "outcome" => outcome.name())
        .increment(1);
}

/// Sets the per-type gauges from a fresh count. Pairs counted before but absent now
/// drop to zero rather than keeping their last value.
pub fn type_counts(counts: &[TypeCounts], seen: &mut HashSet<(String, String)>) {
    let mut totals: std::collections::HashMap<(String, String), [u64; 4]> = Default::default();
    for c in counts {
        let t = totals
            .entry(labels(&c.namespace, &c.activity_type))
            .or_default();
        t[0] += c.due;
        t[1] += c.delayed;
        t[2] += c.running;
        t[3] += c.failed;
    }
    for pair in seen.iter() {
        totals.entry(pair.clone()).or_default();
    }
    for ((ns, ty), [due, delayed, running, failed]) in totals {
        set_type_gauges(
            &ns,
            &ty,
            &[
                ("spool_backlog", Some(("state", "due")), due),
                ("spool_backlog", Some(("state", "delayed")), delayed),
                ("spool_running", None, running),
                ("spool_dead_letters", None, failed),
            ],
        );
        seen.insert((ns, ty));
    }
}

/// Sets the per-limit gauges: what each rate limit's bucket holds now and the due
/// rows of its type while it holds none, and each concurrency limit's keys, their
/// running rows and the rows held back at the limit. As with the types, a limit
/// gone drops to zero.
pub fn limits(
    rate: &[crate::store::rate::RateLimitUse],
    concurrency: &[crate::store::concurrency::ConcurrencyLimit],
    counts: &[TypeCounts],
    seen: &mut HashSet<(String, String)>,
) {
    // [available, rate-held, keys, running, concurrency-held]
    let mut totals: std::collections::HashMap<(String, String), [u64; 5]> = Default::default();
    // A key's own bucket is not the type's: its use shows in the lists.
    for used in rate.iter().filter(|u| u.limit.key.is_none()) {
        let (ns, ty) = (&used.limit.namespace, &used.limit.activity_type);
        let due: u64 = counts
            .iter()
            .filter(|c| &c.namespace == ns && &c.activity_type == ty)
            .map(|c| c.due)
            .sum();
        let t = totals.entry(labels(ns, ty)).or_default();
        t[0] += u64::from(used.available);
        t[1] += if used.available == 0 { due } else { 0 };
    }
    // A key's own limit counts where its type has none (the type's counts hold
    // its keys already).
    let typed: HashSet<(&str, &str)> = concurrency
        .iter()
        .filter(|l| l.key.is_none())
        .map(|l| (l.namespace.as_str(), l.activity_type.as_str()))
        .collect();
    for limit in concurrency.iter().filter(|l| {
        l.key.is_none() || !typed.contains(&(l.namespace.as_str(), l.activity_type.as_str()))
    }) {
        let t = totals
            .entry(labels(&limit.namespace, &limit.activity_type))
            .or_default();
        t[2] += limit.keys;
        t[3] += limit.running;
        t[4] += limit.held;
    }
    for pair in seen.iter() {
        totals.entry(pair.clone()).or_default();
    }
    for ((ns, ty), [available, rate_held, keys, running, held]) in totals {
        set_type_gauges(
            &ns,
            &ty,
            &[
                ("spool_rate_limit_available", None, available),
                ("spool_limit_held", Some(("limit", "rate")), rate_held),
                ("spool_limit_held", Some(("limit", "concurrency")), held),
                ("spool_concurrency_keys", None, keys),
                ("spool_concurrency_running", None, running),
            ],
        );
        seen.insert((ns, ty));
    }
}

/// A gauge of a namespace's type: its name, a label of its own if it has one,
/// and its value.
type TypeGauge = (&'static str, Option<(&'static str, &'static str)>, u64);

fn set_type_gauges(ns: &str, ty: &str, gauges: &[TypeGauge]) {
    for &(name, own, value) in gauges {
        let mut labels = vec![
            metrics::Label::new("namespace", ns.to_owned()),
            metrics::Label::new("activity_type", ty.to_owned()),
        ];
        labels.extend(own.map(|(key, value)| metrics::Label::new(key, value)));
        metrics::gauge!(name, labels).set(value as f64);
    }
}

/// Used and free slots of a worker group (`namespace`, its types).
pub fn worker_slots(
    groups: &[crate::dispatch::registry::GroupSlots],
    seen: &mut HashSet<(String, String)>,
) {
    let mut totals: std::collections::HashMap<(String, String), (u64, u64)> = Default::default();
    for g in groups {
        let t = totals.entry(labels(&g.namespace, &g.group)).or_default();
        t.0 += g.used;
        t.1 += g.free;
    }
    for pair in seen.iter() {
        totals.entry(pair.clone()).or_default();
    }
    for ((ns, group), (used, free)) in totals {
        metrics::gauge!("spool_worker_slots", "namespace" => ns.clone(), "group" => group.clone(), "state" => "used")
            .set(used as f64);
        metrics::gauge!("spool_worker_slots", "namespace" => ns.clone(), "group" => group.clone(), "state" => "free")
            .set(free as f64);
        seen.insert((ns, group));
    }
}

pub fn submitted(n: u64) {
    metrics::counter!("spool_submitted_total").increment(n);
}

pub fn dispatched(n: u64) {
    metrics::counter!("spool_dispatched_total").increment(n);
}

pub fn finished(transition: &'static str) {
    // Once an activity: without a recorder, the key is not worth building.
    if !enabled() {
        return;
    }
    metrics::counter!("spool_finished_total", "transition" => transition).increment(1);
}

pub fn result_refused() {
    metrics::counter!("spool_results_refused_total").increment(1);
}

pub fn cancelled() {
    metrics::counter!("spool_cancelled_total").increment(1);
}

pub fn worker_lost() {
    metrics::counter!("spool_workers_lost_total").increment(1);
}

pub fn timed_out(kind: &'static str) {
    metrics::counter!("spool_timeouts_total", "kind" => kind).increment(1);
}

pub fn commit(ops: usize, seconds: f64, ok: bool) {
    metrics::counter!("spool_commit_batches_total").increment(1);
    metrics::counter!("spool_commit_ops_total").increment(ops as u64);
    metrics::histogram!("spool_commit_seconds").record(seconds);
    if !ok {
        metrics::counter!("spool_commit_failures_total").increment(1);
    }
}

pub fn liveness(workers: usize, running: usize) {
    metrics::gauge!("spool_workers_connected").set(workers as f64);
    metrics::gauge!("spool_attempts_running").set(running as f64);
}

/// A committed batch's events for other nodes were dropped: the publisher's
/// queue was full.
pub fn peer_events_dropped() {
    metrics::counter!("spool_peer_events_dropped_total").increment(1);
}

pub fn connections_refused(reason: &'static str) {
    metrics::counter!("spool_connections_refused_total", "reason" => reason).increment(1);
}

pub fn connection_opened() {
    metrics::gauge!("spool_connections_open").increment(1.0);
}

pub fn connection_closed() {
    metrics::gauge!("spool_connections_open").decrement(1.0);
}

/// Completions per minute of each type over the last few minutes, on this node:
/// what the dashboard's overview draws. Kept whether or not metrics are served;
/// bounded like the labels (past the cap, new types are not tracked).
pub mod recent {
    use std::{
        collections::HashMap,
        sync::{Mutex, OnceLock},
    };

    /// How many minutes are kept, the current one included.
    pub const MINUTES: usize = 10;

    #[derive(Default)]
    struct Ring {
        /// The minute (since the epoch) of `counts[0]`'s slot rotation.
        minute: i64,
        counts: [u64; MINUTES],
    }

    impl Ring {
        /// Moves the ring to `minute`, zeroing the minutes skipped.
        fn advance(&mut self, minute: i64) {
            let gap = minute.saturating_sub(self.minute);
            if gap <= 0 {
                return;
            }
            for i in 1..=gap.min(MINUTES as i64) {
                let slot = (self.minute + i).rem_euclid(MINUTES as i64) as usize;
                self.counts[slot] = 0;
            }
            self.minute = minute;
        }

        /// Oldest first, ending with `minute`.
        fn series(&self, minute: i64) -> [u64; MINUTES] {
            let mut out = [0; MINUTES];
            for (i, value) in out.iter_mut().enumerate() {
                let m = minute - (MINUTES as i64 - 1) + i as i64;
                if m <= self.minute && m > self.minute - MINUTES as i64 {
                    *value = self.counts[m.rem_euclid(MINUTES as i64) as usize];
                }
            }
            out
        }
    }

    type Rings = foldhash::HashMap<String, foldhash::HashMap<String, Ring>>;
    static RINGS: OnceLock<Mutex<Rings>> = OnceLock::new();

    fn minute_now() -> i64 {
        spool_proto::time::now_millis().div_euclid(60_000)
    }

    pub(super) fn completed(namespace: &str, activity_type: &str) {
        let minute = minute_now();
        let mut rings = RINGS
            .get_or_init(Default::default)
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let tracked: usize = rings.values().map(HashMap::len).sum();
        let of_namespace = match rings.get_mut(namespace) {
            Some(types) => types,
            None if tracked < super::MAX_TYPES.load(std::sync::atomic::Ordering::Relaxed) => {
                rings.entry(namespace.to_owned()).or_default()
            }
            None => return,
        };
        let ring = match of_namespace.get_mut(activity_type) {
            Some(ring) => ring,
            None if tracked < super::MAX_TYPES.load(std::sync::atomic::Ordering::Relaxed) => {
                of_namespace
                    .entry(activity_type.to_owned())
                    .or_insert(Ring {
                        minute,
                        counts: [0; MINUTES],
                    })
            }
            None => return,
        };
        ring.advance(minute);
        ring.counts[minute.rem_euclid(MINUTES as i64) as usize] += 1;
    }

    /// Each type of `namespace` with completions in the last [`MINUTES`] minutes,
    /// oldest minute first.
    pub fn completions(namespace: &str) -> Vec<(String, [u64; MINUTES])> {
        let minute = minute_now();
        let rings = RINGS
            .get_or_init(Default::default)
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let mut out: Vec<(String, [u64; MINUTES])> = rings
            .get(namespace)
            .map(|types| {
                types
                    .iter()
                    .map(|(ty, ring)| (ty.clone(), ring.series(minute)))
                    .filter(|(_, series)| series.iter().any(|n| *n > 0))
                    .collect()
            })
            .unwrap_or_default();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn a_ring_keeps_the_last_minutes_and_forgets_older_ones() {
            let mut ring = Ring {
                minute: 100,
                counts: [0; MINUTES],
            };
            ring.counts[0] = 3; // minute 100
            ring.advance(101);
            ring.counts[1] = 2; // minute 101
            let series = ring.series(101);
            assert_eq!(series[MINUTES - 1], 2);
            assert_eq!(series[MINUTES - 2], 3);
            ring.advance(110);
            assert_eq!(ring.series(110)[MINUTES - 1], 0, "minute 110 starts empty");
            assert_eq!(ring.series(110)[0], 2, "minute 101 is the oldest kept");
            ring.advance(125);
            assert_eq!(ring.series(125), [0; MINUTES], "all forgotten");
        }
    }
}

/// A worker's stream dropped and its session waits for it to resume.
pub fn session_detached() {
    metrics::counter!("spool_sessions_detached_total").increment(1);
}

/// A worker resumed its session: `reattached` attempts it still ran, `resent`
/// tasks it had not received.
pub fn session_resumed(reattached: usize, resent: usize) {
    metrics::counter!("spool_sessions_resumed_total").increment(1);
    metrics::counter!("spool_attempts_reattached_total").increment(reattached as u64);
    metrics::counter!("spool_tasks_resent_total").increment(resent as u64);
}

/// A resume was refused (`reason`: unknown_session, bad_ticket,
/// registration_changed); the worker got a new session.
pub fn resume_refused(reason: &'static str) {
    metrics::counter!("spool_resumes_refused_total", "reason" => reason).increment(1);
}
