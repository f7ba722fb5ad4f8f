//! Claims on the writer's connection: rows without a concurrency key read in
//! claim order and claimed by id, keyed rows served key by key by their passes,
//! both within the rate limit's bucket.

use super::*;

/// A concurrency key ready to be served.
pub(super) struct ReadyKey {
    key: String,
    room: i64,
    weight: i64,
    /// Its own bucket's, if it has one.
    interval_ns: Option<i64>,
}

/// Which rows of a type with concurrency keys a claim statement takes.
pub(super) enum Rows<'a> {
    /// Those of one key.
    OfKey(&'a str),
    /// One of each key in this JSON array.
    OneOfEach(&'a str),
}

/// The type a claim is taking rows of, for whom, and when.
pub(super) struct Of<'a> {
    claim: &'a Claim,
    activity_type: &'a str,
    now: UnixMillis,
}

/// The rate limit bucket of a namespace's type, if it has one.
pub(super) fn bucket(
    conn: &mut Connection,
    namespace: &str,
    activity_type: &str,
) -> Result<Option<rate::Bucket>, Error> {
    let mut q = conn
        .query(sql::BUCKET)
        .map_err(sqlite)?
        .bind(namespace)
        .bind(activity_type);
    Ok(if q.step().map_err(sqlite)? {
        Some(rate::Bucket {
            interval_ns: q.int(0).max(1),
            burst: q.int(1).max(1),
            tat_ns: q.int(2),
        })
    } else {
        None
    })
}

/// When (nanoseconds) a key of a namespace's type held back by its own rate limit
/// has a token again, after `now`.
pub(super) fn key_refill(
    conn: &mut Connection,
    namespace: &str,
    activity_type: &str,
    now: UnixMillis,
) -> Result<Option<i64>, Error> {
    let mut q = conn
        .query(sql::KEY_REFILL)
        .map_err(sqlite)?
        .bind(namespace)
        .bind(activity_type)
        .bind(&now);
    Ok(if q.step().map_err(sqlite)? {
        rows::Columns::opt_int(&q, 0)?
    } else {
        None
    })
}

/// The concurrency keys of a namespace's type with rows waiting, room to run more
/// and tokens in their own bucket at `now`, lowest pass first (at most `limit`).
pub(super) fn ready_keys(
    conn: &mut Connection,
    namespace: &str,
    activity_type: &str,
    limit: i64,
    now: UnixMillis,
) -> Result<Vec<ReadyKey>, Error> {
    let mut q = conn
        .query(sql::READY_KEYS)
        .map_err(sqlite)?
        .bind(namespace)
        .bind(activity_type)
        .bind(&limit)
        .bind(&now);
    let mut keys = Vec::new();
    while q.step().map_err(sqlite)? {
        let key = q.text(0)?;
        keys.push(ReadyKey {
            key,
            room: q.int(1),
            weight: q.int(2),
            interval_ns: rows::Columns::opt_int(&q, 3)?,
        });
    }
    Ok(keys)
}

/// Claims up to `limit` due rows of one type's concurrency keys onto `claimed`,
/// counting them by key in `given`.
pub(super) fn run_claim(
    conn: &mut Connection,
    of: &Of<'_>,
    limit: i64,
    rows: Rows<'_>,
    claimed: &mut Vec<ActivityRow>,
    given: &mut HashMap<String, i64>,
) -> Result<(), Error> {
    let Of {
        claim,
        activity_type,
        now,
    } = *of;
    let (statement, key) = match rows {
        Rows::OfKey(key) => (sql::CLAIM_KEYED, key),
        Rows::OneOfEach(keys) => (sql::CLAIM_KEYED_ROUND, keys),
    };
    let mut q = conn
        .query(statement)
        .map_err(sqlite)?
        .bind(&now)
        .bind(&*claim.worker_id)
        .bind(&claim.lease_expires_at)
        .bind(&*claim.namespace)
        .bind(activity_type)
        .bind(&limit)
        .bind(&*claim.identity)
        .bind(&*claim.node)
        .bind(key);
    // The update returns its rows in the table's order; they are sent in the
    // order returned, so put them in claim order (band, rank, id).
    let mut taken = Vec::new();
    while q.step().map_err(sqlite)? {
        // Every row claimed is counted, readable or not (a key that is not UTF-8
        // cannot be submitted).
        if let Ok(Some(key)) = rows::Columns::opt_text(&q, rows::col::CONCURRENCY_KEY) {
            *given.entry(key).or_default() += 1;
        }
        // An unreadable row stays RUNNING, undelivered, until its lease lapses; it
        // must not stop every other claim.
        match decode(&q) {
            Ok(row) => {
                let order = (q.int(CLAIM_BAND), q.int(CLAIM_BAND + 1), row.id);
                taken.push((order, row));
            }
            Err(e) if e.class() == crate::store::Class::Transient => return Err(e),
            Err(e) => rows::unreadable("claim", Some(q.int(0)), &e),
        }
    }
    taken.sort_by_key(|(order, _)| *order);
    claimed.extend(taken.into_iter().map(|(_, row)| row));
    Ok(())
}

