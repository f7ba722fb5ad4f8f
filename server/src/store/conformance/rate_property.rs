//! The limits property: generated mixes of a type's rate limit, its concurrency
//! limit, keys with rate limits and limits of their own, unkeyed rows and
//! fairness keys, claimed at generated times with generated sizes and some
//! attempts ended between. A model beside the store keeps each bucket (GCRA:
//! its theoretical arrival time) and each key's running count from what the
//! claims returned, and holds every claim to two promises:
//!
//! - nothing past a limit: a claim takes no more than its size, than the type's
//!   bucket holds, and for each key no more than its bucket holds and than the
//!   room its concurrency limit leaves;
//! - nothing left idle: a claim that comes back with fewer rows than it asked
//!   for, and none of a concurrency key, leaves no due row that every limit on
//!   it would have let run (a key whose rows are all due later holds no place).

use std::collections::BTreeMap;

use proptest::{
    prelude::*,
    strategy::ValueTree,
    test_runner::{Config as Cases, RngAlgorithm, TestRng, TestRunner},
};

use super::{Raw, support::*};
use crate::store::*;

const CASES: usize = 40;

/// Per period, period (ms), burst.
type Rate = (u32, u64, u32);

#[derive(Debug, Clone)]
struct KeySpec {
    rate: Option<Rate>,
    max_running: Option<u32>,
    rows: usize,
    /// Rows due only after the case ends: waiting, never runnable.
    later: usize,
}

#[derive(Debug, Clone)]
struct Case {
    rate: Option<Rate>,
    max_running: Option<u32>,
    keys: Vec<KeySpec>,
    unkeyed: usize,
    /// Rows go to this many fairness keys in turn (weights 1, 2, 3): fairness
    /// orders the rows a claim takes, and must change nothing above.
    fairness: usize,
    /// (ms after the last step, how many running attempts end first, claim size)
    steps: Vec<(i64, usize, u32)>,
}

fn rate() -> impl Strategy<Value = Option<Rate>> {
    prop::option::of((
        1u32..=10,
        prop::sample::select(vec![200u64, 1_000]),
        1u32..=4,
    ))
}

fn case() -> impl Strategy<Value = Case> {
    let key = (
        rate(),
        prop::option::of(1u32..=3),
        prop::sample::select(vec![0usize, 0, 1, 3, 6]),
        prop::sample::select(vec![0usize, 1, 1, 2]),
    )
        .prop_map(|(rate, max_running, rows, later)| KeySpec {
            rate,
            max_running,
            rows,
            later,
        });
    (
        rate(),
        prop::option::of(1u32..=4),
        prop::collection::vec(key, 0..=5),
        0usize..=6,
        0usize..=3,
        prop::collection::vec((0i64..=300, 0usize..=2, 1u32..=6), 6..=12),
    )
        .prop_map(|(rate, max_running, keys, unkeyed, fairness, steps)| Case {
            rate,
            max_running,
            keys,
            unkeyed,
            fairness,
            steps,
        })
}

/// A bucket as the model keeps it, in nanoseconds.
#[derive(Debug, Clone, Copy)]
struct Bucket {
    interval: i64,
    burst: i64,
    tat: i64,
}

impl Bucket {
    fn new((per_period, period_ms, burst): Rate) -> Self {
        Bucket {
            interval: (period_ms as i64 * 1_000_000 / i64::from(per_period)).max(1),
            burst: i64::from(burst),
            tat: 0,
        }
    }

    fn available(&self, now: i64) -> i64 {
        let base = self.tat.max(now);
        ((now + self.burst * self.interval - base) / self.interval).clamp(0, self.burst)
    }

    fn take(&mut self, now: i64, n: i64) {
        if n > 0 {
            self.tat = self.tat.max(now) + n * self.interval;
        }
    }
}

