//! Events between nodes over PostgreSQL's LISTEN/NOTIFY: publishing a batch's
//! events in payloads under the size limit, and one listener task per node that
//! forwards other nodes' events and says `Resync` whenever some may have been
//! missed (the connection dropped, or the listener had to be rebuilt).

use sqlx::postgres::{PgListener, PgPool};
use tokio::sync::mpsc;

use crate::store::{Error, Event, Remote};

/// The notification channel nodes share.
pub const CHANNEL: &str = "spool_events";

/// PostgreSQL refuses notification payloads of 8,000 bytes or more.
const MAX_PAYLOAD: usize = 7_000;

#[derive(serde::Serialize, serde::Deserialize)]
struct Envelope {
    node: String,
    events: Vec<Event>,
}

/// Publishes `events` from `node`, in as few notifications as fit.
pub(super) async fn publish(pool: &PgPool, node: &str, events: Vec<Event>) -> Result<(), Error> {
    let payloads = envelopes(node, events);
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

/// Listens for other nodes' events until the receiver is dropped.
pub(super) async fn subscribe(pool: PgPool, node: String) -> Result<mpsc::Receiver<Remote>, Error> {
    let mut listener = listen(&pool).await?;
    let (tx, rx) = mpsc::channel(1024);
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
                        Ok(envelope) if envelope.node != node => envelope.events,
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
fn envelopes(node: &str, events: Vec<Event>) -> Vec<String> {
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
            payloads.extend(envelope(node, std::mem::take(&mut batch)));
            size = 0;
        }
        size += len + 1;
        batch.push(event);
    }
    if !batch.is_empty() {
        payloads.extend(envelope(node, batch));
    }
    payloads
}

fn envelope(node: &str, events: Vec<Event>) -> Option<String> {
    serde_json::to_string(&Envelope {
        node: node.to_owned(),
        events,
    })
    .ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Key;

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
        let payloads = envelopes("node", events.clone());
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
        let payloads = envelopes("node", vec![big, small.clone()]);
        assert_eq!(payloads.len(), 1);
        let back = serde_json::from_str::<Envelope>(&payloads[0])
            .map(|e| e.events)
            .unwrap_or_default();
        assert_eq!(back, vec![small]);
    }
}
