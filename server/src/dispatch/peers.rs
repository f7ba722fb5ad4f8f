//! The other nodes sharing the store, as the committer sees them: the events each
//! committed batch owes them (published in commit order by a task of its own, so a
//! slow publication never holds up the next batch), and their events for this node.
//! On a single node (SQLite) there are none and every method is a no-op.

use std::{collections::HashSet, sync::Arc, time::Duration};

use spool_proto::time::UnixMillis;
use tokio::sync::mpsc;

use crate::store::{Event, Remote, Store};

pub(super) struct Peers {
    /// The task that publishes, in order, and its queue; awaited on stop.
    publisher: Option<(
        mpsc::UnboundedSender<Vec<Event>>,
        tokio::task::JoinHandle<()>,
    )>,
    /// Events of the batch being applied, published after it.
    outgoing: Vec<Event>,
    /// Other nodes' events; `None` when no other node shares the store.
    remote: Option<mpsc::Receiver<Remote>>,
}

impl Peers {
    pub fn new(store: &Arc<dyn Store>, remote: Option<mpsc::Receiver<Remote>>) -> Self {
        let publisher = (!store.single_node()).then(|| {
            // One message per committed batch at most, so the queue is bounded by
            // the commit rate; a queue keeps publications in commit order.
            let (events, queue) = mpsc::unbounded_channel();
            (events, tokio::spawn(publish_loop(store.clone(), queue)))
        });
        Self {
            publisher,
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

    /// Queues an event of the batch being applied, if anyone is there to hear it.
    pub fn tell(&mut self, event: Event) {
        if self.sharing() {
            self.outgoing.push(event);
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
        match &self.publisher {
            Some((queue, task)) if queue.send(events).is_err() || task.is_finished() => {
                Err("the publisher of changes to other nodes stopped")
            }
            _ => Ok(()),
        }
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
async fn publish_loop(store: Arc<dyn Store>, mut queue: mpsc::UnboundedReceiver<Vec<Event>>) {
    while let Some(events) = queue.recv().await {
        let mut pause = Duration::from_millis(50);
        for attempt in 1..=3 {
            match store.publish(events.clone()).await {
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
