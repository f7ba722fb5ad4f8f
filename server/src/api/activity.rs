//! `ActivityService`: submit, wait, inspect and manage activities.

use std::sync::Arc;

use spool_proto::v1::{self, activity_service_server::ActivityService};
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

use prost::Message;

use super::{
    Error,
    auth::{Principal, Role, authorize, authorize_principal},
    unexpected, validate, within,
};
use crate::dispatch::{Core, pending::Full};
use crate::store::{ActivityStatus, ListPage, ListQuery, NewActivity, Op, Outcome};

/// How often a `Wait` re-reads its activity when other nodes share the store.
const REMOTE_RECHECK: std::time::Duration = std::time::Duration::from_secs(2);

pub struct ActivityApi {
    core: Arc<Core>,
    /// Cancelled when the server shuts down: parked `Wait`s answer at once.
    shutdown: CancellationToken,
}

impl ActivityApi {
    pub fn new(core: Arc<Core>, shutdown: CancellationToken) -> Self {
        Self { core, shutdown }
    }

    async fn submit_all(&self, batch: Vec<NewActivity>) -> Result<Vec<v1::SubmitResponse>, Error> {
        let requested: Vec<_> = batch
            .iter()
            .map(|n| (n.key.clone(), n.activity_type.clone()))
            .collect();
        // Each key the batch adds to gets its type's concurrency strategy applied
        // in the same transaction (a key over its limit may lose its newest or its
        // oldest activities).
        let mut keys = std::collections::BTreeMap::<_, std::collections::BTreeSet<_>>::new();
        for n in &batch {
            if let Some(key) = &n.concurrency_key {
                keys.entry((n.key.namespace.clone(), n.activity_type.clone()))
                    .or_default()
                    .insert(key.clone());
            }
        }
        let mut ops = vec![Op::Submit(batch)];
        ops.extend(keys.into_iter().map(|((namespace, activity_type), keys)| {
            Op::EnforceConcurrency {
                namespace,
                activity_type,
                keys: keys.into_iter().collect(),
            }
        }));
        let mut outcomes = self.core.committer.commit(ops).await?.into_iter();
        let submitted = outcomes.next();
        let cancelled: std::collections::HashMap<_, _> = outcomes
            .flat_map(|outcome| match outcome {
                Outcome::Enforced(cancelled) => cancelled,
                _ => Vec::new(),
            })
            .map(|(_, row)| (row.key.clone(), row))
            .collect();
        match submitted {
            Some(Outcome::Submitted(submitted)) => Ok(submitted
                .into_iter()
                .map(|s| {
                    // One its own submit cancelled is answered as it now is.
                    let row = match cancelled.get(&s.row.key) {
                        Some(now) => now.clone(),
                        None => s.row,
                    };
                    v1::SubmitResponse {
                        activity: Some(crate::wire::activity(row)),
                        created: s.created,
                    }
                })
                .collect()),
            Some(Outcome::Conflict {
                index,
                existing_type,
            }) => {
                let (key, requested) = requested.into_iter().nth(index).unzip();
                Err(Error::AlreadyExists {
                    key: key.ok_or_else(|| unexpected("conflict index out of range"))?,
                    existing: existing_type,
                    requested: requested.unwrap_or_default(),
                })
            }
            other => Err(unexpected(&format!("submit answered {other:?}"))),
        }
    }

