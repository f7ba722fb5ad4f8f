//! What the checks share: a default row, the ops they send, and how they read
//! the outcomes.

use std::sync::Arc;

use crate::store::*;

/// The time (Unix milliseconds) the checks run at: rows are due then by default.
pub(super) const T0: i64 = 1_000_000;

pub(super) fn key(id: &str) -> Key {
    Key {
        namespace: "default".into(),
        workflow_id: "wf".into(),
        activity_id: id.into(),
    }
}

pub(super) fn new(id: &str, ty: &str) -> NewActivity {
    NewActivity {
        key: key(id),
        activity_type: ty.into(),
        input: Payload {
            content_type: String::new(),
            data: format!("\"{id}\"").into_bytes(),
        },
        next_at: T0,
        retry: RetrySpec {
            max_attempts: 3,
            initial_interval_ms: 1000,
            backoff_coefficient: 2.0,
            max_interval_ms: 60_000,
            non_retryable: vec!["Fatal".into()],
        },
        timeouts: Timeouts::default(),
        priority: 0,
        headers: Default::default(),
        concurrency_key: None,
        fairness: None,
    }
}

pub(super) async fn apply(store: &dyn Store, ops: Vec<Op>, now: i64) -> Vec<Outcome> {
    store
        .apply(ops.into(), now)
        .await
        .unwrap_or_else(|e| panic!("apply failed: {e}"))
}

pub(super) async fn one(store: &dyn Store, op: Op, now: i64) -> Outcome {
    apply(store, vec![op], now)
        .await
        .pop()
        .unwrap_or_else(|| panic!("no outcome"))
}

pub(super) async fn submit(store: &dyn Store, activity: NewActivity) -> Vec<Submitted> {
    match one(store, Op::Submit(vec![activity]), T0).await {
        Outcome::Submitted(s) => s,
        other => panic!("expected Submitted, got {other:?}"),
    }
}

pub(super) async fn get(store: &dyn Store, id: &str) -> ActivityRow {
    store
        .get(&key(id))
        .await
        .unwrap_or_else(|e| panic!("get: {e}"))
        .unwrap_or_else(|| panic!("{id} not found"))
}

pub(super) fn claim_for(types: &[&str], limit: u32) -> Op {
    Op::Claim(Claim {
        namespace: "default".into(),
        activity_types: types.iter().map(|t| Arc::<str>::from(*t)).collect(),
        worker_id: "w1".into(),
        identity: "host-1".into(),
        node: "node-a".into(),
        limit,
        lease_expires_at: T0 + 30_000,
        epoch: 0,
    })
}

pub(super) async fn claim(
    store: &dyn Store,
    types: &[&str],
    limit: u32,
    now: i64,
) -> Vec<ActivityRow> {
    match one(store, claim_for(types, limit), now).await {
        Outcome::Claimed { rows, .. } => rows,
        other => panic!("expected Claimed, got {other:?}"),
    }
}

pub(super) async fn finish(
    store: &dyn Store,
    row: &ActivityRow,
    transition: Transition,
    now: i64,
) -> bool {
    let op = Op::finish(Arc::new(Attempt::from_row(row)), transition);
    match one(store, op, now).await {
        Outcome::Finished { accepted } => accepted,
        other => panic!("expected Finished, got {other:?}"),
    }
}

/// The row of `id` among `rows`.
pub(super) fn by_id(rows: &[ActivityRow], id: &str) -> ActivityRow {
    rows.iter()
        .find(|r| r.key.activity_id == id)
        .cloned()
        .unwrap_or_else(|| panic!("{id} is not among the rows"))
}

/// A retryable failure ("Boom", `message`), due again at `next_at`.
pub(super) fn retry(next_at: i64, message: &str) -> Transition {
    Transition::Retry {
        next_at,
        error: crate::store::server_error(ErrorKind::Retryable, "Boom", message.to_owned()),
    }
}

pub(super) fn output(s: &str) -> Transition {
    Transition::Complete {
        output: Payload {
            content_type: "text/plain".into(),
            data: s.as_bytes().to_vec(),
        },
    }
}

/// A key's own limit and weight, as the API commits them.
pub(super) fn key_limit(key: &str, max_running: Option<u32>, weight: u32) -> Op {
    Op::Setting(SettingChange::KeyLimit {
        namespace: "default".into(),
        activity_type: "t".into(),
        key: key.into(),
        max_running,
        weight,
    })
}

/// Claims the due rows of type `t` one at a time, and names them in that order.
pub(super) async fn claim_order(store: &dyn Store, now: i64) -> Vec<String> {
    let mut order = Vec::new();
    while let Some(row) = claim(store, &["t"], 1, now).await.pop() {
        order.push(row.key.activity_id.to_string());
    }
    order
}

/// A row of type `t` of `priority`, due at `next_at`.
pub(super) fn ranked(id: &str, priority: i32, next_at: i64) -> NewActivity {
    let mut row = new(id, "t");
    row.priority = priority;
    row.next_at = next_at;
    row
}

/// Sets the priority aging and, if that changed it, runs the re-ranking pass in
/// small steps: how many waiting rows it ranked again.
pub(super) async fn set_aging(
    store: &dyn Store,
    aging: Option<std::time::Duration>,
) -> Option<u64> {
    let changed = store
        .set_priority_aging(aging)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    changed.then_some(rerank_all(store, 2).await)
}

/// Runs a re-ranking pass to its end, `ids` ids a step: the rows it ranked.
pub(super) async fn rerank_all(store: &dyn Store, ids: u32) -> u64 {
    let mut rows = 0;
    loop {
        match one(store, Op::Rerank { ids }, T0).await {
            Outcome::Reranked(Some(step)) => {
                rows += step.rows;
                if step.done {
                    return rows;
                }
            }
            Outcome::Reranked(None) => return rows,
            other => panic!("expected Reranked, got {other:?}"),
        }
    }
}

/// The first page of the default namespace, unfiltered.
pub(super) fn everything(limit: u32) -> ListQuery {
    ListQuery {
        newest_first: false,
        namespace: "default".into(),
        status: None,
        activity_type: None,
        after_id: 0,
        limit,
        max_bytes: 1 << 20,
    }
}
