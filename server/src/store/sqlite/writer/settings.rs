//! Writes of settings and upkeep: limits and weights set and removed, the
//! priority aging and its re-ranking pass, pruning, lease renewals.

use super::*;

/// [`Writer::set_priority_aging`], in one transaction.
pub(super) fn set_priority_aging(conn: &mut Connection, per_level_ms: i64) -> Result<bool, Error> {
    let run = |conn: &mut Connection| -> Result<bool, Error> {
        conn.query("BEGIN IMMEDIATE")
            .and_then(Query::execute)
            .map_err(sqlite)?;
        let changed = conn
            .query(sql::SET_PRIORITY_AGING)
            .map(|q| q.bind(&per_level_ms))
            .and_then(Query::execute)
            .map_err(sqlite)?;
        commit(conn)?;
        Ok(changed > 0)
    };
    let result = run(conn);
    if result.is_err() {
        rollback(conn);
    }
    result
}

/// One step of the re-ranking pass, if one is left: the next `ids` ids.
pub(super) fn rerank(
    conn: &mut Connection,
    ids: u32,
) -> Result<Option<crate::store::Reranked>, Error> {
    let pending = {
        let mut q = conn.query(sql::RERANK_PENDING).map_err(sqlite)?;
        if q.step().map_err(sqlite)? {
            Some((q.int(0), q.int(1)))
        } else {
            None
        }
    };
    let Some((after, to)) = pending else {
        return Ok(None);
    };
    let upto = after.saturating_add(i64::from(ids)).min(to);
    let rows = conn
        .query(sql::RERANK_RANGE)
        .map(|q| q.bind(&after).bind(&upto))
        .and_then(Query::execute)
        .map_err(sqlite)?;
    conn.query(sql::RERANK_MOVE)
        .map(|q| q.bind(&upto))
        .and_then(Query::execute)
        .map_err(sqlite)?;
    Ok(Some(crate::store::Reranked {
        rows,
        done: upto >= to,
    }))
}

/// Extends the leases of the attempts still RUNNING: those renewed.
pub(super) fn renew(
    conn: &mut Connection,
    attempts: &[(i64, u32)],
    lease_expires_at: UnixMillis,
) -> Result<Vec<(i64, u32)>, Error> {
    let mut renewed = Vec::with_capacity(attempts.len());
    for &(id, attempt) in attempts {
        let changed = conn
            .query(sql::RENEW)
            .map(|q| {
                q.bind(&lease_expires_at)
                    .bind(&id)
                    .bind(&i64::from(attempt))
            })
            .and_then(Query::execute)
            .map_err(sqlite)?;
        if changed == 1 {
            renewed.push((id, attempt));
        }
    }
    Ok(renewed)
}

/// Deletes up to `limit` rows finished before `before`, and the chains of
/// fairness keys no row can be placed by any more.
pub(super) fn prune(
    conn: &mut Connection,
    before: UnixMillis,
    limit: u32,
    now: UnixMillis,
) -> Result<u64, Error> {
    let pruned = conn
        .query(sql::PRUNE)
        .map(|q| q.bind(&before).bind(&i64::from(limit)))
        .and_then(Query::execute)
        .map_err(sqlite)?;
    conn.query(sql::SWEEP_FAIRNESS)
        .map(|q| q.bind(&now))
        .and_then(Query::execute)
        .map_err(sqlite)?;
    Ok(pruned)
}

/// Deletes a limit of a namespace's type (with `key`, of that key) with
/// `statement`; true when there was one.
pub(super) fn remove(
    conn: &mut Connection,
    statement: &'static str,
    namespace: &str,
    activity_type: &str,
    key: Option<&str>,
) -> Result<bool, Error> {
    let q = conn
        .query(statement)
        .map_err(sqlite)?
        .bind(namespace)
        .bind(activity_type);
    match key {
        None => q,
        Some(key) => q.bind(key),
    }
    .execute()
    .map(|removed| removed > 0)
    .map_err(sqlite)
}

pub(super) fn set_fairness_weight(
    conn: &mut Connection,
    set: &FairnessWeight,
) -> Result<Outcome, Error> {
    conn.query(sql::SET_FAIRNESS_WEIGHT)
        .map(|q| {
            q.bind(set.namespace.as_str())
                .bind(set.activity_type.as_str())
                .bind(set.key.as_str())
                .bind(&i64::from(set.weight))
        })
        .and_then(Query::execute)
        .map(|_| Outcome::FairnessWeightSet)
        .map_err(sqlite)
}

pub(super) fn set_key_limit(
    conn: &mut Connection,
    namespace: &str,
    activity_type: &str,
    key: &str,
    max_running: Option<u32>,
    weight: u32,
) -> Result<Outcome, Error> {
    conn.query(sql::SET_KEY_LIMIT)
        .map(|q| {
            q.bind(namespace)
                .bind(activity_type)
                .bind(key)
                .bind(&max_running.map(i64::from))
                .bind(&i64::from(weight))
        })
        .and_then(Query::execute)
        .map(|_| Outcome::ConcurrencyLimitSet)
        .map_err(sqlite)
}

pub(super) fn set_concurrency_limit(
    conn: &mut Connection,
    namespace: &str,
    activity_type: &str,
    max_running: u32,
    strategy: Strategy,
) -> Result<Outcome, Error> {
    conn.query(sql::SET_CONCURRENCY_LIMIT)
        .map(|q| {
            q.bind(namespace)
                .bind(activity_type)
                .bind(&i64::from(max_running))
                .bind(&strategy.code())
        })
        .and_then(Query::execute)
        .map(|_| Outcome::ConcurrencyLimitSet)
        .map_err(sqlite)
}

pub(super) fn set_rate_limit(conn: &mut Connection, limit: &RateLimit) -> Result<Outcome, Error> {
    let statement = match limit.key {
        None => sql::SET_RATE_LIMIT,
        Some(_) => sql::SET_KEY_RATE_LIMIT,
    };
    let q = conn
        .query(statement)
        .map_err(sqlite)?
        .bind(limit.namespace.as_str())
        .bind(limit.activity_type.as_str())
        .bind(&i64::from(limit.per_period))
        .bind(&limit.period_ms())
        .bind(&i64::from(limit.burst))
        .bind(&limit.interval_ns());
    match &limit.key {
        None => q,
        Some(key) => q.bind(key.as_str()),
    }
    .execute()
    .map(|_| Outcome::RateLimitSet)
    .map_err(sqlite)
}