    /// Why `row`, due and SCHEDULED, is not running, if a limit holds it back.
    async fn waiting_reason(&self, row: &crate::store::ActivityRow) -> Result<String, Error> {
        let store = &self.core.store;
        let now = store.now();
        if row.status != ActivityStatus::Scheduled || row.next_at > now {
            return Ok(String::new());
        }
        let (namespace, activity_type) = (&row.key.namespace, &row.activity_type);
        if let Some(key) = &row.concurrency_key {
            let limits = store.concurrency_limits(Some(namespace)).await?;
            let of_type = |k: Option<&String>| {
                limits
                    .iter()
                    .find(|l| &l.activity_type == activity_type && l.key.as_ref() == k)
                    .map(|l| l.max_running)
                    .filter(|&max| max > 0)
            };
            let limit = match of_type(Some(key)) {
                Some(max) => Some((max, format!("key {key:?} may run {max}"))),
                None => {
                    of_type(None).map(|max| (max, format!("{activity_type} allows {max} per key")))
                }
            };
            if let Some((max, allows)) = limit
                && let Some((_, running)) =
                    store.concurrency_key(namespace, activity_type, key).await?
                && running >= u64::from(max)
            {
                return Ok(format!(
                    "concurrency limited: {running} of key {key:?} run, and {allows}"
                ));
            }
        }
        // The key's own bucket first, then the type's.
        let mut empty: Vec<_> = store
            .rate_limits(Some(namespace), now)
            .await?
            .into_iter()
            .filter(|l| {
                &l.limit.activity_type == activity_type
                    && l.available == 0
                    && (l.limit.key.is_none() || l.limit.key == row.concurrency_key)
            })
            .collect();
        empty.sort_by_key(|l| l.limit.key.is_none());
        if let Some(limit) = empty.first() {
            let whose = match &limit.limit.key {
                Some(key) => format!("key {key:?} of {activity_type}"),
                None => activity_type.to_string(),
            };
            return Ok(format!(
                "rate limited: {whose} takes {} per {}, and none is left now",
                limit.limit.per_period,
                spool_proto::duration::format(limit.limit.period)
            ));
        }
        Ok(String::new())
    }

    /// Commits `op`, a change of `key`'s row: the row changed, NOT_FOUND, or
    /// FAILED_PRECONDITION saying `allowed` when its status does not allow it.
    async fn change_one(
        &self,
        key: crate::store::Key,
        op: Op,
        allowed: &'static str,
    ) -> Result<v1::Activity, Error> {
        let mut outcomes = self.core.committer.commit(vec![op]).await?;
        match outcomes.pop() {
            Some(Outcome::Cancelled { row, .. } | Outcome::Redriven { row }) => {
                Ok(crate::wire::activity(row))
            }
            Some(Outcome::NotFound) => Err(Error::NotFound(key)),
            Some(Outcome::WrongStatus(status)) => Err(Error::WrongStatus {
                key,
                status,
                action: allowed,
            }),
            other => Err(unexpected(&format!("a change answered {other:?}"))),
        }
    }

    async fn get_row(&self, key: &crate::store::Key) -> Result<crate::store::ActivityRow, Error> {
        self.core
            .store
            .get(key)
            .await?
            .ok_or_else(|| Error::NotFound(key.clone()))
    }
}

/// Each request entry's answer from the answers of its distinct keys. A key
/// the batch did not create (stored before, or repeated within it) comes back
/// without payloads or headers: a batch naming one large activity many times
/// must not make an answer, or the memory behind it, many times its size.
fn batch_answers(
    stored: Vec<v1::SubmitResponse>,
    answers: &[validate::Answer],
) -> Result<Vec<v1::SubmitResponse>, Error> {
    let mut stored: Vec<Option<v1::SubmitResponse>> = stored.into_iter().map(Some).collect();
    let mut light: Vec<Option<v1::Activity>> = vec![None; stored.len()];
    let mut results = Vec::with_capacity(answers.len());
    for &answer in answers {
        results.push(match answer {
            validate::Answer::First(n) => {
                let mut result = stored
                    .get_mut(n)
                    .and_then(Option::take)
                    .ok_or_else(|| unexpected("a batch answer taken twice"))?;
                let stripped = result.activity.as_ref().map(without_payloads);
                if !result.created {
                    result.activity = stripped.clone();
                }
                light[n] = stripped;
                result
            }
            validate::Answer::Repeat(n) => v1::SubmitResponse {
                activity: Some(
                    light
                        .get(n)
                        .cloned()
                        .flatten()
                        .ok_or_else(|| unexpected("a repeat answered before its key"))?,
                ),
                created: false,
            },
        });
    }
    Ok(results)
}

/// `activity` without what may be large: payloads, error details, headers.
fn without_payloads(activity: &v1::Activity) -> v1::Activity {
    v1::Activity {
        input: None,
        output: None,
        heartbeat_details: None,
        headers: Default::default(),
        history: Vec::new(),
        last_error: activity.last_error.as_ref().map(|e| v1::ActivityError {
            details: None,
            r#type: e.r#type.clone(),
            message: e.message.clone(),
            ..*e
        }),
        worker_id: activity.worker_id.clone(),
        key: activity.key.clone(),
        activity_type: activity.activity_type.clone(),
        concurrency_key: activity.concurrency_key.clone(),
        fairness_key: activity.fairness_key.clone(),
        waiting_reason: activity.waiting_reason.clone(),
        ..*activity
    }
}

