//! Events between nodes over PostgreSQL's LISTEN/NOTIFY: publishing a batch's
//! events in payloads under the size limit, and one listener task per node that
//! forwards other nodes' events and says `Resync` whenever some may have been
//! missed (the connection dropped, or the listener had to be rebuilt).
//!
//! A node publishes only while another node of its deployment is there to hear
//! it: each node says hello every [`HELLO_EVERY`], answers at once a node it had
//! not heard from, and counts another as present for [`PRESENT_FOR`] after its
//! last word. A node alone on its database so spends nothing on notifications
//! (measured at about a seventh of PostgreSQL's CPU per activity). What another
//! node committed before it heard this one, it did not publish: on first hearing
//! a node, this one says `Resync` (due times are read from the store again), and
//! waiters read again every few seconds in any case. Cancels of running attempts
//! are the exception: the worker running one may be connected to a node not yet
//! heard, so a node alone keeps those it did not publish for [`UNHEARD_FOR`], and
//! publishes them when it first hears another node (else the worker would learn
//! only at its node's next lease renewal).
//!
//! Nodes whose tables are in other schemas of the same database share the
//! channel; their envelopes name their schema and are ignored.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use sqlx::postgres::{PgListener, PgPool};
use tokio::sync::mpsc;

use crate::store::{Error, Event, Remote};

/// The notification channel nodes share.
pub const CHANNEL: &str = "spool_events";

/// PostgreSQL refuses notification payloads of 8,000 bytes or more.
const MAX_PAYLOAD: usize = 7_000;

/// How often a node tells the others it is there.
const HELLO_EVERY: Duration = Duration::from_secs(1);

/// How long after its last word another node counts as listening: several
/// hellos, so a slow one or two do not stop publication.
const PRESENT_FOR: Duration = Duration::from_secs(5);

/// How long a node alone keeps a cancel it did not publish, for a node it may yet
/// hear: nodes starting together hear each other within a hello or two.
const UNHEARD_FOR: Duration = Duration::from_secs(10);

/// At most this many cancels kept unpublished (the oldest go first).
const UNHEARD_MAX: usize = 10_000;

#[derive(serde::Serialize, serde::Deserialize)]
struct Envelope {
    node: String,
    /// The schema of the sender's tables; empty from a version that did not say
    /// (counted as this deployment).
    #[serde(default)]
    scope: String,
    /// None in a hello.
    events: Vec<Event>,
    /// The sender takes no sessions over (it drains, or stops): a node that
    /// stops hands its sessions only to one that does. False from a version
    /// that did not say.
    #[serde(default)]
    draining: bool,
}

/// Who this node is on the channel, and whom it has heard.
pub(super) struct Channel {
    node: String,
    scope: String,
    presence: Presence,
    /// Said in every envelope, hellos included, so a lost word is corrected
    /// within a hello.
    draining: std::sync::atomic::AtomicBool,
}

impl Channel {
    pub fn new(node: String, scope: String) -> Arc<Self> {
        Arc::new(Self {
            node,
            scope,
            presence: Presence::default(),
            draining: std::sync::atomic::AtomicBool::new(false),
        })
    }

    #[cfg(test)]
    pub fn node(&self) -> &str {
        &self.node
    }

    /// Whether another node of this deployment was heard lately.
    #[cfg(test)]
    pub fn others_present(&self) -> bool {
        self.presence.others(Instant::now())
    }

    /// Whether another node of this deployment that takes sessions over (not
    /// draining, not stopping) was heard lately.
    pub fn others_staying(&self) -> bool {
        self.presence.lock().staying(Instant::now())
    }

    pub fn set_draining(&self, draining: bool) {
        self.draining
            .store(draining, std::sync::atomic::Ordering::SeqCst);
    }

    /// Whether an envelope from `scope` belongs to this deployment.
    fn ours(&self, scope: &str) -> bool {
        scope.is_empty() || scope == self.scope
    }
}

/// The other nodes heard from, and when last; and, while none is, the cancels
/// not published. One lock over both, so a cancel is either published or kept
/// for the first node heard, never neither.
#[derive(Default)]
struct Presence {
    state: Mutex<Heard>,
}

#[derive(Default)]
struct Heard {
    /// When each node was last heard, and whether it said it was draining.
    nodes: HashMap<String, (Instant, bool)>,
    unheard: std::collections::VecDeque<(Instant, Event)>,
}

