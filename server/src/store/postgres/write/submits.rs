//! Submits: a run of them inserted by one `UNNEST` statement where no key exists
//! or repeats, else each all or nothing through a savepoint, and each activity
//! settled against what its insert did or found.

use super::*;

/// Inserts each activity whose key does not exist (a key repeated in `all` once);
/// the id of each row inserted, by key.
pub(super) async fn insert(
    conn: &mut PgConnection,
    all: &[&NewActivity],
    now: UnixMillis,
) -> Result<HashMap<Key, i64>, Error> {
    let col = |f: &dyn Fn(&NewActivity) -> String| all.iter().map(|n| f(n)).collect::<Vec<_>>();
    let int = |f: &dyn Fn(&NewActivity) -> i64| all.iter().map(|n| f(n)).collect::<Vec<_>>();
    let opt =
        |f: &dyn Fn(&NewActivity) -> Option<i64>| all.iter().map(|n| f(n)).collect::<Vec<_>>();
    let fair = all.iter().any(|n| n.fairness.is_some());
    let statement = if fair { sql::INSERT_FAIR } else { sql::INSERT };
    let query = sqlx::query(statement)
        .bind(col(&|n| n.key.namespace.clone()))
        .bind(col(&|n| n.key.workflow_id.clone()))
        .bind(col(&|n| n.key.activity_id.clone()))
        .bind(col(&|n| n.activity_type.clone()))
        .bind(int(&|n| i64::from(n.retry.max_attempts)))
        .bind(int(&|n| n.retry.initial_interval_ms))
        .bind(
            all.iter()
                .map(|n| n.retry.backoff_coefficient)
                .collect::<Vec<_>>(),
        )
        .bind(int(&|n| n.retry.max_interval_ms))
        .bind(
            all.iter()
                .map(|n| rows::encode_list(&n.retry.non_retryable))
                .collect::<Vec<_>>(),
        )
        .bind(opt(&|n| n.timeouts.heartbeat_ms))
        .bind(opt(&|n| n.timeouts.start_to_close_ms))
        .bind(opt(&|n| n.timeouts.schedule_to_close_ms))
        .bind(int(&|n| i64::from(n.priority)))
        .bind(col(&|n| n.input.content_type.clone()))
        .bind(all.iter().map(|n| n.input.data.clone()).collect::<Vec<_>>())
        .bind(int(&|n| n.next_at))
        .bind(now)
        .bind(opt(&|n| {
            change::expires_at(now, n.timeouts.schedule_to_close_ms)
        }))
        .bind(
            all.iter()
                .map(|n| rows::encode_headers(&n.headers))
                .collect::<Vec<_>>(),
        )
        .bind(
            all.iter()
                .map(|n| n.concurrency_key.clone())
                .collect::<Vec<_>>(),
        );
    let query = if fair {
        query
            .bind(
                all.iter()
                    .map(|n| n.fairness.as_ref().map(|f| f.key.clone()))
                    .collect::<Vec<_>>(),
            )
            .bind(opt(&|n| {
                n.fairness.as_ref().map(|f| fairness::stride_us(f.weight))
            }))
    } else {
        query
    };
    let inserted = query.fetch_all(&mut *conn).await?;
    let mut ids = HashMap::with_capacity(inserted.len());
    for row in &inserted {
        let key = Key {
            namespace: row.try_get(1)?,
            workflow_id: row.try_get(2)?,
            activity_id: row.try_get(3)?,
        };
        ids.insert(key, row.try_get(0)?);
    }
    Ok(ids)
}

/// Keeps what was written since `savepoint`, or with `undo` rolls it back.
pub(super) async fn end(
    conn: &mut PgConnection,
    savepoint: &sql::Savepoint,
    undo: bool,
) -> Result<(), Error> {
    if undo {
        sqlx::query(savepoint.rollback).execute(&mut *conn).await?;
    }
    sqlx::query(savepoint.release).execute(&mut *conn).await?;
    Ok(())
}

/// Opens `savepoint`.
pub(super) async fn begin(
    conn: &mut PgConnection,
    savepoint: &sql::Savepoint,
) -> Result<(), Error> {
    sqlx::query(savepoint.open).execute(&mut *conn).await?;
    Ok(())
}

