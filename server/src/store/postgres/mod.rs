//! PostgreSQL, for more than one node: several servers share one database.
//!
//! Each batch is one transaction. Claims take rows with `FOR UPDATE SKIP LOCKED`,
//! so nodes claiming at once never take the same row and never wait on each other;
//! cancels, re-drives and expiries lock the rows they change. A multi-activity
//! submit is all or nothing through a savepoint (cheap here).
//!
//! The schema is `migrations/postgres`, the same table as SQLite's in PostgreSQL's
//! types; statuses are the wire enum's numbers.
//!
//! Time is the database's (`DbClock`): every node stamps leases and due times
//! with it and judges them by it, so skew between the nodes' own clocks cannot
//! reclaim a live attempt or hold a due row back.
//!
//! Every session sets `statement_timeout`, `lock_timeout` and
//! `idle_in_transaction_session_timeout` (unless the URL's `options` do), so a node
//! that stalls mid-transaction cannot block the others for long. The URL's
//! `sslmode` (and `sslrootcert`, `sslcert`, `sslkey`) is honoured, with rustls.
//!
//! Nodes tell each other about committed changes with `NOTIFY` on one channel
//! ([`CHANNEL`]): each notification is a JSON envelope of events from one node,
//! which every other node's listener turns into wake-ups. A node ignores its own.

use std::{str::FromStr, sync::Arc};

use sqlx::{
    Row,
    migrate::Migrator,
    postgres::{PgConnectOptions, PgPool, PgPoolOptions, PgRow},
};
use tokio::sync::mpsc;

use super::{
    ActivityRow, AttemptRecord, DueTimes, Error, Event, Key, ListPage, ListQuery, Op, Outcome,
    Remote, RunningPage, SessionTicket, StatusCounts, Store, TakeSession, TypeCounts, rate, rows,
};

mod notify;
mod sql;
mod write;

pub use notify::CHANNEL;

use spool_proto::time::UnixMillis;

/// This version's migrations. Migrations a newer version applied are not an
/// error here: during a rolling upgrade a node of the version before must still
/// start (a crash, a probe's restart, a rollback) beside the nodes that
/// migrated, and every migration keeps what the version before relies on
/// (docs/OPERATIONS.md).
fn migrator() -> Migrator {
    let mut migrator = these_migrations();
    migrator.set_ignore_missing(true);
    migrator
}

fn these_migrations() -> Migrator {
    use super::migration;
    Migrator::with_migrations(vec![
        migration(
            1,
            "activities",
            include_str!("../migrations/postgres/0001_activities.sql"),
        ),
        migration(
            2,
            "headers",
            include_str!("../migrations/postgres/0002_headers.sql"),
        ),
        migration(
            3,
            "attempts",
            include_str!("../migrations/postgres/0003_attempts.sql"),
        ),
        migration(
            4,
            "worker_sessions",
            include_str!("../migrations/postgres/0004_worker_sessions.sql"),
        ),
        migration(
            5,
            "claim_plans",
            include_str!("../migrations/postgres/0005_claim_plans.sql"),
        ),
        migration(
            6,
            "queue_vacuum",
            include_str!("../migrations/postgres/0006_queue_vacuum.sql"),
        ),
        migration(
            7,
            "transition_free_lists",
            include_str!("../migrations/postgres/0007_transition_free_lists.sql"),
        ),
        migration(
            8,
            "priority_aging",
            include_str!("../migrations/postgres/0008_priority_aging.sql"),
        ),
        migration(
            9,
            "upcoming_rows_only",
            include_str!("../migrations/postgres/0009_upcoming_rows_only.sql"),
        ),
        migration(
            10,
            "rate_limits",
            include_str!("../migrations/postgres/0010_rate_limits.sql"),
        ),
        migration(
            11,
            "concurrency_keys",
            include_str!("../migrations/postgres/0011_concurrency_keys.sql"),
        ),
        migration(
            12,
            "keyed_claims",
            include_str!("../migrations/postgres/0012_keyed_claims.sql"),
        ),
        migration(
            13,
            "concurrency_strategies",
            include_str!("../migrations/postgres/0013_concurrency_strategies.sql"),
        ),
        migration(
            14,
            "key_shares",
            include_str!("../migrations/postgres/0014_key_shares.sql"),
        ),
        migration(
            15,
            "key_rate_limits",
            include_str!("../migrations/postgres/0015_key_rate_limits.sql"),
        ),
        migration(
            16,
            "keyed_endings",
            include_str!("../migrations/postgres/0016_keyed_endings.sql"),
        ),
        migration(
            17,
            "hot_key_endings",
            include_str!("../migrations/postgres/0017_hot_key_endings.sql"),
        ),
        migration(
            18,
            "ready_keys",
            include_str!("../migrations/postgres/0018_ready_keys.sql"),
        ),
        migration(
            19,
            "fairness_keys",
            include_str!("../migrations/postgres/0019_fairness_keys.sql"),
        ),
        migration(
            20,
            "fairness_weights",
            include_str!("../migrations/postgres/0020_fairness_weights.sql"),
        ),
        migration(
            21,
            "rerank_in_steps",
            include_str!("../migrations/postgres/0021_rerank_in_steps.sql"),
        ),
    ])
}

/// How long a statement, a wait for a lock, or an open transaction left idle may
/// last on our sessions, unless the URL's `options` say otherwise: a stalled node
/// must not hold locks that block the others for long.
const SESSION_LIMITS: [(&str, &str); 3] = [
    ("statement_timeout", "30s"),
    ("lock_timeout", "10s"),
    ("idle_in_transaction_session_timeout", "60s"),
];

/// The planner settings of the sessions that write (and claim). A claim must read
/// `activities_due` in its order and stop at its `LIMIT`; but on statistics taken
/// when the table was empty, or held only finished rows, every index on SCHEDULED
/// rows looks equally free, and a plan that reads them all and sorts them looks as
/// good, and costs a scan of the whole backlog per claim. No statement these
/// sessions run needs a sort that an index cannot give in order, so sorting is
/// priced out: where an index gives the order, that plan wins whatever the
/// statistics say (PostgreSQL still sorts where nothing else can).
///
/// A sort priced out makes its plan look expensive, and a plan that expensive
/// is compiled by JIT: LLVM took 1.8 s to compile a submit of 500 rows whose
/// fairness keys need a sort. No statement of these sessions runs long enough for
/// compiling to pay, so JIT is off.
const WRITER_PLANNING: [(&str, &str); 2] = [("enable_sort", "off"), ("jit", "off")];

/// Tells the per-row triggers that count keyed rows that this version's statements
/// count them themselves (see the `0016_keyed_endings` migration); nodes of the
/// version before do not set it, and the triggers count theirs.
const KEYED_COUNTS: [(&str, &str); 1] = [("spool.keyed_counts", "statement")];

