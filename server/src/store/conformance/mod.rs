//! The behaviour every [`Store`] must have, written once and run against each
//! backend. A behaviour change starts here.
//!
//! Each check is an `async fn(&dyn Store, &Raw)` in the file of its topic, and
//! `conformance!` below runs every one of them twice, on a fresh SQLite store
//! (`sqlite_backend::<check>`) and on a fresh PostgreSQL schema
//! (`postgres_backend::<check>`). What the checks hold a store to:
//!
//! - `submit` and `submit_property`: a key is stored once; what the validator
//!   accepts is stored and read back equal.
//! - `claims`: a claim takes due rows of its types by priority then age, in claim
//!   order, as stored, never past their deadline.
//! - `lifecycle`: an ending is fenced by attempt and status; retry, snooze,
//!   release, fail, cancel and re-drive move a row as documented.
//! - `leases` and `sessions`: who holds a running attempt (renewal, the reclaim's
//!   lease guard, heartbeats, node fences, session takeover).
//! - `batches`: the ops of one batch behave as if applied one by one.
//! - `reads`: lists, counts, running rows and due times, and rows no read trips on.
//! - `history`: every ended attempt is recorded, bounded, and pruned with its row.
//! - `rate_limits`, `concurrency_keys`, `key_turns`, `fairness_keys` and
//!   `priority_aging`: what a claim holds back, and in what order it serves the rest.
//!
//! - `rate_property`: generated mixes of every limit, claimed against a model:
//!   no claim past a limit, no short claim leaving a runnable row waiting.
//!
//! `support` has the helpers the checks share (a default row, the ops, `T0`).

mod batches;
mod claims;
mod concurrency_keys;
mod fairness_keys;
mod history;
mod key_turns;
mod leases;
mod lifecycle;
mod priority_aging;
mod rate_limits;
mod rate_property;
mod reads;
mod sessions;
mod submit;
mod submit_property;
mod support;

use std::sync::Arc;

use super::{PostgresStore, SqliteStore, Store};

/// A fresh, empty store of one backend, and what keeps it alive.
struct Fixture {
    store: Arc<dyn Store>,
    raw: Raw,
    _dir: Option<tempfile::TempDir>,
}

/// A connection beside the store's own, for writing what no operation can (a row
/// an older version poisoned) and reading what no operation returns.
enum Raw {
    Sqlite(sqlx::SqlitePool),
    Postgres(sqlx::PgPool),
}

impl Raw {
    async fn execute(&self, sql: &str) {
        let sql = sqlx::AssertSqlSafe(sql.to_owned());
        let done = match self {
            Raw::Sqlite(pool) => sqlx::query(sql).execute(pool).await.map(|_| ()),
            Raw::Postgres(pool) => sqlx::query(sql).execute(pool).await.map(|_| ()),
        };
        done.unwrap_or_else(|e| panic!("{e}"));
    }

    /// The one integer `sql` answers.
    async fn scalar(&self, sql: &str) -> i64 {
        let sql = sqlx::AssertSqlSafe(sql.to_owned());
        let read = match self {
            Raw::Sqlite(pool) => sqlx::query_scalar(sql).fetch_one(pool).await,
            Raw::Postgres(pool) => sqlx::query_scalar(sql).fetch_one(pool).await,
        };
        read.unwrap_or_else(|e| panic!("{e}"))
    }

    fn is_sqlite(&self) -> bool {
        matches!(self, Raw::Sqlite(_))
    }
}

async fn sqlite() -> Fixture {
    let (dir, url) = crate::store::tests::sqlite_url_for_tests();
    let store = SqliteStore::open(&url)
        .await
        .unwrap_or_else(|e| panic!("open {url}: {e}"));
    let raw = sqlx::SqlitePool::connect(&url)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    Fixture {
        store: Arc::new(store),
        raw: Raw::Sqlite(raw),
        _dir: Some(dir),
    }
}

/// A store in a schema of its own, so tests run in parallel on one server. The
/// PostgreSQL half compiles as ignored where PostgreSQL cannot be had (see
/// `spool_testkit::services`); where it runs, a missing server fails it.
async fn postgres() -> Fixture {
    use sqlx::postgres::PgConnectOptions;
    use std::str::FromStr;
    let url = spool_testkit::fixtures::postgres_schema("conformance").await;
    let options = PgConnectOptions::from_str(&url).unwrap_or_else(|e| panic!("{url}: {e}"));
    let store = PostgresStore::open_with(options.clone())
        .await
        .unwrap_or_else(|e| panic!("open the PostgreSQL store: {e}"));
    let raw = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect_with(options)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    Fixture {
        store: Arc::new(store),
        raw: Raw::Postgres(raw),
        _dir: None,
    }
}