#[tonic::async_trait]
impl ActivityService for ActivityApi {
    async fn submit(
        &self,
        request: Request<v1::SubmitRequest>,
    ) -> Result<Response<v1::SubmitResponse>, Status> {
        within(self.core.config.limits.request_timeout, async {
            let principal = request.extensions().get::<Principal>().cloned();
            let new = validate::submit(
                request.into_inner(),
                &self.core.config,
                self.core.store.now(),
            )?;
            authorize_principal(principal.as_ref(), Role::Client, &new.key.namespace)?;
            let mut results = self.submit_all(vec![new]).await?;
            let result = results
                .pop()
                .ok_or_else(|| unexpected("empty submit result"))?;
            Ok(Response::new(result))
        })
        .await
    }

    async fn submit_batch(
        &self,
        request: Request<v1::SubmitBatchRequest>,
    ) -> Result<Response<v1::SubmitBatchResponse>, Status> {
        within(self.core.config.limits.request_timeout, async {
            let principal = request.extensions().get::<Principal>().cloned();
            let activities = request.into_inner().activities;
            if activities.len() > validate::MAX_BATCH {
                return Err(Error::InvalidArgument(format!(
                    "a batch holds {} activities; the limit is {}",
                    activities.len(),
                    validate::MAX_BATCH
                ))
                .into());
            }
            let now = self.core.store.now();
            let batch = activities
                .into_iter()
                .enumerate()
                .map(|(i, a)| {
                    validate::submit(a, &self.core.config, now).map_err(|e| match e {
                        Error::InvalidArgument(m) => {
                            Error::InvalidArgument(format!("activities[{i}]: {m}"))
                        }
                        Error::PayloadTooLarge { field, size, limit } => Error::PayloadTooLarge {
                            field: format!("activities[{i}].{field}"),
                            size,
                            limit,
                        },
                        other => other,
                    })
                })
                .collect::<Result<Vec<_>, _>>()?;
            for new in &batch {
                authorize_principal(principal.as_ref(), Role::Client, &new.key.namespace)?;
            }
            if batch.is_empty() {
                return Ok(Response::new(v1::SubmitBatchResponse::default()));
            }
            let validate::DistinctBatch {
                activities,
                answers,
            } = validate::distinct(batch)?;
            let stored = self.submit_all(activities).await?;
            Ok(Response::new(v1::SubmitBatchResponse {
                results: batch_answers(stored, &answers)?,
            }))
        })
        .await
    }

    async fn get(
        &self,
        request: Request<v1::GetRequest>,
    ) -> Result<Response<v1::Activity>, Status> {
        within(self.core.config.limits.request_timeout, async {
            let key = authorized_key(&request, request.get_ref().key.as_ref(), Role::Viewer)?;
            let row = self.get_row(&key).await?;
            let history = if request.get_ref().include_history {
                self.core.store.history(row.id).await.map_err(Error::from)?
            } else {
                Vec::new()
            };
            let waiting_reason = self.waiting_reason(&row).await?;
            let mut activity = crate::wire::activity(row);
            activity.waiting_reason = waiting_reason;
            activity.history = history
                .into_iter()
                .map(crate::wire::attempt_record)
                .collect();
            Ok(Response::new(activity))
        })
        .await
    }

