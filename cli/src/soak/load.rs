//! The load: submitters sending activities at a steady rate, some with keys
//! under a limit and a weight, kept going with the fault injector for the
//! run's duration.

use std::{net::SocketAddr, sync::Arc, time::Duration};

use rand::{Rng, SeedableRng, rngs::StdRng};
use spool_proto::v1::{
    self, activity_service_client::ActivityServiceClient, admin_service_client::AdminServiceClient,
};
use spool_testkit::proxy::Proxy;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;

use super::{
    ACTIVITY_TYPE, Error, NAMESPACE, Options, WORKFLOW,
    cluster::Cluster,
    faults::{Fault, inject},
    history::{DriverEvent, Events, now_ms},
    setup, worker,
};

/// A channel to each node, straight (not through the workers' proxy).
pub(super) fn channels(addrs: &[SocketAddr]) -> Result<Vec<Channel>, Error> {
    addrs
        .iter()
        .map(|a| {
            tonic::transport::Endpoint::from_shared(format!("http://{a}"))
                .map(|e| {
                    e.connect_timeout(Duration::from_secs(1))
                        .timeout(Duration::from_secs(3))
                        .connect_lazy()
                })
                .map_err(|e| setup(e.to_string()))
        })
        .collect()
}

/// Submits and injects faults for `--duration`, with a line of progress every
/// ten seconds; returns once the submitters, the injector and the supervisor
/// have stopped.
pub(super) async fn under_faults(
    options: &Options,
    faults: &[Fault],
    channels: &[Channel],
    cluster: &Arc<tokio::sync::Mutex<Cluster>>,
    proxy: &Arc<Proxy>,
    events: &Arc<Events>,
) {
    let stop_load = CancellationToken::new();
    let stop_faults = CancellationToken::new();
    let mut load = JoinSet::new();
    const SUBMITTERS: u64 = 4;
    let per = Duration::from_secs_f64(SUBMITTERS as f64 / f64::from(options.rate.max(1)));
    for s in 0..SUBMITTERS {
        load.spawn(submitter(
            s,
            options.seed,
            channels.to_vec(),
            per,
            events.clone(),
            stop_load.clone(),
        ));
    }
    let injector = tokio::spawn(inject(
        StdRng::seed_from_u64(options.seed),
        faults.to_vec(),
        (options.fault_min, options.fault_max),
        cluster.clone(),
        proxy.clone(),
        options.pg_restart.clone(),
        options.heartbeat_interval,
        events.clone(),
        stop_faults.clone(),
    ));
    let supervisor = {
        let cluster = cluster.clone();
        let events = events.clone();
        let stop = stop_faults.clone();
        tokio::spawn(async move {
            while !stop.is_cancelled() {
                tokio::time::sleep(Duration::from_millis(500)).await;
                if let Err(e) = cluster.lock().await.supervise(&events).await {
                    eprintln!("soak: supervisor: {e}");
                }
            }
        })
    };

    let started = tokio::time::Instant::now();
    let mut progress = tokio::time::interval(Duration::from_secs(10));
    progress.tick().await;
    while started.elapsed() < options.duration {
        tokio::select! {
            _ = progress.tick() => {
                let (faults, acked) = events.counts();
                eprintln!("soak: {:>5} s · {} acknowledged · {} faults", started.elapsed().as_secs(), acked, faults);
            }
            _ = tokio::time::sleep_until(started + options.duration) => {}
        }
    }

    stop_load.cancel();
    while load.join_next().await.is_some() {}
    stop_faults.cancel();
    let _ = injector.await;
    let _ = supervisor.await;
}

/// How many concurrency keys and fairness keys the load spreads over.
const CONCURRENCY_KEYS: u64 = 8;
const FAIRNESS_KEYS: u64 = 4;

