//! The reads both dialects make the same way, written once: each dialect's
//! module invokes [`shared_reads!`] for its store, and the statements come from
//! its own `sql` module. Rows decode through `rows`, as every read does.

/// Implements [`Reads`](crate::store::Reads) for the invoking dialect's store:
/// callers' reads run on the pool named `callers`, the server's own (the
/// committer's due times, the sweeps) on the one named `own`, so that callers
/// holding every connection never hold up dispatch.
macro_rules! shared_reads {
    ($store:ty, row: $row:ty, callers: $callers:ident, own: $own:ident) => {
        impl $store {
            /// Every row `statement` answers for `namespace` (every namespace
            /// when `None`), decoded: the limits and weights set, listed.
            async fn in_namespace<T>(
                &self,
                statement: &'static str,
                namespace: Option<&str>,
                decode: impl Fn(&rows::Sqlx<'_, $row>) -> Result<T, Error> + Send,
            ) -> Result<Vec<T>, Error> {
                let rows = sqlx::query(statement)
                    .bind(namespace)
                    .fetch_all(&self.$callers)
                    .await?;
                rows.iter().map(|r| decode(&rows::Sqlx(r))).collect()
            }
        }

        #[async_trait::async_trait]
        impl crate::store::Reads for $store {
            async fn get(&self, key: &Key) -> Result<Option<ActivityRow>, Error> {
                let row = sqlx::query(sql::SELECT_BY_KEY)
                    .bind(&key.namespace)
                    .bind(&key.workflow_id)
                    .bind(&key.activity_id)
                    .fetch_optional(&self.$callers)
                    .await?;
                row.as_ref()
                    .map(|r| rows::decode(&rows::Sqlx(r)))
                    .transpose()
            }

            async fn list(&self, query: &ListQuery) -> Result<ListPage, Error> {
                // Sizes first, so the page is cut by bytes before any payload is read.
                let status = query.status.map(|s| s as i64);
                let (paths, rows_sql) = if query.newest_first {
                    (&sql::LIST_SIZES_NEWEST, sql::LIST_NEWEST)
                } else {
                    (&sql::LIST_SIZES, sql::LIST)
                };
                let sizes: Vec<(i64, i64)> = sqlx::query(paths.of(query.status))
                    .persistent(sql::LIST_SIZES_KEPT)
                    .bind(&query.namespace)
                    .bind(query.cursor())
                    .bind(status)
                    .bind(query.activity_type.as_deref())
                    .bind(i64::from(query.limit) + 1)
                    .fetch_all(&self.$callers)
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
                    .bind(sql::page_ids(ids))
                    .bind(status)
                    .fetch_all(&self.$callers)
                    .await?;
                Ok(ListPage {
                    rows: rows::decode_all(&rows, "list"),
                    next_after: more.then_some(last),
                })
            }

            async fn stats(&self, namespace: &str) -> Result<StatusCounts, Error> {
                let rows = sqlx::query(sql::STATS)
                    .bind(namespace)
                    .fetch_all(&self.$callers)
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
                    .fetch_all(&self.$callers)
                    .await?;
                Ok(rows::decode_attempts(rows.iter().map(rows::Sqlx)))
            }

            async fn type_counts(&self, now: UnixMillis) -> Result<Vec<TypeCounts>, Error> {
                let rows = sqlx::query(sql::TYPE_COUNTS)
                    .bind(now)
                    .fetch_all(&self.$callers)
                    .await?;
                rows::type_counts(rows.iter().map(rows::Sqlx))
            }

            async fn running(&self, after_id: i64, limit: u32) -> Result<RunningPage, Error> {
                let rows = sqlx::query(sql::RUNNING)
                    .bind(after_id)
                    .bind(i64::from(limit))
                    .fetch_all(&self.$own)
                    .await?;
                Ok(RunningPage {
                    next_after: (rows.len() == limit as usize)
                        .then(|| rows.last().and_then(|r| r.try_get::<i64, _>("id").ok()))
                        .flatten(),
                    rows: rows::decode_all(&rows, "running"),
                })
            }

            async fn expired_leases(
                &self,
                now: UnixMillis,
                limit: u32,
            ) -> Result<Vec<ActivityRow>, Error> {
                let rows = sqlx::query(sql::EXPIRED_LEASES)
                    .bind(now)
                    .bind(i64::from(limit))
                    .fetch_all(&self.$own)
                    .await?;
                Ok(rows::decode_all(&rows, "expired_leases"))
            }

            async fn due_times(&self, after: UnixMillis, limit: u32) -> Result<DueTimes, Error> {
                let rows = sqlx::query(sql::DUE_TIMES)
                    .bind(after)
                    .bind(i64::from(limit))
                    .fetch_all(&self.$own)
                    .await?;
                let rows = rows
                    .iter()
                    .map(|r| Ok((rows::int(r, "next_at")?, r.try_get(1)?, r.try_get(2)?)))
                    .collect::<Result<Vec<_>, Error>>()?;
                Ok(rows::due_times(rows, limit))
            }

            async fn rate_limits(
                &self,
                namespace: Option<&str>,
                now: UnixMillis,
            ) -> Result<Vec<rate::RateLimitUse>, Error> {
                self.in_namespace(sql::RATE_LIMITS, namespace, |r| {
                    rows::rate_limit_use(r, now)
                })
                .await
            }

            async fn concurrency_limits(
                &self,
                namespace: Option<&str>,
            ) -> Result<Vec<crate::store::concurrency::ConcurrencyLimit>, Error> {
                self.in_namespace(sql::CONCURRENCY_LIMITS, namespace, |r| {
                    rows::concurrency_limit(r)
                })
                .await
            }

            async fn fairness_weights(
                &self,
                namespace: Option<&str>,
            ) -> Result<Vec<crate::store::fairness::FairnessWeightUse>, Error> {
                let weights = self
                    .in_namespace(sql::FAIRNESS_WEIGHTS, namespace, |r| {
                        rows::fairness_weight(r)
                    })
                    .await?;
                crate::store::fairness::with_waiting(
                    weights,
                    |namespace, activity_type| async move {
                        Ok(sqlx::query_as(sql::WAITING_BY_FAIRNESS_KEY)
                            .bind(namespace)
                            .bind(activity_type)
                            .fetch_all(&self.$callers)
                            .await?)
                    },
                )
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
                    .fetch_optional(&self.$callers)
                    .await?;
                row.map(|r| rows::key_counts(&rows::Sqlx(&r))).transpose()
            }
        }
    };
}
