//! The load the bench puts on the nodes: its channels to them, the activities
//! it submits, and the SDK workers that run them, counting what they handled and
//! what the server acknowledged.

use std::{
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use spool_proto::v1::{
    self, activity_service_client::ActivityServiceClient, admin_service_client::AdminServiceClient,
};
use spool_worker::{Payload, Worker};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tonic::{Request, transport::Channel};

use super::{
    BACKLOG, Bench, Error, MEASURED, NAMESPACE, Options, progress::Progress, report::round,
};

/// How long acks may stand still before a wait for them asks `Stats` instead:
/// acks are the clock, and `Stats` counts the whole backlog (a quarter of a
/// second of PostgreSQL's CPU with a million rows waiting), so it is asked only
/// when acks stop coming.
const ACKS_STALLED: Duration = Duration::from_millis(250);

impl Bench {
    pub(super) async fn connect(
        endpoints: Vec<String>,
        options: Options,
        processes: Vec<(String, u32)>,
    ) -> Result<Self, Error> {
        let mut channels = Vec::with_capacity(endpoints.len());
        for endpoint in &endpoints {
            channels.push(Self::channel(endpoint, &options).await?);
        }
        Ok(Self {
            handled_by_node: endpoints.iter().map(|_| AtomicUsize::new(0)).collect(),
            endpoints,
            channels,
            options,
            epoch: Instant::now(),
            run_id: uuid::Uuid::now_v7().simple().to_string()[..12].to_owned(),
            handled: Arc::new(AtomicUsize::new(0)),
            acked: Arc::default(),
            processes: processes.into(),
            watched: None,
        })
    }

    async fn channel(endpoint: &str, options: &Options) -> Result<Channel, Error> {
        let mut last = String::new();
        for _ in 0..100 {
            match spool_proto::endpoint::endpoint(endpoint, &options.tls)
                .map_err(|e| Error::Setup(e.to_string()))?
                .connect()
                .await
            {
                Ok(channel) => return Ok(channel),
                Err(e) => last = e.to_string(),
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Err(Error::Connect(endpoint.to_owned(), last))
    }

    fn client(&self) -> ActivityServiceClient<Channel> {
        self.client_at(0)
    }

    /// A client of the `i`-th node, counting round the nodes.
    pub(super) fn client_at(&self, i: usize) -> ActivityServiceClient<Channel> {
        ActivityServiceClient::new(self.channels[i % self.channels.len()].clone())
            .max_decoding_message_size(usize::MAX)
    }

    pub(super) fn request<T>(&self, message: T) -> Request<T> {
        let mut request = Request::new(message);
        if let Some(token) = &self.options.token
            && let Ok(value) = format!("Bearer {token}").parse()
        {
            request.metadata_mut().insert("authorization", value);
        }
        request
    }

    /// An input carrying the submit instant, padded to `--payload-bytes`.
    fn input(&self, timed: bool) -> Payload {
        let nanos = if timed {
            u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX - 1)
        } else {
            u64::MAX
        };
        let mut data = nanos.to_le_bytes().to_vec();
        data.resize(self.options.payload_bytes.max(8), b'x');
        Payload {
            content_type: "application/octet-stream".to_owned(),
            data,
        }
    }

    pub(super) fn submit_request(
        &self,
        activity_type: &str,
        tag: &str,
        i: usize,
    ) -> v1::SubmitRequest {
        let mut request = v1::SubmitRequest {
            namespace: NAMESPACE.to_owned(),
            workflow_id: format!("{}-{activity_type}-{tag}", self.run_id),
            activity_id: i.to_string(),
            activity_type: activity_type.to_owned(),
            input: Some(self.input(tag != BACKLOG)),
            ..Default::default()
        };
        let key = match (tag, self.options.backlog, self.options.keys) {
            (BACKLOG, _, _) => "tenant-a".to_owned(),
            ("latency", 1.., _) => "tenant-b".to_owned(),
            (_, _, 0) => String::new(),
            (_, _, keys) => format!("key-{}", i % keys),
        };
        if self.options.fairness_keys {
            request.fairness_key = key;
        } else {
            request.concurrency_key = key;
        }
        request
    }

    /// Sets the limits the options ask for on every measured type.
    pub(super) async fn set_limits(&self) -> Result<(), Error> {
        let mut admin = AdminServiceClient::new(self.channels[0].clone());
        for activity_type in MEASURED {
            if let Some(max_running) = self.options.key_limit {
                let limit = v1::ConcurrencyLimit {
                    namespace: NAMESPACE.to_owned(),
                    activity_type: activity_type.to_owned(),
                    max_running,
                    ..Default::default()
                };
                admin
                    .set_concurrency_limit(self.request(v1::SetConcurrencyLimitRequest {
                        concurrency_limit: Some(limit),
                    }))
                    .await?;
            }
            if let Some(per_second) = self.options.rate_limit {
                let limit = v1::RateLimit {
                    namespace: NAMESPACE.to_owned(),
                    activity_type: activity_type.to_owned(),
                    limit: per_second,
                    period: Some(spool_proto::duration::to_proto(Duration::from_secs(1))),
                    burst: per_second,
                    ..Default::default()
                };
                admin
                    .set_rate_limit(self.request(v1::SetRateLimitRequest {
                        rate_limit: Some(limit),
                    }))
                    .await?;
            }
        }
        Ok(())
    }

    pub(super) async fn completed(&self) -> Result<u64, Error> {
        let stats = self
            .client()
            .stats(self.request(v1::StatsRequest {
                namespace: NAMESPACE.to_owned(),
            }))
            .await?
            .into_inner();
        Ok(stats.completed)
    }

    /// Submits `count` activities with `--submit-concurrency` callers, each sending
    /// batches of `--batch`.
    pub(super) async fn submit_batched(
        &self,
        activity_type: &str,
        count: usize,
        tag: &str,
    ) -> Result<(), Error> {
        let next = Arc::new(AtomicUsize::new(0));
        let progress = (!tag.is_empty()).then(|| Progress::start(tag, count, next.clone()));
        let mut callers = JoinSet::new();
        let batch = self.options.batch.max(1);
        for caller in 0..self.options.submit_concurrency.max(1) {
            let next = next.clone();
            let mut client = self.client_at(caller);
            let this = self.shallow();
            let activity_type = activity_type.to_owned();
            let tag = tag.to_owned();
            callers.spawn(async move {
                loop {
                    let start = next.fetch_add(batch, Ordering::Relaxed);
                    if start >= count {
                        return Ok::<_, Error>(());
                    }
                    let end = (start + batch).min(count);
                    let activities = (start..end)
                        .map(|i| this.submit_request(&activity_type, &tag, i))
                        .collect();
                    client
                        .submit_batch(this.request(v1::SubmitBatchRequest { activities }))
                        .await?;
                }
            });
        }
        let result = join_all(callers).await;
        if let Some(progress) = progress {
            progress.finish();
        }
        result
    }

    /// A copy sharing the channel, for tasks.
    pub(super) fn shallow(&self) -> Arc<Self> {
        Arc::new(Self {
            endpoints: self.endpoints.clone(),
            channels: self.channels.clone(),
            options: self.options.clone(),
            epoch: self.epoch,
            run_id: self.run_id.clone(),
            handled: self.handled.clone(),
            handled_by_node: self.handled_by_node.clone(),
            acked: self.acked.clone(),
            processes: self.processes.clone(),
            watched: self.watched.clone(),
        })
    }

    /// Starts `--workers` SDK workers for `activity_type` sharing `--concurrency`;
    /// each handler call runs `on_start` with the pickup latency.
    pub(super) fn start_workers(
        &self,
        activity_type: &str,
        on_start: Arc<dyn Fn(Duration) + Send + Sync>,
    ) -> CancellationToken {
        let stop = CancellationToken::new();
        let workers = self.options.workers.max(1);
        let per_worker = self.options.concurrency.div_ceil(workers).max(1);
        for n in 0..workers {
            let epoch = self.epoch;
            let on_start = on_start.clone();
            let handled = self.handled.clone();
            let node = n as usize % self.endpoints.len();
            let by_node = self.handled_by_node.clone();
            let acked = self.acked.clone();
            let mut worker = Worker::new(self.endpoints[node].clone())
                .namespace(NAMESPACE)
                .identity(format!("bench-{n}"))
                .max_concurrency(per_worker)
                .batches(self.options.batches)
                .tls(self.options.tls.clone())
                .on_ack(move |ack| {
                    if ack.accepted {
                        acked.record(epoch);
                    }
                })
                .activity(activity_type, move |_ctx, input: Payload| {
                    let on_start = on_start.clone();
                    let handled = handled.clone();
                    let by_node = by_node.clone();
                    async move {
                        let sent = input
                            .data
                            .get(..8)
                            .and_then(|b| b.try_into().ok())
                            .map(u64::from_le_bytes)
                            .unwrap_or(0);
                        let now = u64::try_from(epoch.elapsed().as_nanos()).unwrap_or(u64::MAX);
                        // A backlog row's pickup is not the phase's.
                        if sent != u64::MAX {
                            on_start(Duration::from_nanos(now.saturating_sub(sent)));
                        }
                        handled.fetch_add(1, Ordering::Relaxed);
                        by_node[node].fetch_add(1, Ordering::Relaxed);
                        Ok(Payload::default())
                    }
                });
            if let Some(token) = &self.options.token {
                worker = worker.token(token.clone());
            }
            tokio::spawn(worker.run(stop.clone()));
        }
        stop
    }

    /// Waits until `count` more results than `acked_before` are recorded, and
    /// returns when the last of them was: the instant its ack reached the worker,
    /// which the server sends only once the result is committed. Polling `Stats`
    /// instead would add the time of a count to the phase, and a count reads the
    /// whole backlog (~0.1 s with 1,000,000 rows waiting). `Stats` confirms the
    /// namespace's completed count reached `target` after the clock stops, and
    /// stands in for the acks if some never come (a worker's session replaced
    /// mid-phase: its results are acked where it resumes, or recorded by a node
    /// that could not answer).
    pub(super) async fn await_completed(
        &self,
        target: u64,
        acked_before: usize,
        tag: &str,
        count: usize,
    ) -> Result<Instant, Error> {
        let done = Arc::new(AtomicUsize::new(0));
        let progress = Progress::start(tag, count, done.clone());
        let mut moved = (0, Instant::now());
        let last = loop {
            let acked = self.acked.count().saturating_sub(acked_before);
            done.store(acked, Ordering::Relaxed);
            if acked >= count {
                break self.acked.last(self.epoch);
            }
            if acked != moved.0 {
                moved = (acked, Instant::now());
            } else if moved.1.elapsed() >= ACKS_STALLED {
                if self.completed().await? >= target {
                    break Instant::now();
                }
                moved.1 = Instant::now();
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        };
        while self.completed().await? < target {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        progress.finish();
        Ok(last)
    }

    pub(super) fn handled_by_node(&self) -> Vec<usize> {
        self.handled_by_node
            .iter()
            .map(|n| n.load(Ordering::Relaxed))
            .collect()
    }

    /// Activities handled per second by the workers of each node since `before`.
    pub(super) fn per_node_since(&self, before: &[usize], took: Duration) -> serde_json::Value {
        self.handled_by_node()
            .iter()
            .zip(before)
            .map(|(now, before)| {
                round(now.saturating_sub(*before) as f64 / took.as_secs_f64().max(1e-9))
            })
            .collect()
    }
}

pub(super) async fn join_all(mut set: JoinSet<Result<(), Error>>) -> Result<(), Error> {
    while let Some(joined) = set.join_next().await {
        joined.map_err(|e| Error::Setup(e.to_string()))??;
    }
    Ok(())
}