impl Heard {
    fn others(&self, now: Instant) -> bool {
        self.nodes
            .values()
            .any(|(at, _)| now.saturating_duration_since(*at) < PRESENT_FOR)
    }

    fn staying(&self, now: Instant) -> bool {
        self.nodes
            .values()
            .any(|(at, draining)| !draining && now.saturating_duration_since(*at) < PRESENT_FOR)
    }
}

impl Presence {
    fn lock(&self) -> std::sync::MutexGuard<'_, Heard> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Notes a word from `node` at `now`. When it was not counted as present until
    /// now (new, or quiet for [`PRESENT_FOR`]) it must hear from us at once: then
    /// the cancels kept for it, else `None`.
    fn heard(&self, node: &str, draining: bool, now: Instant) -> Option<Vec<Event>> {
        let mut state = self.lock();
        state
            .nodes
            .retain(|_, (at, _)| now.saturating_duration_since(*at) < PRESENT_FOR);
        if state
            .nodes
            .insert(node.to_owned(), (now, draining))
            .is_some()
        {
            return None;
        }
        Some(
            state
                .unheard
                .drain(..)
                .filter(|(at, _)| now.saturating_duration_since(*at) < UNHEARD_FOR)
                .map(|(_, event)| event)
                .collect(),
        )
    }

    #[cfg(test)]
    fn others(&self, now: Instant) -> bool {
        self.lock().others(now)
    }

    /// True when another node listens; else keeps `events`' cancels for the
    /// first node heard.
    fn listening_or_keep(&self, events: &[Event], now: Instant) -> bool {
        let mut state = self.lock();
        if state.others(now) {
            return true;
        }
        let kept = events
            .iter()
            .filter(|e| matches!(e, Event::Cancelled { .. }))
            .map(|e| (now, e.clone()));
        state.unheard.extend(kept);
        while state.unheard.len() > UNHEARD_MAX
            || state
                .unheard
                .front()
                .is_some_and(|(at, _)| now.saturating_duration_since(*at) >= UNHEARD_FOR)
        {
            state.unheard.pop_front();
        }
        false
    }
}

/// Publishes `events`, in as few notifications as fit, if another node listens.
pub(super) async fn publish(
    pool: &PgPool,
    channel: &Channel,
    events: Vec<Event>,
) -> Result<(), Error> {
    if !channel.presence.listening_or_keep(&events, Instant::now()) {
        return Ok(());
    }
    notify(pool, envelopes(channel, events)).await
}

async fn notify(pool: &PgPool, payloads: Vec<String>) -> Result<(), Error> {
    if payloads.is_empty() {
        return Ok(());
    }
    sqlx::query("SELECT pg_notify($1, payload) FROM unnest($2::TEXT[]) AS payload")
        .bind(CHANNEL)
        .bind(payloads)
        .execute(pool)
        .await?;
    Ok(())
}

/// Tells the other nodes now whether this one drains, and waits for it.
pub(super) async fn announce(pool: &PgPool, channel: &Channel) {
    let payload = envelope(channel, Vec::new());
    if let Err(e) = notify(pool, payload.into_iter().collect()).await {
        tracing::warn!(error = %e, "could not tell other nodes whether this one drains; the next hello will");
    }
}

/// Says hello, without waiting for it: a failure only delays being heard.
fn hello(pool: &PgPool, channel: &Channel) {
    let (pool, payload) = (pool.clone(), envelope(channel, Vec::new()));
    tokio::spawn(async move {
        if let Err(e) = notify(&pool, payload.into_iter().collect()).await {
            tracing::debug!(error = %e, "could not say hello to other nodes");
        }
    });
}

/// Publishes the cancels kept while no other node was heard, without waiting for
/// it (as a hello).
fn tell_late(pool: &PgPool, channel: &Channel, kept: Vec<Event>) {
    if kept.is_empty() {
        return;
    }
    let (pool, payloads) = (pool.clone(), envelopes(channel, kept));
    tokio::spawn(async move {
        if let Err(e) = notify(&pool, payloads).await {
            tracing::warn!(error = %e, "could not tell a node just heard of earlier cancels");
        }
    });
}