/// The limit the load's concurrency keys run under, and the weight of one of its
/// fairness keys: a keyed activity waits for its key's room, and is placed on its
/// tenant's chain, in every fault. The limit is loose enough that the settle
/// still ends in time.
pub(super) async fn set_limits(channels: &[Channel]) -> Result<(), Error> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let mut admin = AdminServiceClient::new(channels[0].clone());
        let limit = admin
            .set_concurrency_limit(v1::SetConcurrencyLimitRequest {
                concurrency_limit: Some(v1::ConcurrencyLimit {
                    namespace: NAMESPACE.to_owned(),
                    activity_type: ACTIVITY_TYPE.to_owned(),
                    max_running: 8,
                    ..Default::default()
                }),
            })
            .await;
        let weight = match limit {
            Ok(_) => {
                admin
                    .set_fairness_weight(v1::SetFairnessWeightRequest {
                        fairness_weight: Some(v1::FairnessWeight {
                            namespace: NAMESPACE.to_owned(),
                            activity_type: ACTIVITY_TYPE.to_owned(),
                            fairness_key: "t0".to_owned(),
                            weight: 3,
                            ..Default::default()
                        }),
                    })
                    .await
            }
            Err(s) => Err(s),
        };
        match weight {
            Ok(_) => return Ok(()),
            Err(s) if tokio::time::Instant::now() >= deadline => {
                return Err(setup(format!(
                    "cannot set the load's limits: {}",
                    s.message()
                )));
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

/// One submitter: a new key every `every`, retried (same key, next node) until
/// acknowledged or given up on.
async fn submitter(
    index: u64,
    seed: u64,
    channels: Vec<Channel>,
    every: Duration,
    events: Arc<Events>,
    stop: CancellationToken,
) {
    let mut rng = StdRng::seed_from_u64(seed.wrapping_add(1 + index));
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut next_node = index as usize;
    for n in 0u64.. {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.cancelled() => return,
        }
        let key = format!("{seed}-{index}-{n}");
        let once = rng.random_bool(0.1);
        let ms: u64 = match rng.random_range(0..100) {
            0..60 => rng.random_range(0..20),
            60..90 => rng.random_range(50..500),
            _ => rng.random_range(1_000..3_000),
        };
        let concurrency_key = match rng.random_range(0..4) {
            0 => format!("c{}", rng.random_range(0..CONCURRENCY_KEYS)),
            _ => String::new(),
        };
        let fairness_key = match rng.random_range(0..2) {
            0 => format!("t{}", rng.random_range(0..FAIRNESS_KEYS)),
            _ => String::new(),
        };
        let request = v1::SubmitRequest {
            namespace: NAMESPACE.to_owned(),
            workflow_id: WORKFLOW.to_owned(),
            activity_id: key.clone(),
            activity_type: ACTIVITY_TYPE.to_owned(),
            input: spool_worker::json(&worker::Input { ms }).ok(),
            retry_policy: Some(v1::RetryPolicy {
                max_attempts: if once { 1 } else { 1_000 },
                initial_interval: Some(spool_proto::duration::to_proto(Duration::from_millis(100))),
                backoff_coefficient: 2.0,
                max_interval: Some(spool_proto::duration::to_proto(Duration::from_secs(1))),
                non_retryable_error_types: Vec::new(),
            }),
            start_to_close_timeout: Some(spool_proto::duration::to_proto(Duration::from_secs(60))),
            concurrency_key,
            fairness_key,
            ..Default::default()
        };
        let mut acknowledged = false;
        for _ in 0..40 {
            let mut client =
                ActivityServiceClient::new(channels[next_node % channels.len()].clone());
            match client.submit(request.clone()).await {
                Ok(_) => acknowledged = true,
                Err(s) if s.code() == tonic::Code::AlreadyExists => acknowledged = true,
                Err(_) => {
                    next_node += 1;
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
            }
            break;
        }
        events.push(if acknowledged {
            DriverEvent::Submitted {
                k: key,
                once,
                t: now_ms(),
            }
        } else {
            DriverEvent::Unknown {
                k: key,
                t: now_ms(),
            }
        });
    }
}