/// How long taking a pooled connection may wait (and so how long start-up keeps
/// trying an unreachable server).
const ACQUIRE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// `options` with [`SESSION_LIMITS`] added where the URL does not set them.
fn session_limits(options: PgConnectOptions) -> PgConnectOptions {
    let set = options.get_options().unwrap_or_default().to_owned();
    let missing: Vec<_> = SESSION_LIMITS
        .iter()
        .filter(|(name, _)| !set.contains(name))
        .copied()
        .collect();
    if missing.is_empty() {
        options
    } else {
        options.options(missing)
    }
}

/// The database's clock, read without a round trip: the database's time at the
/// last sync plus the monotonic time elapsed since. Every node stamps and judges
/// times by it, so their own wall clocks (skewed, or stepped) do not matter: a
/// lease renewed by one node is judged by the same clock on every other.
struct DbClock {
    /// The database's time (Unix ms) at an instant of this process.
    anchor: std::sync::Mutex<super::Anchored>,
}

/// How often the clock is synced with the database (the monotonic clock drifts
/// little between syncs).
const CLOCK_SYNC: std::time::Duration = std::time::Duration::from_secs(10);

impl DbClock {
    fn now(&self) -> UnixMillis {
        self.anchor.lock().unwrap_or_else(|e| e.into_inner()).now()
    }

    /// Reads the database's clock, placing the reading at the middle of the round
    /// trip. The reading is off by at most half its round trip, so it is taken on
    /// a connection already open (not one the pool is still connecting, or one
    /// queued behind another node's migrations) and the best of a few is kept:
    /// nodes that disagree about the time by a slow round trip would start delayed
    /// rows early, or judge leases wrongly.
    async fn sync(&self, pool: &PgPool) -> Result<(), Error> {
        const READINGS: usize = 3;
        let mut connection = pool.acquire().await?;
        let mut best: Option<(std::time::Duration, i64, std::time::Instant)> = None;
        for _ in 0..READINGS {
            let sent = std::time::Instant::now();
            let db: i64 =
                sqlx::query_scalar("SELECT (extract(epoch from clock_timestamp()) * 1000)::BIGINT")
                    .fetch_one(&mut *connection)
                    .await?;
            let round_trip = sent.elapsed();
            if best.is_none_or(|(fastest, _, _)| round_trip < fastest) {
                best = Some((round_trip, db, sent + round_trip / 2));
            }
        }
        if let Some((_, db, at)) = best {
            *self.anchor.lock().unwrap_or_else(|e| e.into_inner()) = super::Anchored::new(db, at);
        }
        Ok(())
    }

    /// Keeps the clock synced while the store lives.
    fn keep_synced(clock: &Arc<Self>, pool: PgPool) {
        let clock = Arc::downgrade(clock);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(CLOCK_SYNC).await;
                let Some(clock) = clock.upgrade() else { return };
                if let Err(e) = clock.sync(&pool).await {
                    tracing::warn!(error = %e, "cannot read the database's clock; keeping the last reading");
                }
            }
        });
    }
}

/// How often a node checks whether `concurrency_keys` has outgrown its statistics.
const KEY_STATISTICS: std::time::Duration = std::time::Duration::from_secs(2);

/// Keeps the planner's statistics of `concurrency_keys` in step with its size
/// until `stop`: `ANALYZE` once the table holds more than twice the rows it held
/// when last analyzed. A claim's statement joins the keys it served to their
/// rows; on statistics taken before a type had its keys the planner believes
/// the type has one, and reads all of them once per key served (1,000 keys, a
/// claim of 50: 50,000 comparisons, 18 ms a claim), until autovacuum, which
/// looks once a minute by default, analyzes the table.
fn keep_key_statistics(pool: PgPool, stop: tokio_util::sync::CancellationToken) {
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = tokio::time::sleep(KEY_STATISTICS) => {}
                _ = stop.cancelled() => return,
            }
            if let Err(e) = analyze_keys_if_grown(&pool).await {
                tracing::debug!(error = %e, "cannot refresh the statistics of concurrency_keys");
            }
        }
    });
}

async fn analyze_keys_if_grown(pool: &PgPool) -> Result<(), Error> {
    let sizes: Option<(i64, f32)> = sqlx::query_as(
        "SELECT s.n_live_tup, c.reltuples FROM pg_stat_user_tables AS s \
         JOIN pg_class AS c ON c.oid = s.relid WHERE s.relid = 'concurrency_keys'::regclass",
    )
    .fetch_optional(pool)
    .await?;
    if let Some((live, analyzed)) = sizes
        && live > 100
        && live as f32 > 2.0 * analyzed.max(0.0)
    {
        sqlx::query("ANALYZE concurrency_keys")
            .execute(pool)
            .await?;
    }
    Ok(())
}

/// How long a pooled connection may sit unused before it is checked on the way out.
const PING_AFTER_IDLE: std::time::Duration = std::time::Duration::from_secs(1);

/// Pool options that check a connection only when it has sat unused a while. The
/// pool's default pings PostgreSQL before every acquire: a round trip in front of
/// every batch the committer writes. A connection in steady use that breaks fails
/// its request (which is retried or answered with an error) and is closed when it
/// goes back; one idle through a restart is caught here.
fn pool_options() -> PgPoolOptions {
    PgPoolOptions::new()
        .test_before_acquire(false)
        .before_acquire(|conn, meta| {
            Box::pin(async move {
                if meta.idle_for >= PING_AFTER_IDLE {
                    sqlx::Connection::ping(conn).await?;
                }
                Ok(true)
            })
        })
}

pub struct PostgresStore {
    /// Time as the database tells it (see [`DbClock`]).
    clock: Arc<DbClock>,
    /// Writes (the committer's transactions) and the server's own reads (due
    /// times, reclaims), apart from the API's callers so the committer never waits
    /// behind a caller's List.
    pool: PgPool,
    /// Reads for callers of the API (Get, List, Stats, Waits).
    readers: PgPool,
    /// This node on the notification channel: its id (so it can ignore its own),
    /// its schema, and the other nodes it has heard.
    channel: Arc<notify::Channel>,
    /// Ends the store's background upkeep when the store goes.
    _upkeep: tokio_util::sync::DropGuard,
}

impl PostgresStore {
    /// Connects to `postgres://…` and runs migrations.
    pub async fn open(url: &str) -> Result<Self, Error> {
        Self::open_with(PgConnectOptions::from_str(url)?).await
    }

    pub async fn open_with(options: PgConnectOptions) -> Result<Self, Error> {
        let options = session_limits(options).options(KEYED_COUNTS);
        let pool = pool_options()
            .max_connections(4)
            .acquire_timeout(ACQUIRE_TIMEOUT)
            .connect_with(options.clone().options(WRITER_PLANNING))
            .await?;
        // Two readers are kept open: a new connection cost a request about 90 ms
        // in the tests (loopback, TLS negotiated by default; the client mostly
        // waiting, not computing). The first `Get` of a node paid it, and so did
        // a `Get` whose second read came before its first connection was back in
        // the pool.
        let readers = pool_options()
            .max_connections(8)
            .min_connections(2)
            .acquire_timeout(ACQUIRE_TIMEOUT)
            .connect_with(options)
            .await?;
        let mut conn = pool.acquire().await?;
        migrator().run_direct(None, &mut *conn, false).await?;
        drop(conn);
        let clock = Arc::new(DbClock {
            anchor: std::sync::Mutex::new(super::Anchored::new(
                spool_proto::time::now_millis(),
                std::time::Instant::now(),
            )),
        });
        clock.sync(&pool).await?;
        DbClock::keep_synced(&clock, pool.clone());
        let upkeep = tokio_util::sync::CancellationToken::new();
        keep_key_statistics(readers.clone(), upkeep.clone());
        let scope: String = sqlx::query_scalar("SELECT current_schema()::TEXT")
            .fetch_one(&pool)
            .await?;
        Ok(Self {
            clock,
            pool,
            readers,
            channel: notify::Channel::new(uuid::Uuid::now_v7().to_string(), scope),
            _upkeep: upkeep.drop_guard(),
        })
    }
}