/// A row read before [`sql::CLAIM_ROWS`] as that update left it.
pub(super) fn claimed_as(
    mut row: ActivityRow,
    claim: &Claim,
    now: UnixMillis,
) -> Result<ActivityRow, Error> {
    row.attempt = row
        .attempt
        .checked_add(1)
        .ok_or_else(|| Error::Corrupt(format!("row {} has run too many attempts", row.id)))?;
    row.status = ActivityStatus::Running;
    row.started_at = Some(now);
    row.worker_id = Some(claim.worker_id.to_string());
    row.lease_expires_at = Some(claim.lease_expires_at);
    Ok(row)
}

/// Claims up to `limit` due rows of one type without a concurrency key onto
/// `claimed`, in claim order: picked in one read, then taken a chunk at a time
/// (`sql::CLAIM_PICK`).
pub(super) fn claim_unkeyed(
    conn: &mut Connection,
    of: &Of<'_>,
    limit: i64,
    claimed: &mut Vec<ActivityRow>,
) -> Result<(), Error> {
    let Of {
        claim,
        activity_type,
        now,
    } = *of;
    // Each row boxed as it is read: a row is large, and a vector of rows grown
    // one doubling at a time copies every row it holds at each step (5 % of the
    // writer's instructions in a drain); the claimed rows then get their room
    // at once, now that their number is known.
    let mut picked = Vec::new();
    {
        let mut q = conn
            .query(sql::CLAIM_PICK)
            .map_err(sqlite)?
            .bind(&now)
            .bind(&*claim.namespace)
            .bind(activity_type)
            .bind(&limit);
        while q.step().map_err(sqlite)? {
            picked.push((q.int(0), decode(&q).map(Box::new)));
        }
    }
    claimed.reserve(picked.len());
    for chunk in picked.chunks(sql::CLAIM_ROWS_AT_ONCE) {
        let taken = conn
            .run(sql::CLAIM_ROWS, |q| {
                let q = q
                    .bind(&now)
                    .bind(&*claim.worker_id)
                    .bind(&claim.lease_expires_at)
                    .bind(&*claim.identity)
                    .bind(&*claim.node);
                chunk.iter().fold(q, |q, (id, _)| q.bind(id))
            })
            .map_err(sqlite)?;
        if taken != chunk.len() as u64 {
            return Err(Error::Corrupt(format!(
                "{} rows were picked as due and {taken} could be claimed",
                chunk.len()
            )));
        }
    }
    for (id, row) in picked {
        // An unreadable row stays RUNNING, undelivered, until its lease lapses;
        // it must not stop every other claim. A read that failed (out of memory)
        // fails the batch instead, to be tried again.
        match row.and_then(|row| claimed_as(*row, claim, now)) {
            Ok(row) => claimed.push(row),
            Err(e) if e.class() == crate::store::Class::Transient => return Err(e),
            Err(e) => rows::unreadable("claim", Some(id), &e),
        }
    }
    Ok(())
}