/// Listens for other nodes' events until the receiver is dropped, and says hello
/// meanwhile.
pub(super) async fn subscribe(
    pool: PgPool,
    channel: Arc<Channel>,
) -> Result<mpsc::Receiver<Remote>, Error> {
    let mut listener = listen(&pool).await?;
    let (tx, rx) = mpsc::channel(1024);
    // Hellos on a task of their own (the interval's first tick, at once, is the
    // first hello): receiving is not cancel-safe, so nothing may interrupt it.
    tokio::spawn({
        let (pool, channel, tx) = (pool.clone(), channel.clone(), tx.clone());
        async move {
            let mut ticker = tokio::time::interval(HELLO_EVERY);
            ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = ticker.tick() => hello(&pool, &channel),
                    _ = tx.closed() => return,
                }
            }
        }
    });
    tokio::spawn(async move {
        loop {
            let received = tokio::select! {
                r = listener.try_recv() => r,
                // The receiver is gone: the server is stopping.
                _ = tx.closed() => return,
            };
            let events = match received {
                Ok(Some(notification)) => {
                    match serde_json::from_str::<Envelope>(notification.payload()) {
                        Ok(envelope)
                            if envelope.node != channel.node && channel.ours(&envelope.scope) =>
                        {
                            if let Some(kept) = channel.presence.heard(
                                &envelope.node,
                                envelope.draining,
                                Instant::now(),
                            ) {
                                hello(&pool, &channel);
                                tell_late(&pool, &channel, kept);
                                // Until it heard us, that node published nothing
                                // for us: what it committed meanwhile is read
                                // from the store instead.
                                if tx.send(Remote::Resync).await.is_err() {
                                    return;
                                }
                            }
                            envelope.events
                        }
                        Ok(_) => continue,
                        Err(e) => {
                            tracing::warn!(error = %e, "unreadable notification ignored");
                            continue;
                        }
                    }
                }
                // The connection dropped and was re-established: whatever was
                // sent meanwhile is lost.
                Ok(None) => {
                    hello(&pool, &channel);
                    if tx.send(Remote::Resync).await.is_err() {
                        return;
                    }
                    continue;
                }
                // Reconnecting failed: build a new listener (with backoff), and
                // then say that events may have been missed.
                Err(e) => {
                    tracing::warn!(error = %e, "listening for other nodes failed; reconnecting");
                    let mut pause = std::time::Duration::from_millis(100);
                    listener = loop {
                        tokio::select! {
                            _ = tokio::time::sleep(pause) => {}
                            _ = tx.closed() => return,
                        }
                        match listen(&pool).await {
                            Ok(l) => break l,
                            Err(e) => {
                                tracing::warn!(error = %e, "still cannot listen for other nodes");
                                pause = (pause * 2).min(std::time::Duration::from_secs(5));
                            }
                        }
                    };
                    hello(&pool, &channel);
                    if tx.send(Remote::Resync).await.is_err() {
                        return;
                    }
                    continue;
                }
            };
            for event in events {
                if tx.send(Remote::Event(event)).await.is_err() {
                    return;
                }
            }
        }
    });
    Ok(rx)
}

async fn listen(pool: &PgPool) -> Result<PgListener, Error> {
    let mut listener = PgListener::connect_with(pool).await?;
    listener.listen(CHANNEL).await?;
    Ok(listener)
}

/// Packs events into notification payloads under PostgreSQL's size limit. An event
/// too large on its own is left out (the others' periodic re-read covers it)
/// rather than failing the whole publication.
fn envelopes(channel: &Channel, events: Vec<Event>) -> Vec<String> {
    let node = &channel.node;
    let mut payloads = Vec::new();
    let mut batch: Vec<Event> = Vec::new();
    let mut size = 0;
    for event in events {
        let len = serde_json::to_string(&event).map_or(0, |t| t.len());
        if len + node.len() + 64 > MAX_PAYLOAD {
            tracing::warn!(bytes = len, "an event too large to notify was left out");
            continue;
        }
        if !batch.is_empty() && size + len + node.len() + 64 > MAX_PAYLOAD {
            payloads.extend(envelope(channel, std::mem::take(&mut batch)));
            size = 0;
        }
        size += len + 1;
        batch.push(event);
    }
    if !batch.is_empty() {
        payloads.extend(envelope(channel, batch));
    }
    payloads
}

