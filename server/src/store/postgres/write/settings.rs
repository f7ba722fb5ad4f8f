//! Writes of settings and upkeep: limits and weights set and removed, the
//! re-ranking pass after a change of the priority aging, pruning, renewals.

use super::*;
use crate::store::settings::{Arg, SettingWrite};

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

/// A setting's write (`store::settings`), in one statement.
pub(super) async fn write_setting(
    conn: &mut PgConnection,
    write: SettingWrite<'_>,
) -> Result<Outcome, Error> {
    let mut q = sqlx::query(write.statement);
    for arg in write.args {
        q = match arg {
            Arg::Int(v) => q.bind(v),
            Arg::OptInt(v) => q.bind(v),
            Arg::Text(v) => q.bind(v),
        };
    }
    let done = q.execute(&mut *conn).await?;
    Ok((write.outcome)(done.rows_affected()))
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