fn decode(row: &PgRow) -> Result<ActivityRow, Error> {
    rows::decode(&rows::Sqlx(row))
}

#[async_trait::async_trait]
impl Store for PostgresStore {
    async fn apply(&self, ops: Arc<[Op]>, now: UnixMillis) -> Result<Vec<Outcome>, Error> {
        if let Some(batch) = write::OneStatement::of(&ops) {
            let mut conn = self.pool.acquire().await?;
            return write::apply_one_statement(&mut conn, batch, now).await;
        }
        let mut tx = self.pool.begin().await?;
        let outcomes = write::apply(&mut tx, &ops, now).await?;
        tx.commit().await?;
        Ok(outcomes)
    }

    async fn get(&self, key: &Key) -> Result<Option<ActivityRow>, Error> {
        let mut conn = self.readers.acquire().await?;
        write::select_one(&mut conn, key, sql::SELECT_BY_KEY).await
    }

    async fn list(&self, query: &ListQuery) -> Result<ListPage, Error> {
        // Sizes first, so the page is cut by bytes before any payload is read.
        let status = query.status.map(|s| s as i64);
        let (paths, rows_sql) = if query.newest_first {
            (&sql::LIST_SIZES_NEWEST, sql::LIST_NEWEST)
        } else {
            (&sql::LIST_SIZES, sql::LIST)
        };
        let sizes_sql = paths.of(query.status);
        // Planned for these values each time (an unnamed statement): a generic plan
        // cannot tell a namespace or a status of a hundred rows from one of a
        // million, and walked the primary key through every row of the table for
        // them. Planning costs a fraction of a millisecond; a List is not dispatch.
        let sizes: Vec<(i64, i64)> = sqlx::query(sizes_sql)
            .persistent(false)
            .bind(&query.namespace)
            .bind(query.cursor())
            .bind(status)
            .bind(query.activity_type.as_deref())
            .bind(i64::from(query.limit) + 1)
            .fetch_all(&self.readers)
            .await?
            .iter()
            .map(|r| Ok((r.try_get(0)?, r.try_get::<Option<i64>, _>(1)?.unwrap_or(0))))
            .collect::<Result<_, sqlx::Error>>()?;
        if sizes.is_empty() {
            return Ok(ListPage::default());
        }
        let (last, more) = rows::page_bounds(&sizes, query.limit, query.max_bytes);
        let ids = rows::page_ids(&sizes, last, query.newest_first);
        let rows = sqlx::query(rows_sql)
            .bind(ids)
            .bind(status)
            .fetch_all(&self.readers)
            .await?;
        Ok(ListPage {
            rows: rows::decode_all(&rows, "list"),
            next_after: more.then_some(last),
        })
    }

    async fn stats(&self, namespace: &str) -> Result<StatusCounts, Error> {
        let rows = sqlx::query(sql::STATS)
            .bind(namespace)
            .fetch_all(&self.readers)
            .await?;
        let pairs = rows
            .iter()
            .map(|row| Ok((row.try_get::<i64, _>(0)?, row.try_get::<i64, _>(1)?)))
            .collect::<Result<Vec<_>, sqlx::Error>>()?;
        rows::status_counts(pairs)
    }

    async fn history(&self, id: i64) -> Result<Vec<AttemptRecord>, Error> {
        let rows = sqlx::query(sql::HISTORY)
            .bind(id)
            .fetch_all(&self.readers)
            .await?;
        Ok(rows::decode_attempts(rows.iter().map(rows::Sqlx)))
    }

    async fn type_counts(&self, now: UnixMillis) -> Result<Vec<TypeCounts>, Error> {
        let rows = sqlx::query(sql::TYPE_COUNTS)
            .bind(now)
            .fetch_all(&self.readers)
            .await?;
        rows::type_counts(rows.iter().map(rows::Sqlx))
    }

    async fn running(&self, after_id: i64, limit: u32) -> Result<RunningPage, Error> {
        let rows = sqlx::query(sql::RUNNING)
            .bind(after_id)
            .bind(i64::from(limit))
            .fetch_all(&self.pool)
            .await?;
        Ok(RunningPage {
            next_after: (rows.len() == limit as usize)
                .then(|| rows.last().and_then(|r| r.try_get::<i64, _>("id").ok()))
                .flatten(),
            rows: rows::decode_all(&rows, "running"),
        })
    }

    async fn expired_leases(&self, now: UnixMillis, limit: u32) -> Result<Vec<ActivityRow>, Error> {
        let rows = sqlx::query(sql::EXPIRED_LEASES)
            .bind(now)
            .bind(i64::from(limit))
            .fetch_all(&self.pool)
            .await?;
        Ok(rows::decode_all(&rows, "expired_leases"))
    }

