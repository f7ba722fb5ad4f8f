//! The reads both dialects make the same way, written once: each dialect's
//! module invokes [`shared_reads!`] with its pool type, and the statements come
//! from its own `sql` module. Rows decode through `rows`, as every read does.

/// Defines `mod reads` in the invoking dialect's module: one function per read,
/// taking the pool it runs on (callers' reads, or the server's own).
macro_rules! shared_reads {
    ($pool:ty) => {
        mod reads {
            use super::*;

            pub(super) async fn stats(
                pool: &$pool,
                namespace: &str,
            ) -> Result<StatusCounts, Error> {
                let rows = sqlx::query(sql::STATS)
                    .bind(namespace)
                    .fetch_all(pool)
                    .await?;
                let pairs = rows
                    .iter()
                    .map(|row| Ok((row.try_get::<i64, _>(0)?, row.try_get::<i64, _>(1)?)))
                    .collect::<Result<Vec<_>, sqlx::Error>>()?;
                rows::status_counts(pairs)
            }

            pub(super) async fn history(
                pool: &$pool,
                id: i64,
            ) -> Result<Vec<AttemptRecord>, Error> {
                let rows = sqlx::query(sql::HISTORY).bind(id).fetch_all(pool).await?;
                Ok(rows::decode_attempts(rows.iter().map(rows::Sqlx)))
            }

            pub(super) async fn type_counts(
                pool: &$pool,
                now: UnixMillis,
            ) -> Result<Vec<TypeCounts>, Error> {
                let rows = sqlx::query(sql::TYPE_COUNTS)
                    .bind(now)
                    .fetch_all(pool)
                    .await?;
                rows::type_counts(rows.iter().map(rows::Sqlx))
            }

            pub(super) async fn running(
                pool: &$pool,
                after_id: i64,
                limit: u32,
            ) -> Result<RunningPage, Error> {
                let rows = sqlx::query(sql::RUNNING)
                    .bind(after_id)
                    .bind(i64::from(limit))
                    .fetch_all(pool)
                    .await?;
                Ok(RunningPage {
                    next_after: (rows.len() == limit as usize)
                        .then(|| rows.last().and_then(|r| r.try_get::<i64, _>("id").ok()))
                        .flatten(),
                    rows: rows::decode_all(&rows, "running"),
                })
            }

            pub(super) async fn expired_leases(
                pool: &$pool,
                now: UnixMillis,
                limit: u32,
            ) -> Result<Vec<ActivityRow>, Error> {
                let rows = sqlx::query(sql::EXPIRED_LEASES)
                    .bind(now)
                    .bind(i64::from(limit))
                    .fetch_all(pool)
                    .await?;
                Ok(rows::decode_all(&rows, "expired_leases"))
            }

            pub(super) async fn due_times(
                pool: &$pool,
                after: UnixMillis,
                limit: u32,
            ) -> Result<DueTimes, Error> {
                let rows = sqlx::query(sql::DUE_TIMES)
                    .bind(after)
                    .bind(i64::from(limit))
                    .fetch_all(pool)
                    .await?;
                let rows = rows
                    .iter()
                    .map(|r| Ok((rows::int(r, "next_at")?, r.try_get(1)?, r.try_get(2)?)))
                    .collect::<Result<Vec<_>, Error>>()?;
                Ok(rows::due_times(rows, limit))
            }

            pub(super) async fn rate_limits(
                pool: &$pool,
                namespace: Option<&str>,
                now: UnixMillis,
            ) -> Result<Vec<rate::RateLimitUse>, Error> {
                let rows = sqlx::query(sql::RATE_LIMITS)
                    .bind(namespace)
                    .fetch_all(pool)
                    .await?;
                rows.iter()
                    .map(|r| rows::rate_limit_use(&rows::Sqlx(r), now))
                    .collect()
            }

            pub(super) async fn concurrency_limits(
                pool: &$pool,
                namespace: Option<&str>,
            ) -> Result<Vec<crate::store::concurrency::ConcurrencyLimit>, Error> {
                let rows = sqlx::query(sql::CONCURRENCY_LIMITS)
                    .bind(namespace)
                    .fetch_all(pool)
                    .await?;
                rows.iter()
                    .map(|r| rows::concurrency_limit(&rows::Sqlx(r)))
                    .collect()
            }

            pub(super) async fn fairness_weights(
                pool: &$pool,
                namespace: Option<&str>,
            ) -> Result<Vec<crate::store::fairness::FairnessWeightUse>, Error> {
                let rows = sqlx::query(sql::FAIRNESS_WEIGHTS)
                    .bind(namespace)
                    .fetch_all(pool)
                    .await?;
                let weights = rows
                    .iter()
                    .map(|r| rows::fairness_weight(&rows::Sqlx(r)))
                    .collect::<Result<Vec<_>, _>>()?;
                crate::store::fairness::with_waiting(
                    weights,
                    |namespace, activity_type| async move {
                        Ok(sqlx::query_as(sql::WAITING_BY_FAIRNESS_KEY)
                            .bind(namespace)
                            .bind(activity_type)
                            .fetch_all(pool)
                            .await?)
                    },
                )
                .await
            }

            pub(super) async fn concurrency_key(
                pool: &$pool,
                namespace: &str,
                activity_type: &str,
                key: &str,
            ) -> Result<Option<(u64, u64)>, Error> {
                let row = sqlx::query(sql::CONCURRENCY_KEY)
                    .bind(namespace)
                    .bind(activity_type)
                    .bind(key)
                    .fetch_optional(pool)
                    .await?;
                row.map(|r| rows::key_counts(&rows::Sqlx(&r))).transpose()
            }
        }
    };
}