    async fn wait(
        &self,
        request: Request<v1::WaitRequest>,
    ) -> Result<Response<v1::Activity>, Status> {
        let key = authorized_key(&request, request.get_ref().key.as_ref(), Role::Viewer)?;
        let caller: Arc<str> = request
            .extensions()
            .get::<Principal>()
            .map_or_else(|| "anonymous".into(), |p| p.caller().clone());
        let request = request.into_inner();
        // No timeout, or one past --max-wait, parks for --max-wait: then the caller
        // gets the current state and may wait again.
        let max_wait = self.core.config.limits.max_wait;
        let timeout = validate::duration("timeout", request.timeout.as_ref())?
            .filter(|d| !d.is_zero())
            .map_or(max_wait, |t| t.min(max_wait));
        let deadline = tokio::time::Instant::now() + timeout;
        let waiter = self.core.pending.watch(key.clone());
        // Taken once the call is about to park: a Wait on a finished activity is
        // answered whatever the caps.
        let mut place = None;
        loop {
            // Armed before the read: a change committed after it still wakes us.
            let changed = waiter.changed();
            let row = self.get_row(&key).await?;
            if row.is_terminal() {
                return Ok(Response::new(crate::wire::activity(row)));
            }
            if place.is_none() {
                place = Some(self.core.pending.park(&caller).map_err(|full| {
                    Error::Exhausted(match full {
                        Full::Caller(n) => format!(
                            "this token has {n} Wait calls parked already (--max-waits-per-token): wait on fewer at once, or poll with Get"
                        ),
                        Full::Total(n) => format!(
                            "this node has {n} Wait calls parked (--max-waits): retry later, or poll with Get"
                        ),
                    })
                })?);
            }
            // With other nodes, a missed notification must not strand a waiter:
            // read again now and then.
            let recheck = async {
                if self.core.store.single_node() {
                    std::future::pending::<()>().await
                } else {
                    tokio::time::sleep(REMOTE_RECHECK).await
                }
            };
            tokio::select! {
                _ = changed => {}
                _ = recheck => {}
                _ = tokio::time::sleep_until(deadline) => return Ok(Response::new(crate::wire::activity(self.get_row(&key).await?))),
                _ = self.shutdown.cancelled() => return Ok(Response::new(crate::wire::activity(row))),
            }
        }
    }

    async fn cancel(
        &self,
        request: Request<v1::CancelRequest>,
    ) -> Result<Response<v1::Activity>, Status> {
        within(self.core.config.limits.request_timeout, async {
            let key = authorized_key(&request, request.get_ref().key.as_ref(), Role::Client)?;
            let reason = request.into_inner().reason;
            validate::text("reason", &reason, validate::MAX_MESSAGE_BYTES)?;
            let op = Op::Cancel {
                key: key.clone(),
                reason,
            };
            let cancelled = self
                .change_one(
                    key,
                    op,
                    "only SCHEDULED or RUNNING activities can be cancelled",
                )
                .await?;
            Ok(Response::new(cancelled))
        })
        .await
    }

    async fn retry(
        &self,
        request: Request<v1::RetryRequest>,
    ) -> Result<Response<v1::Activity>, Status> {
        within(self.core.config.limits.request_timeout, async {
            let key = authorized_key(&request, request.get_ref().key.as_ref(), Role::Client)?;
            let op = Op::Redrive { key: key.clone() };
            let redriven = self
                .change_one(
                    key,
                    op,
                    "only FAILED or CANCELLED activities can be retried",
                )
                .await?;
            Ok(Response::new(redriven))
        })
        .await
    }

    async fn list(
        &self,
        request: Request<v1::ListRequest>,
    ) -> Result<Response<v1::ListResponse>, Status> {
        within(self.core.config.limits.request_timeout, async {
            let namespace = authorized_namespace(&request, &request.get_ref().namespace, Role::Viewer)?;
            let request = request.into_inner();
            let status = match ActivityStatus::try_from(request.status) {
                Ok(ActivityStatus::Unspecified) => None,
                Ok(status) => Some(status),
                Err(_) => {
                    return Err(Error::InvalidArgument(format!(
                        "status {} is not a known ActivityStatus",
                        request.status
                    ))
                    .into());
                }
            };
            let activity_type = if request.activity_type.is_empty() {
                None
            } else {
                validate::name("activity_type", &request.activity_type)?;
                Some(request.activity_type)
            };
            let after_id = if request.page_token.is_empty() {
                0
            } else {
                request
                    .page_token
                    .parse::<i64>()
                    .ok()
                    .filter(|id| *id > 0)
                    .ok_or_else(|| {
                        Error::InvalidArgument(
                            "page_token is not one this server issued: pass next_page_token from the previous page"
                                .to_owned(),
                        )
                    })?
            };
            let page_size = match request.page_size {
                0 => validate::DEFAULT_PAGE,
                n => n.min(validate::MAX_PAGE),
            };
            let page = self
                .core
                .store
                .list(&ListQuery {
                    namespace,
                    status,
                    activity_type,
                    after_id,
                    newest_first: request.newest_first,
                    limit: page_size,
                    max_bytes: validate::MAX_PAGE_BYTES,
                })
                .await
                .map_err(Error::from)?;
            Ok(Response::new(page_within(page, validate::MAX_PAGE_BYTES)))
        })
        .await
    }