    async fn save_ticket(&self, ticket: &SessionTicket) -> Result<(), Error> {
        sqlx::query(sql::SAVE_TICKET)
            .bind(&ticket.worker_id)
            .bind(&ticket.secret)
            .bind(&ticket.caller)
            .bind(&ticket.registration)
            .bind(ticket.at)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    async fn take_session(&self, take: &TakeSession) -> Result<Option<Vec<ActivityRow>>, Error> {
        let mut tx = self.pool.begin().await?;
        let taken = sqlx::query(sql::TAKE_TICKET)
            .bind(&take.ticket.worker_id)
            .bind(&take.old_secret)
            .bind(&take.ticket.secret)
            .bind(&take.ticket.caller)
            .bind(&take.ticket.registration)
            .bind(take.ticket.at)
            .fetch_optional(&mut *tx)
            .await?;
        if taken.is_none() {
            tx.rollback().await?;
            return Ok(None);
        }
        let rows = sqlx::query(sql::ADOPT)
            .bind(&take.ticket.worker_id)
            .bind(&take.node)
            .fetch_all(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(Some(rows::decode_all(&rows, "adopt")))
    }

    fn single_node(&self) -> bool {
        false
    }

    fn others_staying(&self) -> bool {
        self.channel.others_staying()
    }

    async fn set_draining(&self, draining: bool) {
        self.channel.set_draining(draining);
        notify::announce(&self.pool, &self.channel).await;
    }

    fn writers(&self) -> usize {
        2
    }

    fn now(&self) -> UnixMillis {
        self.clock.now()
    }

    async fn publish(&self, events: Vec<Event>) -> Result<(), Error> {
        notify::publish(&self.pool, &self.channel, events).await
    }

    async fn subscribe(&self) -> Result<Option<mpsc::Receiver<Remote>>, Error> {
        notify::subscribe(self.pool.clone(), self.channel.clone())
            .await
            .map(Some)
    }

    async fn due_times(&self, after: UnixMillis, limit: u32) -> Result<DueTimes, Error> {
        let rows = sqlx::query(sql::DUE_TIMES)
            .bind(after)
            .bind(i64::from(limit))
            .fetch_all(&self.pool)
            .await?;
        let rows = rows
            .iter()
            .map(|r| Ok((r.try_get(0)?, r.try_get(1)?, r.try_get(2)?)))
            .collect::<Result<Vec<_>, sqlx::Error>>()?;
        Ok(rows::due_times(rows, limit))
    }

    async fn rate_limits(
        &self,
        namespace: Option<&str>,
        now: UnixMillis,
    ) -> Result<Vec<rate::RateLimitUse>, Error> {
        let rows = sqlx::query(sql::RATE_LIMITS)
            .bind(namespace)
            .fetch_all(&self.readers)
            .await?;
        rows.iter()
            .map(|r| rows::rate_limit_use(&rows::Sqlx(r), now))
            .collect()
    }

    async fn concurrency_limits(
        &self,
        namespace: Option<&str>,
    ) -> Result<Vec<super::concurrency::ConcurrencyLimit>, Error> {
        let rows = sqlx::query(sql::CONCURRENCY_LIMITS)
            .bind(namespace)
            .fetch_all(&self.readers)
            .await?;
        rows.iter()
            .map(|r| rows::concurrency_limit(&rows::Sqlx(r)))
            .collect()
    }

    async fn fairness_weights(
        &self,
        namespace: Option<&str>,
    ) -> Result<Vec<super::fairness::FairnessWeightUse>, Error> {
        let rows = sqlx::query(sql::FAIRNESS_WEIGHTS)
            .bind(namespace)
            .fetch_all(&self.readers)
            .await?;
        let weights = rows
            .iter()
            .map(|r| rows::fairness_weight(&rows::Sqlx(r)))
            .collect::<Result<Vec<_>, _>>()?;
        super::fairness::with_waiting(weights, |namespace, activity_type| async move {
            Ok(sqlx::query_as(sql::WAITING_BY_FAIRNESS_KEY)
                .bind(namespace)
                .bind(activity_type)
                .fetch_all(&self.readers)
                .await?)
        })
        .await
    }

    async fn concurrency_key(
        &self,
        namespace: &str,
        activity_type: &str,
        key: &str,
    ) -> Result<Option<(u64, u64)>, Error> {
        let row = sqlx::query(sql::CONCURRENCY_KEY)
            .bind(namespace)
            .bind(activity_type)
            .bind(key)
            .fetch_optional(&self.readers)
            .await?;
        row.map(|r| rows::key_counts(&rows::Sqlx(&r))).transpose()
    }

    async fn set_priority_aging(
        &self,
        per_level: Option<std::time::Duration>,
    ) -> Result<bool, Error> {
        let changed = sqlx::query(sql::SET_PRIORITY_AGING)
            .bind(super::priority_aging_ms(per_level))
            .execute(&self.pool)
            .await?
            .rows_affected();
        Ok(changed > 0)
    }
}

#[cfg(test)]
mod tests {
    use std::{
        mem::ManuallyDrop,
        os::fd::{FromRawFd, RawFd},
    };

    use super::*;
    use sqlx::PgConnection;

    /// A store in a schema of its own, with `extra` session options.
    async fn store_with(extra: &[(&str, &str)]) -> PostgresStore {
        let url = crate::fixtures::postgres_schema("pgstore").await;
        let options = PgConnectOptions::from_str(&url)
            .unwrap_or_else(|e| panic!("{e}"))
            .options(extra.iter().copied());
        PostgresStore::open_with(options)
            .await
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// The next remote item that `wanted` accepts, within 10 s (other tests' nodes
    /// share the channel, so unrelated events are skipped).
    async fn next_matching(
        rx: &mut mpsc::Receiver<Remote>,
        wanted: impl Fn(&Remote) -> bool,
    ) -> Remote {
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            match tokio::time::timeout_at(deadline, rx.recv()).await {
                Ok(Some(remote)) if wanted(&remote) => return remote,
                Ok(Some(_)) => {}
                Ok(None) => panic!("the listener stopped"),
                Err(_) => panic!("nothing matching arrived within 10 s"),
            }
        }
    }

    /// A node on the database at `url`, and what it hears from the others.
    async fn listening_node(url: &str) -> (PostgresStore, mpsc::Receiver<Remote>) {
        let store = PostgresStore::open(url)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let heard = store
            .subscribe()
            .await
            .ok()
            .flatten()
            .unwrap_or_else(|| panic!("no listener"));
        (store, heard)
    }

    /// Whether each TCP socket of this process connected to `port` sends without
    /// Nagle's algorithm, by file descriptor.
    fn nodelay_of_sockets_to(port: u16) -> Vec<(RawFd, bool)> {
        let mut found = Vec::new();
        let entries = std::fs::read_dir("/proc/self/fd").unwrap_or_else(|e| panic!("{e}"));
        for entry in entries.flatten() {
            let Ok(target) = std::fs::read_link(entry.path()) else {
                continue;
            };
            let Ok(fd) = entry.file_name().to_string_lossy().parse::<RawFd>() else {
                continue;
            };
            if !target.to_string_lossy().starts_with("socket:") {
                continue;
            }
            // SAFETY: the descriptor is only asked about and never closed (it
            // stays its owner's); one closed meanwhile answers with an error.
            let socket = ManuallyDrop::new(unsafe { std::net::TcpStream::from_raw_fd(fd) });
            if socket.peer_addr().is_ok_and(|peer| peer.port() == port)
                && let Ok(nodelay) = socket.nodelay()
            {
                found.push((fd, nodelay));
            }
        }
        found
    }

    /// A node of the version before starts on a database a newer version
    /// migrated (a rolling upgrade, a rollback): migrations it does not know are
    /// not an error.
    #[tokio::test]
    #[cfg_attr(
        not(spool_test_postgres),
        ignore = "needs PostgreSQL: install it, or set SPOOL_TEST_POSTGRES_URL"
    )]
    async fn a_node_starts_on_a_database_a_newer_version_migrated() {
        let url = crate::fixtures::postgres_schema("pgstore").await;
        let store = PostgresStore::open(&url)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let newer = these_migrations()
            .iter()
            .map(|m| m.version)
            .max()
            .unwrap_or(0)
            + 1;
        sqlx::query(
            "INSERT INTO _sqlx_migrations \
               (version, description, success, checksum, execution_time) \
             VALUES ($1, 'a newer version''s', TRUE, '\\x00', 1)",
        )
        .bind(newer)
        .execute(&store.pool)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
        drop(store);
        let again = PostgresStore::open(&url).await;
        assert!(again.is_ok(), "{:?}", again.err());
    }