/// Claims up to `left` due rows of the concurrency keys of a type with room onto
/// `claimed`: a share each by weight, lowest pass first, then counts what each
/// key was given and moves its pass on.
pub(super) fn claim_keyed(
    conn: &mut Connection,
    of: &Of<'_>,
    left: i64,
    claimed: &mut Vec<ActivityRow>,
) -> Result<(), Error> {
    let keys = ready_keys(conn, &of.claim.namespace, of.activity_type, left, of.now)?;
    if keys.is_empty() {
        return Ok(());
    }
    let total: i64 = keys.iter().map(|k| k.weight).sum();
    let count = keys.len();
    let shares: Vec<i64> = keys
        .iter()
        .map(|k| concurrency::share(left, k.weight, total, k.room))
        .collect();
    let mut given = HashMap::new();
    let before = claimed.len();
    if count > 1 && shares.iter().all(|&s| s == 1) {
        // A row each, from as many keys as there are slots: one statement.
        let names: Vec<&str> = keys.iter().map(|k| k.key.as_str()).collect();
        let names = serde_json::to_string(&names)
            .map_err(|e| Error::Corrupt(format!("concurrency keys: {e}")))?;
        let rows = Rows::OneOfEach(&names);
        run_claim(conn, of, left, rows, claimed, &mut given)?;
    } else {
        for (k, share) in keys.iter().zip(shares) {
            let taken = i64::try_from(claimed.len() - before).unwrap_or(i64::MAX);
            let limit = share.min(left - taken);
            if limit <= 0 {
                break;
            }
            let rows = Rows::OfKey(&k.key);
            run_claim(conn, of, limit, rows, claimed, &mut given)?;
        }
    }
    // One statement a key served (the claim's own rows are not counted by a
    // trigger, see the `0012_key_shares` migration).
    let taken: i64 = given.values().sum();
    for k in &keys {
        let rows = given.get(&k.key).copied().unwrap_or(0);
        // A key that gave nothing though the claim had room has no due row: it
        // moves on a stride all the same, so that keys with due rows come first.
        let strides = match rows {
            0 if taken < left => 1,
            0 => continue,
            rows => rows,
        };
        conn.run(sql::SERVE_KEY, |q| {
            q.bind(&*of.claim.namespace)
                .bind(of.activity_type)
                .bind(k.key.as_str())
                .bind(&rows)
                .bind(&(strides * concurrency::stride(k.weight)))
                .bind(&k.interval_ns)
                .bind(&rate::nanos(of.now))
        })
        .map_err(sqlite)?;
    }
    Ok(())
}

pub(super) fn claim_rows(
    conn: &mut Connection,
    claim: &Claim,
    now: UnixMillis,
) -> Result<Outcome, Error> {
    let now_ns = rate::nanos(now);
    let mut claimed = Vec::new();
    let mut throttled = Vec::new();
    for activity_type in &claim.activity_types {
        let Some(asked) = claim.left_after(claimed.len()) else {
            break;
        };
        let bucket = bucket(conn, &claim.namespace, activity_type)?;
        let left = bucket.map_or(asked, |b| asked.min(b.available(now_ns)));
        let before = claimed.len();
        let of = Of {
            claim,
            activity_type,
            now,
        };
        // Rows with a concurrency key first, the keys with room by weight, then
        // the rest (see the `0009_concurrency_keys` and `0012_key_shares`
        // migrations).
        if left > 0 {
            claim_keyed(conn, &of, left, &mut claimed)?;
        }
        let taken = i64::try_from(claimed.len() - before).unwrap_or(i64::MAX);
        if left > taken {
            claim_unkeyed(conn, &of, left - taken, &mut claimed)?;
        }
        let taken = i64::try_from(claimed.len() - before).unwrap_or(i64::MAX);
        let mut refill = None;
        if let Some(bucket) = bucket {
            let spent = bucket.take(now_ns, taken);
            if taken > 0 {
                conn.run(sql::SPEND, |q| {
                    q.bind(&*claim.namespace)
                        .bind(&**activity_type)
                        .bind(&spent.tat_ns)
                })
                .map_err(sqlite)?;
            }
            refill = spent.refills_at(now_ns);
        }
        // Held back: fewer rows than asked, and none left in the type's bucket or
        // in a waiting key's.
        if taken < asked {
            let key = key_refill(conn, &claim.namespace, activity_type, now)?;
            let key = key.and_then(|at| rate::refill_millis(at, now_ns));
            if let Some(at) = refill.into_iter().chain(key).min() {
                throttled.push((activity_type.clone(), at));
            }
        }
    }
    Ok(Outcome::Claimed {
        rows: claimed,
        throttled,
    })
}