fn envelope(channel: &Channel, events: Vec<Event>) -> Option<String> {
    serde_json::to_string(&Envelope {
        node: channel.node.clone(),
        scope: channel.scope.clone(),
        events,
        draining: channel.draining.load(std::sync::atomic::Ordering::SeqCst),
    })
    .ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Key;

    #[test]
    fn another_node_counts_as_present_until_it_has_been_quiet_a_while() {
        let presence = Presence::default();
        let start = Instant::now();
        assert!(!presence.others(start), "alone at first");
        assert!(
            presence.heard("b", false, start).is_some(),
            "a new node is answered at once"
        );
        assert!(
            presence.heard("b", false, start + HELLO_EVERY).is_none(),
            "a known one is not"
        );
        assert!(presence.others(start + HELLO_EVERY + PRESENT_FOR / 2));
        let quiet = start + HELLO_EVERY + PRESENT_FOR;
        assert!(!presence.others(quiet), "quiet for PRESENT_FOR: gone");
        assert!(
            presence.heard("b", false, quiet).is_some(),
            "back: answered at once again"
        );
    }

    #[test]
    fn a_draining_node_is_present_but_takes_no_sessions() {
        let presence = Presence::default();
        let start = Instant::now();
        presence.heard("b", false, start);
        assert!(presence.lock().staying(start));
        presence.heard("b", true, start + HELLO_EVERY);
        let state = presence.lock();
        assert!(state.others(start + HELLO_EVERY), "still heard");
        assert!(!state.staying(start + HELLO_EVERY), "but not staying");
        drop(state);
        presence.heard("b", false, start + 2 * HELLO_EVERY);
        assert!(presence.lock().staying(start + 2 * HELLO_EVERY), "resumed");
    }

    #[test]
    fn a_node_alone_keeps_its_cancels_for_the_first_node_it_hears() {
        let key = |id: &str| Key {
            namespace: "default".into(),
            workflow_id: "wf".into(),
            activity_id: id.into(),
        };
        let cancelled = |id: &str| Event::Cancelled {
            worker_id: "w".into(),
            key: key(id),
            attempt: 1,
            reason: "no longer wanted".into(),
        };
        let presence = Presence::default();
        let start = Instant::now();
        let events = [cancelled("old"), Event::Finished { key: key("f") }];
        assert!(!presence.listening_or_keep(&events, start), "alone");
        let later = start + UNHEARD_FOR / 2;
        assert!(!presence.listening_or_keep(&[cancelled("new")], later));
        // Heard once the first one is too old to matter: only the second is told.
        let heard = start + UNHEARD_FOR;
        assert_eq!(
            presence.heard("b", false, heard),
            Some(vec![cancelled("new")])
        );
        assert!(
            presence.listening_or_keep(&[cancelled("next")], heard),
            "b listens: published, not kept"
        );
        assert_eq!(presence.heard("c", false, heard), Some(Vec::new()));
    }

    #[test]
    fn envelopes_of_other_schemas_are_not_ours_and_older_ones_are() {
        let channel = Channel::new("a".into(), "tenant_1".into());
        assert!(channel.ours("tenant_1"));
        assert!(channel.ours(""), "a version that did not name its schema");
        assert!(!channel.ours("tenant_2"));
        let old: Envelope =
            serde_json::from_str(r#"{"node":"b","events":[]}"#).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(old.scope, "");
    }

    #[test]
    fn envelopes_stay_under_the_payload_limit() {
        let events: Vec<Event> = (0..500)
            .map(|i| Event::Finished {
                key: Key {
                    namespace: "default".into(),
                    workflow_id: format!("workflow-{i:0>40}"),
                    activity_id: format!("activity-{i:0>40}"),
                },
            })
            .collect();
        let payloads = envelopes(
            &Channel::new("node".into(), "public".into()),
            events.clone(),
        );
        assert!(payloads.len() > 1);
        assert!(payloads.iter().all(|p| p.len() < 8_000));
        let back: Vec<Event> = payloads
            .iter()
            .flat_map(|p| {
                serde_json::from_str::<Envelope>(p)
                    .map(|e| e.events)
                    .unwrap_or_default()
            })
            .collect();
        assert_eq!(back, events);
    }

    #[test]
    fn an_oversize_event_is_left_out_not_the_others() {
        let big = Event::Cancelled {
            worker_id: "w".into(),
            key: Key {
                namespace: "default".into(),
                workflow_id: "wf".into(),
                activity_id: "a".into(),
            },
            attempt: 1,
            reason: "x".repeat(10_000),
        };
        let small = Event::Finished {
            key: Key {
                namespace: "default".into(),
                workflow_id: "wf".into(),
                activity_id: "b".into(),
            },
        };
        let payloads = envelopes(
            &Channel::new("node".into(), "public".into()),
            vec![big, small.clone()],
        );
        assert_eq!(payloads.len(), 1);
        let back = serde_json::from_str::<Envelope>(&payloads[0])
            .map(|e| e.events)
            .unwrap_or_default();
        assert_eq!(back, vec![small]);
    }
}
