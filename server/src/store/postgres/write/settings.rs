//! Writes of settings and upkeep: limits and weights set and removed, the
//! re-ranking pass after a change of the priority aging, pruning, renewals.

use super::*;

/// One step of the re-ranking pass, if one is left and no other node is taking
/// its step: the next `ids` ids.
pub(super) async fn rerank(
    conn: &mut PgConnection,
    ids: u32,
) -> Result<Option<crate::store::Reranked>, Error> {
    let pending: Option<(i64, i64)> = sqlx::query_as(sql::RERANK_PENDING)
        .fetch_optional(&mut *conn)
        .await?;
    let Some((after, to)) = pending else {
        return Ok(None);
    };
    let upto = after.saturating_add(i64::from(ids)).min(to);
    let rows = sqlx::query(sql::RERANK_RANGE)
        .bind(after)
        .bind(upto)
        .execute(&mut *conn)
        .await?
        .rows_affected();
    sqlx::query(sql::RERANK_MOVE)
        .bind(upto)
        .execute(&mut *conn)
        .await?;
    Ok(Some(crate::store::Reranked {
        rows,
        done: upto >= to,
    }))
}

/// A run of submits: every activity inserted by one statement when none of their
/// keys exists or repeats (the common case); otherwise that insert is undone and
/// each submit runs on its own, as it would alone.
/// Deletes a limit of a namespace's type (with `key`, of that key) with
/// `statement`; true when there was one.
pub(super) async fn remove(
    conn: &mut PgConnection,
    statement: &'static str,
    namespace: &str,
    activity_type: &str,
    key: Option<&str>,
) -> Result<bool, Error> {
    let q = sqlx::query(statement).bind(namespace).bind(activity_type);
    let done = match key {
        None => q,
        Some(key) => q.bind(key),
    }
    .execute(conn)
    .await?;
    Ok(done.rows_affected() > 0)
}

/// Extends the leases of the attempts still RUNNING, in one statement: those
/// renewed.
pub(super) async fn renew(
    conn: &mut PgConnection,
    attempts: &[(i64, u32)],
    lease_expires_at: UnixMillis,
) -> Result<Vec<(i64, u32)>, Error> {
    let ids: Vec<i64> = attempts.iter().map(|a| a.0).collect();
    let numbers: Vec<i64> = attempts.iter().map(|a| i64::from(a.1)).collect();
    let rows = sqlx::query(sql::RENEW)
        .bind(lease_expires_at)
        .bind(ids)
        .bind(numbers)
        .fetch_all(&mut *conn)
        .await?;
    rows.iter()
        .map(|r| {
            Ok((
                r.try_get::<i64, _>(0)?,
                rows::u32_from(r.try_get(1)?, "attempt")?,
            ))
        })
        .collect()
}

/// Deletes up to `limit` rows finished before `before`, with the tickets of
/// sessions not opened or resumed since, the rows of keys endings left idle and
/// the chains of fairness keys no row can be placed by any more: the most of
/// those, so that a full batch of any is followed by another soon.
pub(super) async fn prune(
    conn: &mut PgConnection,
    before: UnixMillis,
    limit: u32,
    now: UnixMillis,
) -> Result<u64, Error> {
    let done = sqlx::query(sql::PRUNE)
        .bind(before)
        .bind(i64::from(limit))
        .execute(&mut *conn)
        .await?;
    sqlx::query(sql::PRUNE_TICKETS)
        .bind(before)
        .bind(i64::from(limit))
        .execute(&mut *conn)
        .await?;
    let swept = sqlx::query(sql::SWEEP_KEYS)
        .bind(i64::from(limit))
        .execute(&mut *conn)
        .await?;
    let chains = sqlx::query(sql::SWEEP_FAIRNESS)
        .bind(now)
        .bind(i64::from(limit))
        .execute(&mut *conn)
        .await?;
    Ok(done
        .rows_affected()
        .max(swept.rows_affected())
        .max(chains.rows_affected()))
}

pub(super) async fn set_fairness_weight(
    conn: &mut PgConnection,
    set: &FairnessWeight,
) -> Result<Outcome, Error> {
    sqlx::query(sql::SET_FAIRNESS_WEIGHT)
        .bind(&set.namespace)
        .bind(&set.activity_type)
        .bind(&set.key)
        .bind(i64::from(set.weight))
        .execute(&mut *conn)
        .await?;
    Ok(Outcome::FairnessWeightSet)
}

pub(super) async fn set_key_limit(
    conn: &mut PgConnection,
    namespace: &str,
    activity_type: &str,
    key: &str,
    max_running: Option<u32>,
    weight: u32,
) -> Result<Outcome, Error> {
    sqlx::query(sql::SET_KEY_LIMIT)
        .bind(namespace)
        .bind(activity_type)
        .bind(key)
        .bind(max_running.map(i64::from))
        .bind(i64::from(weight))
        .execute(&mut *conn)
        .await?;
    Ok(Outcome::ConcurrencyLimitSet)
}

pub(super) async fn set_concurrency_limit(
    conn: &mut PgConnection,
    namespace: &str,
    activity_type: &str,
    max_running: u32,
    strategy: Strategy,
) -> Result<Outcome, Error> {
    sqlx::query(sql::SET_CONCURRENCY_LIMIT)
        .bind(namespace)
        .bind(activity_type)
        .bind(i64::from(max_running))
        .bind(strategy.code())
        .execute(&mut *conn)
        .await?;
    Ok(Outcome::ConcurrencyLimitSet)
}

pub(super) async fn set_rate_limit(
    conn: &mut PgConnection,
    limit: &RateLimit,
) -> Result<Outcome, Error> {
    let statement = match limit.key {
        None => sql::SET_RATE_LIMIT,
        Some(_) => sql::SET_KEY_RATE_LIMIT,
    };
    let q = sqlx::query(statement)
        .bind(&limit.namespace)
        .bind(&limit.activity_type)
        .bind(i64::from(limit.per_period))
        .bind(limit.period_ms())
        .bind(i64::from(limit.burst))
        .bind(limit.interval_ns());
    match &limit.key {
        None => q,
        Some(key) => q.bind(key),
    }
    .execute(&mut *conn)
    .await?;
    Ok(Outcome::RateLimitSet)
}
