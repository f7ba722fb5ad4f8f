//! The node's commands: stats, workers, drain and resume.

use std::time::Duration;

use super::{
    Commands, Error, exit,
    print::{format_time, print_json, table},
};

/// What `stats` and `workers` say under their table while the node drains.
const DRAINING: &str =
    "this node is draining: it dispatches nothing and refuses workers until `spool resume`";

impl Commands {
    pub async fn stats(&self, namespace: String) -> Result<i32, Error> {
        let s = self.client.stats(namespace).await?;
        if self.json {
            print_json(&serde_json::json!({
                "scheduled": s.scheduled, "running": s.running, "completed": s.completed,
                "failed": s.failed, "cancelled": s.cancelled, "connected_workers": s.connected_workers,
                "draining": s.draining, "claimed_ahead": s.claimed_ahead,
            }));
        } else {
            let rows = vec![vec![
                s.scheduled.to_string(),
                s.running.to_string(),
                s.completed.to_string(),
                s.failed.to_string(),
                s.cancelled.to_string(),
                s.connected_workers.to_string(),
            ]];
            print!(
                "{}",
                table(
                    &[
                        "SCHEDULED",
                        "RUNNING",
                        "COMPLETED",
                        "FAILED",
                        "CANCELLED",
                        "WORKERS"
                    ],
                    &rows
                )
            );
            if s.claimed_ahead > 0 {
                println!(
                    "{} of the running rows are claimed ahead: sent to a worker as its next slot frees",
                    s.claimed_ahead
                );
            }
            if s.draining {
                println!("{DRAINING}");
            }
        }
        Ok(exit::OK)
    }

    pub async fn workers(&self, namespace: String) -> Result<i32, Error> {
        let answer = self.client.list_workers(namespace).await?;
        let workers = answer.workers;
        if self.json {
            let list: Vec<serde_json::Value> = workers
                .iter()
                .map(|w| {
                    serde_json::json!({
                        "worker_id": w.worker_id, "identity": w.identity, "namespace": w.namespace,
                        "activity_types": w.activity_types, "max_concurrency": w.max_concurrency,
                        "in_flight": w.in_flight,
                        "connected_at": w.connected_at.as_ref().map(format_time),
                        "last_seen_at": w.last_seen_at.as_ref().map(format_time),
                        "node": w.node,
                    })
                })
                .collect();
            print_json(&serde_json::json!({"workers": list, "draining": answer.draining}));
            return Ok(exit::OK);
        }
        let rows: Vec<Vec<String>> = workers
            .iter()
            .map(|w| {
                vec![
                    w.worker_id.clone(),
                    w.identity.clone(),
                    w.node.clone(),
                    w.namespace.clone(),
                    w.activity_types.join(","),
                    format!("{}/{}", w.in_flight, w.max_concurrency),
                    w.connected_at.as_ref().map(format_time).unwrap_or_default(),
                ]
            })
            .collect();
        print!(
            "{}",
            table(
                &[
                    "WORKER_ID",
                    "IDENTITY",
                    "NODE",
                    "NAMESPACE",
                    "TYPES",
                    "IN_FLIGHT",
                    "CONNECTED"
                ],
                &rows
            )
        );
        if answer.draining {
            println!("{DRAINING}");
        }
        Ok(exit::OK)
    }

    pub async fn drain(&self, timeout: Option<Duration>) -> Result<i32, Error> {
        let r = self.client.drain(timeout).await?;
        if self.json {
            print_json(&serde_json::json!({
                "completed": r.completed,
                "released": r.released,
                "handed_over": r.handed_over,
                "ended_otherwise": r.ended_otherwise,
            }));
        } else {
            let otherwise = match r.ended_otherwise {
                0 => String::new(),
                n => format!(", {n} ended otherwise (timed out, lost or cancelled)"),
            };
            println!(
                "drained: {} completed, {} released{otherwise}; the node refuses workers until `spool resume`",
                r.completed, r.released
            );
        }
        Ok(exit::OK)
    }

    pub async fn resume(&self) -> Result<i32, Error> {
        let r = self.client.resume().await?;
        if self.json {
            print_json(&serde_json::json!({"was_draining": r.was_draining}));
        } else if r.was_draining {
            println!("resumed: the node takes workers and dispatches again");
        } else {
            println!("the node was not draining: nothing changed");
        }
        Ok(exit::OK)
    }
}