/// Settles each activity of one submit against what the insert did (`ids`, the
/// rows it inserted by key) or what it found in its place. A `Conflict` leaves
/// undoing the submit's inserts to the caller.
pub(super) async fn settle(
    conn: &mut PgConnection,
    batch: &[NewActivity],
    ids: &HashMap<Key, i64>,
    now: UnixMillis,
) -> Result<Outcome, Error> {
    // One activity is answered with its stored row whole; a batch without payloads,
    // so a batch naming one large stored row many times costs no memory.
    let lookup = if batch.len() > 1 {
        sql::SELECT_LIGHT_BY_KEY
    } else {
        sql::SELECT_BY_KEY
    };
    let mut existing: HashMap<&Key, Option<ActivityRow>> = HashMap::new();
    for new in batch.iter().filter(|n| !ids.contains_key(&n.key)) {
        if !existing.contains_key(&new.key) {
            let row = select_one(conn, &new.key, lookup).await?;
            existing.insert(&new.key, row);
        }
    }
    let settled = change::settle(batch, |new| {
        if let Some(&id) = ids.get(&new.key) {
            return Ok(Found::Inserted(id));
        }
        match existing.get_mut(&new.key) {
            Some(row) => row
                .take()
                .map(|row| Found::Existing(Box::new(row)))
                .ok_or_else(|| {
                    Error::Corrupt(format!(
                        "{:?} conflicted on insert but cannot be read",
                        new.key
                    ))
                }),
            None => Err(Error::Corrupt(format!("{:?} was not looked up", new.key))),
        }
    })?;
    Ok(match settled {
        Ok(entries) => Outcome::Submitted(change::submitted(batch, entries, now)?),
        Err(Conflict {
            index,
            existing_type,
        }) => Outcome::Conflict {
            index,
            existing_type,
        },
    })
}

/// One submit, all or nothing: inserts what is new, then settles each activity
/// against what its insert did or found.
pub(super) async fn submit(
    conn: &mut PgConnection,
    batch: &[NewActivity],
    now: UnixMillis,
) -> Result<Outcome, Error> {
    let atomic = batch.len() > 1;
    if atomic {
        begin(conn, &sql::SUBMIT).await?;
    }
    let all: Vec<&NewActivity> = batch.iter().collect();
    let ids = insert(conn, &all, now).await?;
    let outcome = settle(conn, batch, &ids, now).await?;
    if atomic {
        end(
            conn,
            &sql::SUBMIT,
            matches!(outcome, Outcome::Conflict { .. }),
        )
        .await?;
    }
    Ok(outcome)
}

pub(super) async fn submit_run(
    conn: &mut PgConnection,
    run: &[&Op],
    now: UnixMillis,
) -> Result<Vec<Outcome>, Error> {
    let batches: Vec<&[NewActivity]> = run
        .iter()
        .filter_map(|op| match op {
            Op::Submit(batch) => Some(batch.as_slice()),
            _ => None,
        })
        .collect();
    let all: Vec<&NewActivity> = batches.iter().flat_map(|b| b.iter()).collect();
    let mut keys = HashSet::with_capacity(all.len());
    if all.len() >= 2 && all.iter().all(|n| keys.insert(&n.key)) {
        if batches.iter().all(|b| b.len() == 1) {
            // Submits of one activity each have nothing to undo: what the shared
            // insert did not insert existed already, and each settles against it
            // exactly as it would alone. No savepoint, two round trips fewer.
            let ids = insert(conn, &all, now).await?;
            let mut outcomes = Vec::with_capacity(batches.len());
            for batch in batches {
                outcomes.push(settle(conn, batch, &ids, now).await?);
            }
            return Ok(outcomes);
        }
        begin(conn, &sql::SUBMIT_RUN).await?;
        let ids = insert(conn, &all, now).await?;
        let complete = ids.len() == all.len();
        end(conn, &sql::SUBMIT_RUN, !complete).await?;
        if complete {
            let mut outcomes = Vec::with_capacity(batches.len());
            for batch in batches {
                let entries = batch
                    .iter()
                    .map(|new| {
                        ids.get(&new.key)
                            .map(|&id| change::Entry::Created(id))
                            .ok_or_else(|| {
                                Error::Corrupt(format!("inserted {:?} not returned", new.key))
                            })
                    })
                    .collect::<Result<Vec<_>, Error>>()?;
                outcomes.push(Outcome::Submitted(change::submitted(batch, entries, now)?));
            }
            return Ok(outcomes);
        }
    }
    let mut outcomes = Vec::with_capacity(batches.len());
    for batch in batches {
        outcomes.push(submit(conn, batch, now).await?);
    }
    Ok(outcomes)
}
