//! Writes that move a row out of RUNNING or SCHEDULED: an attempt's ending
//! (fenced by attempt, status and node), a cancel, a re-drive, the concurrency
//! strategy's cancels, an expiry, and heartbeat details while a row runs.

use super::*;

pub(super) fn expire_scheduled(
    conn: &mut Connection,
    limit: u32,
    now: UnixMillis,
) -> Result<Vec<Key>, Error> {
    let ending = Ending::expired(now);
    let q = conn.query(sql::EXPIRE).map_err(sqlite)?;
    let mut q = bind_ending(q, &ending).bind(&now).bind(&i64::from(limit));
    let mut keys = Vec::new();
    while q.step().map_err(sqlite)? {
        keys.push(Key {
            namespace: q.text(0)?,
            workflow_id: q.text(1)?,
            activity_id: q.text(2)?,
        });
    }
    Ok(keys)
}

/// `Op::EnforceConcurrency`: cancels the rows of each of `keys` beyond its limit
/// that its strategy picks (see `concurrency::Strategy`).
pub(super) fn enforce(
    conn: &mut Connection,
    namespace: &str,
    activity_type: &str,
    keys: &[String],
    now: UnixMillis,
    moves: &mut KeyMoves,
) -> Result<Outcome, Error> {
    let names = serde_json::to_string(keys)
        .map_err(|e| Error::Corrupt(format!("concurrency keys: {e}")))?;
    let mut over = Vec::new();
    {
        let mut q = conn
            .query(sql::OVER_LIMIT)
            .map_err(sqlite)?
            .bind(namespace)
            .bind(activity_type)
            .bind(names.as_str());
        while q.step().map_err(sqlite)? {
            over.push((q.text(0)?, q.int(1), q.int(2)));
        }
    }
    let mut cancelled = Vec::new();
    for (key, max_running, code) in over {
        let strategy = concurrency::Strategy::from_code(code)?;
        let Some(beyond) = beyond_limit!(strategy) else {
            continue;
        };
        let mut rows = Vec::new();
        {
            let mut q = conn
                .query(beyond)
                .map_err(sqlite)?
                .bind(namespace)
                .bind(activity_type)
                .bind(key.as_str())
                .bind(&max_running);
            while q.step().map_err(sqlite)? {
                rows.push(Key {
                    namespace: namespace.to_owned(),
                    workflow_id: q.text(0)?,
                    activity_id: q.text(1)?,
                });
            }
        }
        let reason = strategy.reason(&key, max_running);
        for row in rows {
            if let Outcome::Cancelled { prior, row } = cancel(conn, &row, &reason, now, moves)? {
                cancelled.push((prior, row));
            }
        }
    }
    Ok(Outcome::Enforced(cancelled))
}

pub(super) fn record_heartbeats(
    conn: &mut Connection,
    beats: &[HeartbeatDetails],
) -> Result<u64, Error> {
    let mut recorded = 0;
    for beat in beats {
        recorded += conn
            .run(sql::RECORD_HEARTBEAT, |q| {
                q.bind(&beat.id)
                    .bind(&i64::from(beat.attempt))
                    .bind(&beat.details.as_ref().map(|d| d.content_type.as_str()))
                    .bind(&beat.details.as_ref().map(|d| d.data.as_slice()))
            })
            .map_err(sqlite)?;
    }
    Ok(recorded)
}

/// The row an `UPDATE … RETURNING columns!()` of one row stored.
pub(super) fn returned(q: &mut Query<'_>) -> Result<ActivityRow, Error> {
    if q.step().map_err(sqlite)? {
        decode(q)
    } else {
        Err(Error::Corrupt(
            "a row read in this transaction was not there to update".to_owned(),
        ))
    }
}

pub(super) fn redrive(conn: &mut Connection, key: &Key, now: UnixMillis) -> Result<Outcome, Error> {
    let Some(row) = select_one(conn, key, sql::SELECT_LIGHT_BY_KEY)? else {
        return Ok(Outcome::NotFound);
    };
    if !crate::store::redrivable(row.status) {
        return Ok(Outcome::WrongStatus(row.status));
    }
    let redrive = change::Redrive::of(&row, now);
    let mut q = conn
        .query(sql::REDRIVE)
        .map_err(sqlite)?
        .bind(&row.id)
        .bind(&redrive.next_at)
        .bind(&redrive.expires_at);
    let stored = returned(&mut q)?;
    Ok(Outcome::Redriven { row: stored })
}