/// One key's side of the model (`None` is the unkeyed rows).
#[derive(Debug, Default)]
struct KeyModel {
    bucket: Option<Bucket>,
    max_running: Option<u32>,
    waiting: usize,
    running: Vec<ActivityRow>,
}

pub(super) async fn claims_keep_every_limit_and_leave_no_runnable_row_waiting(
    store: &dyn Store,
    _raw: &Raw,
) {
    let mut runner = TestRunner::new_with_rng(
        Cases {
            cases: CASES as u32,
            ..Cases::default()
        },
        TestRng::deterministic_rng(RngAlgorithm::ChaCha),
    );
    let strategy = case();
    let (mut short, mut claimed) = (0, 0);
    for n in 0..CASES {
        let case = strategy
            .new_tree(&mut runner)
            .unwrap_or_else(|e| panic!("{e}"))
            .current();
        let (s, c) = run_case(store, n, &case).await;
        short += s;
        claimed += c;
    }
    eprintln!("limits property: {claimed} rows claimed, {short} claims short");
    assert!(
        claimed > 100 && short > 20,
        "too few claims were held back to show anything: {claimed} rows, {short} short"
    );
}

/// Sets the case's limits on a type of its own, submits its rows, then claims
/// step by step against the model; how many claims were short, and rows claimed.
async fn run_case(store: &dyn Store, n: usize, case: &Case) -> (usize, usize) {
    let ty = format!("limits{n}");
    let shown = format!("case {n}: {case:?}");
    let limit = |key: Option<String>, (per_period, period_ms, burst): Rate| {
        Op::Setting(SettingChange::RateLimit(rate::RateLimit {
            namespace: "default".into(),
            activity_type: ty.clone(),
            key,
            per_period,
            period: std::time::Duration::from_millis(period_ms),
            burst,
        }))
    };
    let mut setup = Vec::new();
    let mut type_bucket = case.rate.map(Bucket::new);
    if let Some(rate) = case.rate {
        setup.push(limit(None, rate));
    }
    if let Some(max_running) = case.max_running {
        setup.push(Op::Setting(SettingChange::ConcurrencyLimit {
            namespace: "default".into(),
            activity_type: ty.clone(),
            max_running,
            strategy: concurrency::Strategy::Queue,
        }));
    }
    let mut keys: BTreeMap<Option<String>, KeyModel> = BTreeMap::new();
    let mut rows = Vec::new();
    for (k, spec) in case.keys.iter().enumerate() {
        let name = format!("k{k}");
        if let Some(rate) = spec.rate {
            setup.push(limit(Some(name.clone()), rate));
        }
        if let Some(max_running) = spec.max_running {
            setup.push(Op::Setting(SettingChange::KeyLimit {
                namespace: "default".into(),
                activity_type: ty.clone(),
                key: name.clone(),
                max_running: Some(max_running),
                weight: 1,
            }));
        }
        for i in 0..spec.rows + spec.later {
            let mut row = new(&format!("{ty}-{name}-{i}"), &ty);
            row.concurrency_key = Some(name.clone());
            if i >= spec.rows {
                row.next_at = T0 + 3_600_000;
            }
            rows.push(row);
        }
        keys.insert(
            Some(name),
            KeyModel {
                bucket: spec.rate.map(Bucket::new),
                max_running: spec.max_running.or(case.max_running),
                waiting: spec.rows,
                running: Vec::new(),
            },
        );
    }
    for i in 0..case.unkeyed {
        rows.push(new(&format!("{ty}-none-{i}"), &ty));
    }
    keys.entry(None).or_default().waiting = case.unkeyed;
    if case.fairness > 0 {
        for (i, row) in rows.iter_mut().enumerate() {
            let f = i % case.fairness;
            row.fairness = Some(Fairness {
                key: format!("f{f}"),
                weight: f as u32 + 1,
            });
        }
    }
    if !rows.is_empty() {
        setup.push(Op::Submit(rows));
    }
    apply(store, setup, T0).await;

    let (mut short, mut claimed) = (0, 0);
    let mut now = T0;
    for (step, &(after, ending, size)) in case.steps.iter().enumerate() {
        now += after;
        end_some(store, &mut keys, ending, now, &shown).await;
        let ns = rate::nanos(now);
        let rows = match one(store, claim_for(&[ty.as_str()], size), now).await {
            Outcome::Claimed { rows, .. } => rows,
            other => panic!("{shown}: expected Claimed, got {other:?}"),
        };
        let at = format!("{shown}\nstep {step} at T0+{} ms, size {size}", now - T0);
        let type_left = type_bucket.map(|b| b.available(ns));
        assert!(rows.len() <= size as usize, "{at}: {} rows", rows.len());
        if let Some(left) = type_left {
            assert!(
                rows.len() as i64 <= left,
                "{at}: {} rows past the type's bucket of {left}",
                rows.len()
            );
        }
        let mut by_key: BTreeMap<Option<String>, Vec<ActivityRow>> = BTreeMap::new();
        for row in rows {
            assert_eq!(row.activity_type, ty, "{at}");
            by_key
                .entry(row.concurrency_key.clone())
                .or_default()
                .push(row);
        }
        let total = by_key.values().map(Vec::len).sum::<usize>();
        let took_keyed = by_key.keys().any(Option::is_some);
        // The promise of each key, then the model moves on by what was taken.
        let mut runnable_left = Vec::new();
        for (key, model) in keys.iter_mut() {
            let took = by_key.remove(key).unwrap_or_default();
            let n = took.len();
            let bucket_left = model.bucket.map(|b| b.available(ns));
            let room = key
                .as_ref()
                .and(model.max_running)
                .map(|m| i64::from(m) - model.running.len() as i64);
            assert!(
                n <= model.waiting,
                "{at}: {key:?} took {n} of {}",
                model.waiting
            );
            if let Some(left) = bucket_left {
                assert!(
                    n as i64 <= left,
                    "{at}: {key:?} took {n}, its bucket held {left}"
                );
            }
            if let Some(room) = room {
                assert!(
                    n as i64 <= room,
                    "{at}: {key:?} took {n} with room for {room}"
                );
            }
            let still = |left: Option<i64>| left.is_none_or(|l| l > n as i64);
            let type_still = type_left.is_none_or(|l| l > total as i64);
            if model.waiting > n && type_still && still(bucket_left) && still(room) {
                runnable_left.push(key.clone());
            }
            if let Some(bucket) = model.bucket.as_mut() {
                bucket.take(ns, n as i64);
            }
            model.waiting -= n;
            model.running.extend(took);
        }
        assert!(
            by_key.is_empty(),
            "{at}: rows of keys never submitted: {by_key:?}"
        );
        if let Some(bucket) = type_bucket.as_mut() {
            bucket.take(ns, total as i64);
        }
        if total < size as usize {
            short += 1;
            // A key's share may exceed its due rows, leaving room a claim does not
            // pass on: one that took keyed rows is followed by another
            // (`Registry::assign`), so only one that took none must leave nothing.
            if !took_keyed {
                assert!(
                    runnable_left.is_empty(),
                    "{at}: claimed {total}, none of a key, yet every limit on \
                     {runnable_left:?} let more run"
                );
            }
        }
        claimed += total;
    }
    (short, claimed)
}

/// Ends the `count` oldest running attempts, round the keys, as workers would.
async fn end_some(
    store: &dyn Store,
    keys: &mut BTreeMap<Option<String>, KeyModel>,
    count: usize,
    now: i64,
    shown: &str,
) {
    for _ in 0..count {
        let Some(model) = keys.values_mut().find(|m| !m.running.is_empty()) else {
            return;
        };
        let row = model.running.remove(0);
        assert!(
            finish(store, &row, output("done"), now).await,
            "{shown}: the ending of {:?} was refused",
            row.key
        );
    }
}
