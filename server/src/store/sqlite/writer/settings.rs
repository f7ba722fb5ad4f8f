//! Writes of settings and upkeep: limits and weights set and removed, the
//! priority aging and its re-ranking pass, pruning, lease renewals.

use super::*;
use crate::store::settings::{Arg, SettingWrite};

/// [`Writer::set_priority_aging`], in one transaction.
pub(super) fn set_priority_aging(conn: &mut Connection, per_level_ms: i64) -> Result<bool, Error> {
    let run = |conn: &mut Connection| -> Result<bool, Error> {
        conn.run("BEGIN IMMEDIATE", |q| q).map_err(sqlite)?;
        let changed = conn
            .run(sql::SET_PRIORITY_AGING, |q| q.bind(&per_level_ms))
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
        .run(sql::RERANK_RANGE, |q| q.bind(&after).bind(&upto))
        .map_err(sqlite)?;
    conn.run(sql::RERANK_MOVE, |q| q.bind(&upto))
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
            .run(sql::RENEW, |q| {
                q.bind(&lease_expires_at)
                    .bind(&id)
                    .bind(&i64::from(attempt))
            })
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
        .run(sql::PRUNE, |q| q.bind(&before).bind(&i64::from(limit)))
        .map_err(sqlite)?;
    conn.run(sql::SWEEP_FAIRNESS, |q| q.bind(&now))
        .map_err(sqlite)?;
    Ok(pruned)
}

/// A setting's write (`store::settings`), in one statement.
pub(super) fn write_setting(
    conn: &mut Connection,
    write: SettingWrite<'_>,
) -> Result<Outcome, Error> {
    let mut q = conn.query(write.statement).map_err(sqlite)?;
    for arg in &write.args {
        q = match arg {
            Arg::Int(v) => q.bind(v),
            Arg::OptInt(v) => q.bind(v),
            Arg::Text(v) => q.bind(*v),
        };
    }
    let changed = q.execute().map_err(sqlite)?;
    Ok((write.outcome)(changed))
}