    async fn stats(
        &self,
        request: Request<v1::StatsRequest>,
    ) -> Result<Response<v1::StatsResponse>, Status> {
        within(self.core.config.limits.request_timeout, async {
            let namespace =
                authorized_namespace(&request, &request.get_ref().namespace, Role::Viewer)?;
            let counts = self
                .core
                .store
                .stats(&namespace)
                .await
                .map_err(Error::from)?;
            Ok(Response::new(v1::StatsResponse {
                scheduled: counts.scheduled,
                running: counts.running,
                completed: counts.completed,
                failed: counts.failed,
                cancelled: counts.cancelled,
                connected_workers: u32::try_from(self.core.registry.connected(&namespace))
                    .unwrap_or(u32::MAX),
                draining: self.core.registry.is_draining(),
                claimed_ahead: u64::try_from(self.core.registry.claimed_ahead(Some(&namespace)))
                    .unwrap_or(u64::MAX),
            }))
        })
        .await
    }

    async fn get_server_info(
        &self,
        request: Request<v1::GetServerInfoRequest>,
    ) -> Result<Response<v1::ServerInfo>, Status> {
        super::auth::authenticated(&request)?;
        Ok(Response::new(server_info(&self.core.config)))
    }
}

/// The key a request names, once its caller may act on it as `role`.
fn authorized_key<T>(
    request: &Request<T>,
    key: Option<&v1::ActivityKey>,
    role: Role,
) -> Result<crate::store::Key, Error> {
    let key = validate::key(key)?;
    authorize(request, role, &key.namespace)?;
    Ok(key)
}

/// The namespace a request names, once its caller may act in it as `role`.
fn authorized_namespace<T>(
    request: &Request<T>,
    namespace: &str,
    role: Role,
) -> Result<String, Error> {
    let namespace = validate::namespace(namespace)?;
    authorize(request, role, &namespace)?;
    Ok(namespace)
}

/// What `GetServerInfo` answers: this build and this server's settings.
fn server_info(config: &crate::Config) -> v1::ServerInfo {
    v1::ServerInfo {
        version: env!("CARGO_PKG_VERSION").to_owned(),
        protocol_versions: spool_proto::PROTOCOL_VERSIONS.to_vec(),
        max_payload_bytes: config.max_payload_bytes as u64,
        max_worker_concurrency: config.limits.max_worker_concurrency,
        heartbeat_interval: Some(spool_proto::duration::to_proto(config.heartbeat_interval)),
        max_batch_size: u32::try_from(crate::limits::MAX_BATCH).unwrap_or(u32::MAX),
        max_wait: Some(spool_proto::duration::to_proto(config.limits.max_wait)),
    }
}

/// The answer to a `List` page: the store cut the page by stored bytes; this cuts
/// it again by encoded bytes (a row may have grown between the store's two reads),
/// keeping at least one row, and points the next page after the last row kept.
fn page_within(page: ListPage, max_bytes: usize) -> v1::ListResponse {
    let mut activities = Vec::with_capacity(page.rows.len());
    let mut total = 0usize;
    let mut next_after = page.next_after;
    let mut last_kept = None;
    for row in page.rows {
        let id = row.id;
        let activity = crate::wire::activity(row);
        let size = activity.encoded_len();
        if !activities.is_empty() && total.saturating_add(size) > max_bytes {
            // The rest comes on the next page, after the last row kept.
            next_after = last_kept;
            break;
        }
        total = total.saturating_add(size);
        activities.push(activity);
        last_kept = Some(id);
    }
    v1::ListResponse {
        activities,
        next_page_token: next_after.map(|id| id.to_string()).unwrap_or_default(),
    }
}
