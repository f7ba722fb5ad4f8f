//! The other nodes sharing the store, as the committer sees them: the events each
//! committed batch owes them (published in commit order by a task of its own, so a
//! slow publication never holds up the next batch), and their events for this node.
//! On a single node (SQLite) there are none and every method is a no-op.
//!
//! The publisher's queue is bounded ([`PUBLISH_QUEUE`] batches): while
//! publication stalls, a batch's events are dropped rather than queued without
//! end. Nothing depends on them alone: other nodes re-read due times every few
//! seconds, waiters re-read, and a cancel reaches its worker at the next lease
//! renewal.

use std::{collections::HashSet, future::Future, pin::Pin, sync::Arc, time::Duration};

use spool_proto::time::UnixMillis;
use tokio::sync::mpsc;

use crate::store::{Error, Event, Remote, Store};

/// How many committed batches' events may wait for the publisher.
const PUBLISH_QUEUE: usize = 1024;

/// Publishes one batch's events to the other nodes.
type Publish = Arc<
    dyn Fn(Vec<Event>) -> Pin<Box<dyn Future<Output = Result<(), Error>> + Send>> + Send + Sync,
>;

pub(super) struct Peers {
    /// The task that publishes, in order, and its queue; awaited on stop.
    publisher: Option<(mpsc::Sender<Vec<Event>>, tokio::task::JoinHandle<()>)>,
    /// Whether the queue was found full and not yet logged (once per stretch).
    full_logged: bool,
    /// Events of the batch being applied, published after it.
    outgoing: Vec<Event>,
    /// Other nodes' events; `None` when no other node shares the store.
    remote: Option<mpsc::Receiver<Remote>>,
}

impl Peers {
    pub fn new(store: &Arc<dyn Store>, remote: Option<mpsc::Receiver<Remote>>) -> Self {
        let publish: Option<Publish> = (!store.single_node()).then(|| {
            let store = store.clone();
            let publish: Publish = Arc::new(move |events| {
                let store = store.clone();
                Box::pin(async move { store.publish(events).await })
            });
            publish
        });
        Self::with_publisher(publish, PUBLISH_QUEUE, remote)
    }

    /// Peers published to by `publish` (none: a single node), in order, through a
    /// queue of `capacity` batches.
    fn with_publisher(
        publish: Option<Publish>,
        capacity: usize,
        remote: Option<mpsc::Receiver<Remote>>,
    ) -> Self {
        let publisher = publish.map(|publish| {
            let (events, queue) = mpsc::channel(capacity);
            (events, tokio::spawn(publish_loop(publish, queue)))
        });
        Self {
            publisher,
            full_logged: false,
            outgoing: Vec::new(),
            remote,
        }
    }

    /// Whether other nodes share the store and must hear of committed changes.
    pub fn sharing(&self) -> bool {
        self.publisher.is_some()
    }

    /// Whether other nodes' events arrive here.
    pub fn listening(&self) -> bool {
        self.remote.is_some()
    }

    /// Queues an event of the batch being applied, if anyone is there to hear it;
    /// made only then (a node alone would copy its keys for nobody).
    pub fn tell(&mut self, event: impl FnOnce() -> Event) {
        if self.sharing() {
            self.outgoing.push(event());
        }
    }

    /// Hands the batch's events to the publisher. Rows of one type due now make
    /// one event; each later time its own. An error names what stopped.
    pub fn flush(&mut self, now: UnixMillis) -> Result<(), &'static str> {
        if self.outgoing.is_empty() {
            return Ok(());
        }
        let mut due: HashSet<(String, String, UnixMillis)> = HashSet::new();
        let mut events = Vec::new();
        for event in self.outgoing.drain(..) {
            match event {
                Event::Due {
                    namespace,
                    activity_type,
                    at,
                } => {
                    due.insert((namespace, activity_type, at.max(now)));
                }
                other => events.push(other),
            }
        }
        events.extend(
            due.into_iter()
                .map(|(namespace, activity_type, at)| Event::Due {
                    namespace,
                    activity_type,
                    at,
                }),
        );
        let Some((queue, task)) = &self.publisher else {
            return Ok(());
        };
        if task.is_finished() {
            return Err("the publisher of changes to other nodes stopped");
        }
        match queue.try_send(events) {
            Ok(()) => self.full_logged = false,
            Err(mpsc::error::TrySendError::Full(_)) => {
                crate::metrics::peer_events_dropped();
                if !std::mem::replace(&mut self.full_logged, true) {
                    tracing::warn!(
                        "publishing to other nodes falls behind: a commit's events are dropped; other nodes catch up by re-reading within seconds"
                    );
                }
            }
            Err(mpsc::error::TrySendError::Closed(_)) => {
                return Err("the publisher of changes to other nodes stopped");
            }
        }
        Ok(())
    }

    /// The next event from another node (pending forever on a single node);
    /// `None` when the listener stopped.
    pub async fn recv(&mut self) -> Option<Remote> {
        match &mut self.remote {
            Some(rx) => rx.recv().await,
            None => std::future::pending().await,
        }
    }

    /// An event from another node if one is waiting; an error when the listener
    /// stopped.
    pub fn try_recv(&mut self) -> Result<Option<Remote>, &'static str> {
        let Some(remote) = self.remote.as_mut() else {
            return Ok(None);
        };
        match remote.try_recv() {
            Ok(event) => Ok(Some(event)),
            Err(mpsc::error::TryRecvError::Empty) => Ok(None),
            Err(mpsc::error::TryRecvError::Disconnected) => {
                Err("the listener for other nodes' changes stopped")
            }
        }
    }

    /// Waits until what was handed to the publisher has been published.
    pub async fn stop(&mut self) {
        if let Some((queue, task)) = self.publisher.take() {
            drop(queue);
            let _ = task.await;
        }
    }
}

/// Publishes each committed batch's events in order, retrying a failed publication
/// a few times; the periodic re-read covers what still fails.
async fn publish_loop(publish: Publish, mut queue: mpsc::Receiver<Vec<Event>>) {
    while let Some(events) = queue.recv().await {
        let mut pause = Duration::from_millis(50);
        for attempt in 1..=3 {
            match publish(events.clone()).await {
                Ok(()) => break,
                Err(e) if attempt == 3 => {
                    tracing::warn!(error = %e, "could not tell other nodes of a commit; they catch up within seconds");
                }
                Err(_) => {
                    tokio::time::sleep(pause).await;
                    pause *= 2;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// With publication stalled, committed batches' events are dropped once the
    /// queue is full: commits go on, and the queue stays within its bound.
    #[tokio::test]
    async fn a_stalled_publisher_drops_events_instead_of_queueing_them_without_end() {
        let stalled: Publish = Arc::new(|_| Box::pin(std::future::pending()));
        let mut peers = Peers::with_publisher(Some(stalled), 4, None);
        for at in 0..100 {
            peers.tell(|| Event::Due {
                namespace: "default".into(),
                activity_type: "t".into(),
                at,
            });
            assert_eq!(peers.flush(at), Ok(()), "a commit is never failed by it");
        }
        let Some((queue, _)) = &peers.publisher else {
            panic!("a publisher")
        };
        // One batch is being published (taken from the queue), four wait.
        assert_eq!(queue.capacity(), 0, "full");
        assert_eq!(queue.max_capacity(), 4);
    }
}