pub(super) fn cancel(
    conn: &mut Connection,
    key: &Key,
    reason: &str,
    now: UnixMillis,
    moves: &mut KeyMoves,
) -> Result<Outcome, Error> {
    let Some(row) = select_one(conn, key, sql::SELECT_LIGHT_BY_KEY)? else {
        return Ok(Outcome::NotFound);
    };
    if !crate::store::cancellable(row.status) {
        return Ok(Outcome::WrongStatus(row.status));
    }
    let error = change::cancelled_error(reason);
    let ending = Ending::finished(ActivityStatus::Cancelled, now, Some(&error));
    let q = conn.query(sql::CANCEL).map_err(sqlite)?;
    let mut q = bind_ending(q, &ending).bind(&row.id);
    let stored = returned(&mut q)?;
    drop(q);
    // A running row's key is counted here and now: the caller may read the counts
    // next (the trigger counts a waiting row's).
    if row.status == ActivityStatus::Running
        && let Some(key) = &stored.concurrency_key
    {
        moves.record(
            stored.key.namespace.clone(),
            stored.activity_type.clone(),
            key.clone(),
            false,
        );
        moves.write(conn)?;
    }
    Ok(Outcome::Cancelled {
        prior: row.status,
        row: stored,
    })
}

/// Binds an ending's values as `?1`…`?14`, the order of `sql::ending!`.
pub(super) fn bind_ending<'c>(q: Query<'c>, e: &Ending<'_>) -> Query<'c> {
    let (output_type, output) = e.output_columns();
    let error = e.error;
    let details = error.and_then(|e| e.details.as_ref());
    q.bind(&(e.status as i64))
        .bind(&e.next_at)
        .bind(&e.finished_at)
        .bind(&e.uncounted)
        .bind(&output_type)
        .bind(&output)
        .bind(&i64::from(error.is_some()))
        .bind(&error.map(|e| i64::from(e.kind)))
        .bind(&error.map(|e| e.r#type.as_str()))
        .bind(&error.map(|e| e.message.as_str()))
        .bind(&details.map(|d| d.content_type.as_str()))
        .bind(&details.map(|d| d.data.as_slice()))
        .bind(&e.outcome.name())
        .bind(&e.ended_at)
}

/// Whether `sql::FINISH_LEAN` writes what `sql::FINISH` would: the ending keeps
/// `next_at` (and so the row's place in claim order) and the last error, and
/// adds nothing to `uncounted`. Every completion does; the shorter statement
/// leaves out the `CASE`s that would only keep what is stored.
pub(super) fn lean(e: &Ending<'_>) -> bool {
    e.next_at.is_none() && e.error.is_none() && e.uncounted == 0
}

/// How many ops from the start of `ops` [`finish_many`] can end together: lean
/// endings (see [`lean`]) alike but for their rows, attempts and outputs, none
/// guarded by its lease, each of another row (so that each id read back answers
/// one op).
pub(super) fn alike_endings_ahead(ops: &[Op], now: UnixMillis) -> usize {
    let mut first = None;
    let mut ids = Vec::new();
    for op in ops.iter().take(sql::COMPLETE_ROWS_AT_ONCE) {
        let Op::Finish {
            attempt,
            transition,
            lease_expired_by: None,
        } = op
        else {
            break;
        };
        let ending = Ending::of(transition, now);
        let like = (
            ending.status,
            ending.outcome,
            ending.finished_at,
            ending.ended_at,
            attempt.owner_node.as_deref(),
        );
        if !lean(&ending) || first.is_some_and(|first| first != like) || ids.contains(&attempt.id) {
            break;
        }
        first = Some(like);
        ids.push(attempt.id);
    }
    ids.len()
}

/// Ends the attempts of `run`, endings [`alike_endings_ahead`] found alike, in
/// one [`sql::COMPLETE_ROWS`]; the rows it updated are the endings accepted. Each
/// is judged as [`finish`] would judge it alone.
pub(super) fn finish_many(
    conn: &mut Connection,
    run: &[Op],
    now: UnixMillis,
    moves: &mut KeyMoves,
    outcomes: &mut Vec<Outcome>,
) -> Result<(), Error> {
    let endings: Vec<(&Attempt, Ending<'_>)> = run
        .iter()
        .filter_map(|op| match op {
            Op::Finish {
                attempt,
                transition,
                ..
            } => Some((attempt.as_ref(), Ending::of(transition, now))),
            _ => None,
        })
        .collect();
    let mut ended = Vec::with_capacity(endings.len());
    let q = conn.query(&sql::COMPLETE_ROWS).map_err(sqlite)?;
    let changed = bind_completions(q, &endings)
        .execute_updated(c"activities", &mut ended)
        .map_err(sqlite)?;
    if changed != ended.len() as u64 {
        return Err(Error::Corrupt(format!(
            "{changed} rows were ended and {} were seen ending",
            ended.len()
        )));
    }
    for (attempt, ending) in &endings {
        let accepted = ended.contains(&attempt.id);
        if accepted {
            ended_keyed(moves, attempt, ending);
        }
        outcomes.push(Outcome::Finished { accepted });
    }
    Ok(())
}

/// Binds `endings` (alike, each of another row, at least one) as
/// [`sql::COMPLETE_ROWS`] takes them: in ascending order of their rows, the slots
/// after the last filled with the last again.
fn bind_completions<'c>(q: Query<'c>, endings: &[(&Attempt, Ending<'_>)]) -> Query<'c> {
    let mut slots = endings.to_vec();
    slots.sort_unstable_by_key(|(attempt, _)| attempt.id);
    let (Some(&(first, like)), Some(&last)) = (slots.first(), slots.last()) else {
        return q;
    };
    slots.resize(sql::COMPLETE_ROWS_AT_ONCE, last);
    let q = q
        .bind(&(like.status as i64))
        .bind(&like.finished_at)
        .bind(&like.outcome.name())
        .bind(&like.ended_at)
        .bind(&first.owner_node.as_deref());
    slots.iter().fold(q, |q, (attempt, ending)| {
        let (output_type, output) = ending.output_columns();
        q.bind(&attempt.id)
            .bind(&output_type)
            .bind(&output)
            .bind(&i64::from(attempt.attempt))
    })
}

/// Counts an accepted ending's move out of its key's running rows. The row was
/// RUNNING with this attempt, so its key is the attempt's.
fn ended_keyed(moves: &mut KeyMoves, attempt: &Attempt, ending: &Ending<'_>) {
    if let Some(key) = &attempt.concurrency_key {
        moves.record(
            attempt.key.namespace.clone(),
            attempt.activity_type.clone(),
            key.to_string(),
            ending.status == ActivityStatus::Scheduled,
        );
    }
}

/// Ends an attempt by `transition`, fenced by its attempt, its status and (when
/// set) its node; the key's counts follow an accepted ending.
pub(super) fn finish(
    conn: &mut Connection,
    attempt: &Attempt,
    transition: &Transition,
    lease_expired_by: Option<UnixMillis>,
    now: UnixMillis,
    moves: &mut KeyMoves,
) -> Result<Outcome, Error> {
    let ending = Ending::of(transition, now);
    let statement = match ending.status {
        ActivityStatus::Scheduled => sql::FINISH_AGAIN,
        _ if lean(&ending) => sql::FINISH_LEAN,
        _ => sql::FINISH,
    };
    let q = conn.query(statement).map_err(sqlite)?;
    let changed = bind_ending(q, &ending)
        .bind(&attempt.id)
        .bind(&i64::from(attempt.attempt))
        .bind(&lease_expired_by)
        .bind(&attempt.owner_node.as_deref())
        .execute()
        .map_err(sqlite)?;
    let accepted = changed == 1;
    if accepted {
        ended_keyed(moves, attempt, &ending);
    }
    Ok(Outcome::Finished { accepted })
}