/// Runs each conformance check, named by its topic's module, against every backend.
macro_rules! conformance {
    ($($topic:ident: [$($name:ident),* $(,)?]),* $(,)?) => {
        mod sqlite_backend {
            $($(
                #[tokio::test]
                async fn $name() {
                    let f = super::sqlite().await;
                    super::$topic::$name(f.store.as_ref(), &f.raw).await;
                }
            )*)*
        }
        mod postgres_backend {
            $($(
                #[tokio::test]
                #[cfg_attr(not(spool_test_postgres), ignore = "needs PostgreSQL: docs/TESTING.md")]
                async fn $name() {
                    let f = super::postgres().await;
                    super::$topic::$name(f.store.as_ref(), &f.raw).await;
                }
            )*)*
        }
    };
}

conformance!(
    submit: [
        submit_is_idempotent_per_key,
        submit_conflicts_on_another_type,
        submit_batch_is_all_or_nothing,
        a_batch_answers_existing_keys_without_payloads,
        computed_times_saturate_and_stay_integers,
    ],
    submit_property: [every_submit_is_refused_or_stored_and_read_back_equal],
    claims: [
        claim_takes_due_rows_by_priority_then_age,
        a_claim_returns_its_rows_in_claim_order,
        a_large_claim_takes_each_row_once_in_claim_order,
        a_claimed_row_is_what_the_store_holds,
        claim_respects_limit_types_and_namespace,
        claims_skip_rows_past_schedule_to_close,
        expire_scheduled_fails_only_overdue_waiting_rows,
    ],
    lifecycle: [
        finish_is_fenced_by_attempt_and_status,
        retry_and_snooze_reschedule,
        cancel_and_redrive,
        a_row_at_the_payload_limit_moves_like_any_other,
        rows_at_the_payload_limit_release_together,
    ],
    leases: [
        renew_extends_only_attempts_still_running,
        a_reclaim_is_refused_after_renewal_and_accepted_after_expiry,
        record_heartbeats_is_fenced_by_attempt,
    ],
    sessions: [
        a_lost_sessions_ending_is_fenced_to_its_node,
        a_session_is_taken_over_once_with_its_ticket,
    ],
    batches: [
        runs_of_like_ops_behave_as_op_by_op,
        endings_and_the_claim_that_refills_their_slots_share_a_batch,
        a_long_run_of_completions_judges_each_alone,
    ],
    reads: [
        list_pages_and_filters,
        list_pages_are_bounded_by_bytes,
        every_status_lists_in_order_and_counts_apart_from_other_namespaces,
        stats_count_by_status,
        type_counts_split_the_backlog,
        running_and_due_times,
        an_unreadable_row_is_left_out_of_every_read,
    ],
    history: [
        every_ended_attempt_is_in_the_history,
        history_is_bounded_and_pruned_with_its_activity,
        prune_deletes_only_old_finished_rows,
    ],
    rate_limits: [
        a_rate_limit_holds_claims_to_its_bucket,
        a_keys_rate_limit_holds_only_its_rows,
    ],
    rate_property: [claims_keep_every_limit_and_leave_no_runnable_row_waiting],
    concurrency_keys: [
        a_concurrency_key_runs_at_most_its_limit,
        a_key_may_have_its_own_limit,
        key_counts_follow_every_move_of_their_rows,
        concurrency_strategies_cancel_the_newest_or_the_oldest,
        a_batchs_endings_make_room_for_its_submits,
    ],
    key_turns: [
        keys_share_a_claim_and_take_turns,
        keys_are_served_in_proportion_to_their_weights,
        a_key_back_from_a_retry_has_no_credit_for_its_absence,
        a_key_with_nothing_due_does_not_hold_back_the_others,
    ],
    fairness_keys: [
        a_fairness_keys_backlog_does_not_delay_another_keys_rows,
        a_newcomer_joins_the_head_of_a_backlog_behind_now,
        fairness_keys_are_served_in_proportion_to_their_weights,
        a_weight_set_for_a_fairness_key_places_its_new_rows,
        fairness_keys_order_a_concurrency_keys_own_rows,
    ],
    priority_aging: [
        priority_ages_once_set_and_is_strict_again_when_unset,
        a_priority_aging_change_ranks_waiting_rows_in_steps,
        priority_aging_ranks_a_keys_waiting_rows_again,
    ],
);

/// SQLite alone: its writer's in-memory index of the keys' waiting rows, rebuilt
/// from the file when it opens again.
#[tokio::test]
async fn sqlite_claims_the_waiting_rows_of_keys_after_a_reopen() {
    key_turns::sqlite_claims_the_waiting_rows_of_keys_after_a_reopen().await;
}