    /// Every connection to PostgreSQL sends without Nagle's algorithm. With it, a
    /// statement whose messages leave in two segments waits for the server's
    /// delayed ACK, ~40 ms (sqlx 0.9.0 stopped setting TCP_NODELAY; see
    /// vendor/README.md).
    #[tokio::test]
    #[cfg_attr(
        not(spool_test_postgres),
        ignore = "needs PostgreSQL: install it, or set SPOOL_TEST_POSTGRES_URL"
    )]
    async fn connections_to_postgres_send_without_nagle() {
        let url = crate::fixtures::postgres_schema("pgstore").await;
        let port = PgConnectOptions::from_str(&url)
            .unwrap_or_else(|e| panic!("{e}"))
            .get_port();
        let store = PostgresStore::open(&url)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        // Held, so both pools have a connection open while the sockets are read.
        let _writer = store.pool.acquire().await.unwrap_or_else(|e| panic!("{e}"));
        let _reader = store
            .readers
            .acquire()
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let sockets = nodelay_of_sockets_to(port);
        assert!(sockets.len() >= 2, "connections found: {sockets:?}");
        let nagled: Vec<_> = sockets.iter().filter(|(_, nodelay)| !nodelay).collect();
        assert!(
            nagled.is_empty(),
            "sockets with Nagle's algorithm on: {nagled:?}"
        );
    }

    /// A batch with claims of several rate-limited types locks all their buckets
    /// in one order before any claim: held up at the first bucket, it holds none
    /// after it. Claim by claim it would lock `t3` (its first claim's), then wait
    /// for `t2` holding it, and a batch naming them the other way round would
    /// wait for it in turn.
    #[tokio::test]
    #[cfg_attr(
        not(spool_test_postgres),
        ignore = "needs PostgreSQL: install it, or set SPOOL_TEST_POSTGRES_URL"
    )]
    async fn a_batch_locks_its_claims_rate_limit_buckets_in_one_order() {
        let store = Arc::new(store_with(&[]).await);
        for activity_type in ["t2", "t3"] {
            let limit = rate::RateLimit {
                namespace: "default".into(),
                activity_type: activity_type.into(),
                key: None,
                per_period: 1_000,
                period: std::time::Duration::from_secs(1),
                burst: 1_000,
            };
            store
                .apply(Arc::from([Op::SetRateLimit(limit)]), 1_000)
                .await
                .unwrap_or_else(|e| panic!("{e}"));
        }
        const LOCK: &str = "SELECT 1 FROM rate_limits \
             WHERE namespace = 'default' AND activity_type = $1 FOR UPDATE";
        let mut holder = store.pool.begin().await.unwrap_or_else(|e| panic!("{e}"));
        sqlx::query(LOCK)
            .bind("t2")
            .execute(&mut *holder)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let claim = |activity_type: &str, worker: &str| {
            Op::Claim(crate::store::Claim {
                namespace: "default".into(),
                activity_types: vec![activity_type.into()],
                worker_id: worker.into(),
                identity: "host".into(),
                node: "node".into(),
                limit: 10,
                lease_expires_at: 60_000,
                epoch: 0,
            })
        };
        let batch = {
            let store = store.clone();
            let ops: Arc<[Op]> = Arc::from([claim("t3", "w1"), claim("t2", "w2")]);
            tokio::spawn(async move { store.apply(ops, 1_000).await })
        };
        let mut probe = store.pool.acquire().await.unwrap_or_else(|e| panic!("{e}"));
        let schema: String = sqlx::query_scalar("SELECT current_schema()")
            .fetch_one(&mut *probe)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        crate::fixtures::eventually_for(
            std::time::Duration::from_secs(10),
            "the batch to wait for the held bucket",
            || async {
                let waiting: i64 = sqlx::query_scalar(
                    "SELECT COUNT(*) FROM pg_stat_activity \
                     WHERE wait_event_type = 'Lock' AND query LIKE '%rate_limits%' \
                       AND pid IN (SELECT pid FROM pg_locks l JOIN pg_class c ON c.oid = l.relation \
                         JOIN pg_namespace n ON n.oid = c.relnamespace \
                         WHERE c.relname = 'rate_limits' AND n.nspname = $1)",
                )
                .bind(&schema)
                .fetch_one(&mut *store.pool.acquire().await.ok()?)
                .await
                .ok()?;
                (waiting > 0).then_some(())
            },
        )
        .await;
        let mut tx = store.pool.begin().await.unwrap_or_else(|e| panic!("{e}"));
        let t3 = sqlx::query(
            "SELECT 1 FROM rate_limits \
             WHERE namespace = 'default' AND activity_type = $1 FOR UPDATE NOWAIT",
        )
        .bind("t3")
        .execute(&mut *tx)
        .await;
        drop(tx);
        holder.commit().await.unwrap_or_else(|e| panic!("{e}"));
        let applied = batch.await.unwrap_or_else(|e| panic!("{e}"));
        assert!(
            t3.is_ok(),
            "the batch held t3's bucket while it waited for t2's: {t3:?}"
        );
        assert!(applied.is_ok(), "{applied:?}");
    }

    /// Publish/subscribe between two nodes on one schema: once they have heard
    /// each other, one's events reach the other, not itself; a listener whose
    /// connection is cut comes back and says `Resync`.
    #[tokio::test]
    #[cfg_attr(
        not(spool_test_postgres),
        ignore = "needs PostgreSQL: install it, or set SPOOL_TEST_POSTGRES_URL"
    )]
    async fn events_reach_other_nodes_and_a_cut_listener_resyncs() {
        let url = crate::fixtures::postgres_schema("pgstore").await;
        let (a, mut from_a) = listening_node(&url).await;
        let (b, mut from_b) = listening_node(&url).await;
        crate::fixtures::eventually_for(
            std::time::Duration::from_secs(5),
            "the two nodes to hear each other",
            || async { (a.channel.others_present() && b.channel.others_present()).then_some(()) },
        )
        .await;
        // Each, on first hearing the other, reads the store again: the other did not
        // publish for it until then.
        for from in [&mut from_a, &mut from_b] {
            assert!(matches!(
                next_matching(from, |r| matches!(r, Remote::Resync)).await,
                Remote::Resync
            ));
        }
        let key = Key {
            namespace: "default".into(),
            workflow_id: format!("wf-{}", uuid::Uuid::new_v4().simple()),
            activity_id: "a".into(),
        };
        let finished = Event::Finished { key: key.clone() };
        let is_ours = |r: &Remote| matches!(r, Remote::Event(Event::Finished { key: k }) if k.workflow_id == key.workflow_id);
        b.publish(vec![finished.clone()])
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(
            matches!(next_matching(&mut from_a, is_ours).await, Remote::Event(e) if e == finished)
        );
        // A node does not hear itself: b's own listener gets a's next event, never its own.
        let second = Event::Finished {
            key: Key {
                activity_id: "b".into(),
                ..key.clone()
            },
        };
        a.publish(vec![second.clone()])
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(
            matches!(next_matching(&mut from_b, is_ours).await, Remote::Event(e) if e == second),
            "b heard a, not its own earlier event"
        );
        // Cut every listening connection: each listener reconnects and says Resync.
        sqlx::query(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
             WHERE query ILIKE 'LISTEN%' AND pid <> pg_backend_pid()",
        )
        .execute(&a.pool)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
        assert!(matches!(
            next_matching(&mut from_a, |r| matches!(r, Remote::Resync)).await,
            Remote::Resync
        ));
    }

    /// A cancel of a running attempt committed by a node that had not yet heard
    /// another reaches the other once they hear each other: the worker running
    /// the attempt may be connected there.
    #[tokio::test]
    #[cfg_attr(
        not(spool_test_postgres),
        ignore = "needs PostgreSQL: install it, or set SPOOL_TEST_POSTGRES_URL"
    )]
    async fn a_cancel_committed_before_another_node_was_heard_reaches_it() {
        let url = crate::fixtures::postgres_schema("pgstore").await;
        let (a, _from_a) = listening_node(&url).await;
        let cancelled = Event::Cancelled {
            worker_id: "w".into(),
            key: Key {
                namespace: "default".into(),
                workflow_id: format!("wf-{}", uuid::Uuid::new_v4().simple()),
                activity_id: "a".into(),
            },
            attempt: 1,
            reason: "no longer wanted".into(),
        };
        a.publish(vec![cancelled.clone()])
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let (_b, mut from_b) = listening_node(&url).await;
        let told = next_matching(&mut from_b, |r| {
            matches!(r, Remote::Event(Event::Cancelled { .. }))
        })
        .await;
        assert!(matches!(told, Remote::Event(e) if e == cancelled));
    }

    /// A node alone in its schema publishes nothing, though nodes of other
    /// schemas (other tests) talk on the same channel of the same database.
    #[tokio::test]
    #[cfg_attr(
        not(spool_test_postgres),
        ignore = "needs PostgreSQL: install it, or set SPOOL_TEST_POSTGRES_URL"
    )]
    async fn a_node_alone_in_its_schema_publishes_nothing() {
        let alone = store_with(&[]).await;
        let _events = alone.subscribe().await.unwrap_or_else(|e| panic!("{e}"));
        let mut watcher = sqlx::postgres::PgListener::connect_with(&alone.pool)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        watcher
            .listen(notify::CHANNEL)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        // Past a few hellos, in case another node were there to be heard.
        tokio::time::sleep(std::time::Duration::from_millis(2_500)).await;
        assert!(!alone.channel.others_present());
        let key = Key {
            namespace: "default".into(),
            workflow_id: "wf".into(),
            activity_id: "a".into(),
        };
        alone
            .publish(vec![Event::Finished { key }])
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_millis(1_500);
        while let Ok(received) = tokio::time::timeout_at(deadline, watcher.recv()).await {
            let payload = received.unwrap_or_else(|e| panic!("{e}"));
            let envelope: serde_json::Value =
                serde_json::from_str(payload.payload()).unwrap_or_default();
            let from_alone = envelope["node"].as_str() == Some(alone.channel.node());
            let has_events = envelope["events"]
                .as_array()
                .is_some_and(|events| !events.is_empty());
            assert!(!(from_alone && has_events), "published alone: {envelope}");
        }
    }

    /// The claim's generic plan (what a prepared statement runs after a few calls)
    /// as PostgreSQL would run it now.
    async fn claim_plan(conn: &mut PgConnection) -> String {
        sqlx::query("SET plan_cache_mode = force_generic_plan")
            .execute(&mut *conn)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let name = format!(
            "claim_plan_{}",
            NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        );
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "PREPARE {name}(BIGINT, TEXT, BIGINT, TEXT, TEXT, BIGINT, TEXT, TEXT) AS {}",
            sql::CLAIM
        )))
        .execute(&mut *conn)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
        let plan: Vec<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "EXPLAIN EXECUTE {name}(9000000000000, 'w', 1, 'ns', 't', 50, 'i', 'n')"
        )))
        .fetch_all(&mut *conn)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
        plan.join("\n")
    }

    /// The lines of `plan` under its CTE `name`.
    fn cte_plan(plan: &str, name: &str) -> String {
        let header = format!("  CTE {name}");
        plan.lines()
            .skip_while(|line| *line != header)
            .skip(1)
            .take_while(|line| line.starts_with("    "))
            .collect::<Vec<_>>()
            .join("\n")
    }

    async fn analyze(conn: &mut PgConnection) {
        sqlx::query("ANALYZE activities")
            .execute(conn)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
    }

    /// Inserts `n` rows of type `t` with status `status`.
    async fn fill(conn: &mut PgConnection, n: i64, status: i64) {
        sqlx::query(
            "INSERT INTO activities (namespace, workflow_id, activity_id, activity_type, \
               status, max_attempts, initial_interval_ms, backoff_coefficient, \
               max_interval_ms, input, created_at, next_at, finished_at) \
             SELECT 'ns', 'wf', gen_random_uuid()::TEXT, 't', $2, 3, 1000, 2, 10000, '', \
               g, g, CASE WHEN $2 >= 3 THEN g END \
             FROM generate_series(1, $1) AS g",
        )
        .bind(n)
        .bind(status)
        .execute(&mut *conn)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    }

    /// A change of the priority aging over a backlog larger than one statement's
    /// timeout can rank: the setting is stored at once, and the rows are ranked
    /// again in steps, each well inside the timeout, until every waiting row has
    /// the rank the new setting gives it.
    #[tokio::test]
    #[cfg_attr(
        not(spool_test_postgres),
        ignore = "needs PostgreSQL: install it, or set SPOOL_TEST_POSTGRES_URL"
    )]
    async fn a_priority_aging_change_over_a_large_backlog_fits_the_statement_timeout() {
        let store = store_with(&[("statement_timeout", "300ms")]).await;
        let mut tx = store.pool.begin().await.unwrap_or_else(|e| panic!("{e}"));
        sqlx::query("SET LOCAL statement_timeout = 0")
            .execute(&mut *tx)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        fill(&mut tx, 100_000, 1).await;
        sqlx::query("UPDATE activities SET priority = id % 5, claim_band = -(id % 5)")
            .execute(&mut *tx)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        tx.commit().await.unwrap_or_else(|e| panic!("{e}"));
        // The whole backlog in one statement, as a change used to rank it, does
        // not fit the timeout.
        let whole = sqlx::query(concat!(
            "UPDATE activities SET claim_rank = ",
            rank!("COALESCE(fair_at, next_at)", "priority"),
            " WHERE status = 1"
        ))
        .execute(&store.pool)
        .await;
        assert!(
            whole.is_err_and(|e| e.to_string().contains("statement timeout")),
            "the backlog is too small to show it"
        );
        let changed = store
            .set_priority_aging(Some(std::time::Duration::from_secs(1)))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(changed);
        let mut ranked = 0;
        loop {
            let ops: Arc<[Op]> = Arc::from(vec![Op::Rerank { ids: 2_000 }]);
            match store.apply(ops, store.now()).await.as_deref() {
                Ok([Outcome::Reranked(Some(step))]) => {
                    ranked += step.rows;
                    if step.done {
                        break;
                    }
                }
                other => panic!("a step failed: {other:?}"),
            }
        }
        assert_eq!(ranked, 100_000);
        let stale: i64 = sqlx::query_scalar(concat!(
            "SELECT COUNT(*) FROM activities WHERE status = 1 AND (claim_band <> ",
            band!("priority", "concurrency_key"),
            " OR claim_rank <> ",
            rank!("COALESCE(fair_at, next_at)", "priority"),
            ")"
        ))
        .fetch_one(&store.pool)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(stale, 0);
    }

    /// A claim is a range scan of `activities_due`, in order, whatever the planner
    /// believes about the table: statistics taken when it was empty, or when every
    /// row had finished, or true ones. A plan that sorts, hashes or scans the
    /// table reads every waiting row on every claim, which at a million rows is
    /// the whole drain's time.
    #[tokio::test]
    #[cfg_attr(
        not(spool_test_postgres),
        ignore = "needs PostgreSQL: install it, or set SPOOL_TEST_POSTGRES_URL"
    )]
    async fn a_claim_is_a_range_scan_of_the_due_index_whatever_the_statistics() {
        let store = store_with(&[]).await;
        let mut conn = store.pool.acquire().await.unwrap_or_else(|e| panic!("{e}"));
        let check = |plan: String, when: &str| {
            assert!(
                plan.contains("Index Scan using activities_due"),
                "{when}: {plan}"
            );
            assert!(!plan.contains("Seq Scan"), "{when}: Seq Scan in {plan}");
            // The reads of activities (CTEs `k` and `c`) must not sort or hash; a
            // hash of the claim's own few rows, counting them per key, may.
            for cte in ["k", "c"] {
                let reads = cte_plan(&plan, cte);
                assert!(!reads.is_empty(), "{when}: no CTE {cte} in {plan}");
                for bad in ["Sort", "Hash"] {
                    assert!(!reads.contains(bad), "{when}: {bad} in CTE {cte}: {plan}");
                }
            }
        };
        analyze(&mut conn).await;
        fill(&mut conn, 20_000, 1).await;
        check(claim_plan(&mut conn).await, "analyzed empty, then filled");
        sqlx::query("UPDATE activities SET status = 3, finished_at = 1")
            .execute(&mut *conn)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        fill(&mut conn, 50_000, 3).await;
        analyze(&mut conn).await;
        fill(&mut conn, 20_000, 1).await;
        check(
            claim_plan(&mut conn).await,
            "analyzed all finished, then a backlog",
        );
        analyze(&mut conn).await;
        check(claim_plan(&mut conn).await, "true statistics");
    }

    /// Reads (`Get`, lists, limits) find connections open from the start and kept
    /// open: a request that had to open one waited about 90 ms for it.
    #[tokio::test]
    #[cfg_attr(
        not(spool_test_postgres),
        ignore = "needs PostgreSQL: install it, or set SPOOL_TEST_POSTGRES_URL"
    )]
    async fn readers_are_connected_before_the_first_read() {
        let store = store_with(&[]).await;
        assert!(
            store.readers.num_idle() >= 1,
            "no reader connection open after opening the store"
        );
        crate::fixtures::eventually_for(
            std::time::Duration::from_secs(5),
            "two reader connections",
            || async { (store.readers.num_idle() >= 2).then_some(()) },
        )
        .await;
    }

    /// Once a type's keys outgrow the statistics taken before they existed, the
    /// store analyzes them again by itself, and the claim's update of the keys it
    /// served reads each key once. On the stale statistics the plan read every key
    /// of the type once per key served: a keyed drain of 1,000 keys ran at half
    /// speed until autovacuum came by.
    #[tokio::test]
    #[cfg_attr(
        not(spool_test_postgres),
        ignore = "needs PostgreSQL: install it, or set SPOOL_TEST_POSTGRES_URL"
    )]
    async fn keys_outgrowing_their_statistics_are_analyzed_again() {
        let store = store_with(&[]).await;
        let mut conn = store.pool.acquire().await.unwrap_or_else(|e| panic!("{e}"));
        sqlx::query("ANALYZE concurrency_keys")
            .execute(&mut *conn)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        sqlx::query(
            "INSERT INTO concurrency_keys (namespace, activity_type, concurrency_key, waiting) \
             SELECT 'ns', 't', 'key-' || g, 40 FROM generate_series(1, 1000) AS g",
        )
        .execute(&mut *conn)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
        loop {
            let analyzed: f32 = sqlx::query_scalar(
                "SELECT reltuples FROM pg_class WHERE oid = 'concurrency_keys'::regclass",
            )
            .fetch_one(&mut *conn)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
            if analyzed >= 1000.0 {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "1,000 keys, statistics of {analyzed} rows after 15 s"
            );
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
        let plan = claim_plan(&mut conn).await;
        // The stale plan: a nested loop over the type's keys, comparing each with
        // every key served (a hash join, or a lookup by key, reads each once).
        let served = cte_plan(&plan, "kb");
        assert!(
            !served.contains("Join Filter: (q.concurrency_key"),
            "every key of the type read once per key served: {plan}"
        );
    }

    /// Callers holding every API read connection do not hold up the committer's
    /// writes or the server's own reads.
    #[tokio::test]
    #[cfg_attr(
        not(spool_test_postgres),
        ignore = "needs PostgreSQL: install it, or set SPOOL_TEST_POSTGRES_URL"
    )]
    async fn writes_never_wait_behind_callers_reads() {
        let store = store_with(&[]).await;
        let mut held = Vec::new();
        for _ in 0..8 {
            held.push(
                store
                    .readers
                    .acquire()
                    .await
                    .unwrap_or_else(|e| panic!("{e}")),
            );
        }
        let quick = std::time::Duration::from_secs(2);
        let applied = tokio::time::timeout(
            quick,
            store.apply(
                Arc::from(vec![Op::Prune {
                    before: 0,
                    limit: 1,
                }]),
                0,
            ),
        )
        .await;
        assert!(matches!(applied, Ok(Ok(_))), "a write waited: {applied:?}");
        let due = tokio::time::timeout(quick, store.due_times(0, 10)).await;
        assert!(matches!(due, Ok(Ok(_))), "due times waited");
        drop(held);
    }

    /// `sslmode` in the URL is honoured: `require` speaks TLS (the server's own
    /// certificate here is self-signed), `verify-full` refuses a certificate no
    /// trusted CA signed.
    #[tokio::test]
    #[cfg_attr(
        not(spool_test_postgres),
        ignore = "needs PostgreSQL: install it, or set SPOOL_TEST_POSTGRES_URL"
    )]
    async fn the_urls_sslmode_is_honoured() {
        let url = crate::fixtures::postgres_url();
        let with = |mode: &str| {
            let separator = if url.contains('?') { '&' } else { '?' };
            format!("{url}{separator}sslmode={mode}")
        };
        let pool = PgPoolOptions::new()
            .max_connections(1)
            .connect(&with("require"))
            .await
            .unwrap_or_else(|e| panic!("sslmode=require: {e}"));
        let encrypted: bool =
            sqlx::query_scalar("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
                .fetch_one(&pool)
                .await
                .unwrap_or_else(|e| panic!("{e}"));
        assert!(encrypted, "sslmode=require must speak TLS");
        let verified = PostgresStore::open(&with("verify-full")).await;
        assert!(
            verified.is_err(),
            "verify-full must refuse the self-signed certificate"
        );
    }

    /// A node of the version before, sharing the database during a rolling
    /// upgrade, counts keyed rows through the per-row triggers; this version's
    /// sessions count them in their own statements, and the triggers leave them
    /// alone (see the `0016_keyed_endings` migration).
    #[tokio::test]
    #[cfg_attr(
        not(spool_test_postgres),
        ignore = "needs PostgreSQL: install it, or set SPOOL_TEST_POSTGRES_URL"
    )]
    async fn sessions_of_the_version_before_count_keys_through_the_triggers() {
        let store = store_with(&[]).await;
        let mut conn = store.pool.acquire().await.unwrap_or_else(|e| panic!("{e}"));
        let run = |sql: &'static str| sqlx::query(sql);
        async fn counts(conn: &mut PgConnection) -> Option<(i64, i64)> {
            sqlx::query_as::<_, (i64, i64)>(
                "SELECT waiting, running FROM concurrency_keys WHERE concurrency_key = 'k'",
            )
            .fetch_optional(conn)
            .await
            .unwrap_or_else(|e| panic!("{e}"))
        }
        let insert = "INSERT INTO activities (namespace, workflow_id, activity_id, \
             activity_type, status, max_attempts, initial_interval_ms, backoff_coefficient, \
             max_interval_ms, input, created_at, next_at, concurrency_key) \
             VALUES ('ns', 'wf', 'a', 't', 1, 3, 1000, 2, 10000, '', 1, 1, 'k')";
        // This version's session: the trigger leaves the row to the statement.
        run(insert)
            .execute(&mut *conn)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(counts(&mut conn).await, None);
        run("DELETE FROM activities")
            .execute(&mut *conn)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        // The version before's: submit, claim and ending counted by the triggers.
        run("SET spool.keyed_counts = ''")
            .execute(&mut *conn)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        run(insert)
            .execute(&mut *conn)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(counts(&mut conn).await, Some((1, 0)));
        run("UPDATE activities SET status = 2")
            .execute(&mut *conn)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(counts(&mut conn).await, Some((0, 1)));
        run("UPDATE activities SET status = 3")
            .execute(&mut *conn)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(counts(&mut conn).await, None, "an empty key goes");
        run("RESET spool.keyed_counts")
            .execute(&mut *conn)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
    }

    /// A submit to a key already waiting, and an ending, move the key's counts in
    /// place: heap-only updates, so no new entry in any index of
    /// `concurrency_keys` (see the `0017_hot_key_endings` and `0018_ready_keys`
    /// migrations; neither was heap-only before them).
    #[tokio::test]
    #[cfg_attr(
        not(spool_test_postgres),
        ignore = "needs PostgreSQL: install it, or set SPOOL_TEST_POSTGRES_URL"
    )]
    async fn submits_and_endings_move_their_keys_counts_in_place() {
        use crate::store::{Attempt, Claim, Transition};
        let store = store_with(&[]).await;
        let keyed = |id: &str| {
            let mut activity = crate::store::new_activity_for_tests(id, "t");
            activity.concurrency_key = Some("k".into());
            activity
        };
        let now = keyed("a").next_at;
        // How many updates of `concurrency_keys` `op` made, and how many of them
        // heap-only, as this session counts them (its counts not yet reported
        // include earlier transactions, hence the difference); rolled back.
        let counted = |op: Op| {
            let store = &store;
            async move {
                let mut tx = store.pool.begin().await.unwrap_or_else(|e| panic!("{e}"));
                let counts = "SELECT pg_stat_get_xact_tuples_updated(oid), \
                       pg_stat_get_xact_tuples_hot_updated(oid) \
                     FROM pg_class WHERE oid = 'concurrency_keys'::regclass";
                let (updated, in_place): (i64, i64) = sqlx::query_as(counts)
                    .fetch_one(&mut *tx)
                    .await
                    .unwrap_or_else(|e| panic!("{e}"));
                let outcomes = write::apply(&mut tx, &[op], now + 1)
                    .await
                    .unwrap_or_else(|e| panic!("{e}"));
                assert!(
                    !matches!(outcomes[..], [Outcome::Finished { accepted: false }]),
                    "{outcomes:?}"
                );
                let (updated_after, in_place_after): (i64, i64) = sqlx::query_as(counts)
                    .fetch_one(&mut *tx)
                    .await
                    .unwrap_or_else(|e| panic!("{e}"));
                (updated_after - updated, in_place_after - in_place)
            }
        };
        let claim = Op::Claim(Claim {
            namespace: "default".into(),
            activity_types: vec![Arc::from("t")],
            worker_id: "w".into(),
            identity: "host".into(),
            node: "node".into(),
            limit: 1,
            lease_expires_at: now + 30_000,
            epoch: 0,
        });
        let outcomes = store
            .apply(
                vec![Op::Submit(vec![keyed("a"), keyed("b")]), claim].into(),
                now,
            )
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let Some(Outcome::Claimed { rows, .. }) = outcomes.last() else {
            panic!("no claim in {outcomes:?}");
        };
        let [row] = rows.as_slice() else {
            panic!("claimed {rows:?}");
        };
        assert_eq!(
            counted(Op::Submit(vec![keyed("c")])).await,
            (1, 1),
            "a submit: (updates, heap-only updates)"
        );
        let ending = Op::Finish {
            attempt: Arc::new(Attempt::from_row(row)),
            transition: Transition::Complete {
                output: Default::default(),
            },
            lease_expired_by: None,
        };
        assert_eq!(
            counted(ending).await,
            (1, 1),
            "an ending: (updates, heap-only updates)"
        );
    }

    /// Every pooled session carries the limits, and a URL's own setting wins.
    #[tokio::test]
    #[cfg_attr(
        not(spool_test_postgres),
        ignore = "needs PostgreSQL: install it, or set SPOOL_TEST_POSTGRES_URL"
    )]
    async fn sessions_set_statement_lock_and_idle_timeouts() {
        let store = store_with(&[("lock_timeout", "3s")]).await;
        let show = |name: &'static str| {
            let pool = store.pool.clone();
            async move {
                sqlx::query_scalar::<_, String>(sqlx::AssertSqlSafe(format!("SHOW {name}")))
                    .fetch_one(&pool)
                    .await
                    .unwrap_or_else(|e| panic!("{e}"))
            }
        };
        assert_eq!(show("statement_timeout").await, "30s");
        assert_eq!(show("spool.keyed_counts").await, "statement");
        assert_eq!(show("idle_in_transaction_session_timeout").await, "1min");
        assert_eq!(
            show("lock_timeout").await,
            "3s",
            "the URL's own setting wins"
        );
    }
}
