//! Long work that survives its own interruption: the handler reports its progress
//! with heartbeats, honours cancellation, and a retry resumes from the last
//! progress the server stored instead of starting over. Runs against an in-process
//! server: `cargo run -p spool-worker --example resumable`.

use std::time::Duration;

use spool_client::Client;
use spool_worker::{ActivityError, Worker};
use tokio_util::sync::CancellationToken;

spool_worker::activity_type!(
    /// Processes `total` items, one at a time.
    Import = "import", u32 => u32
);

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let server = spool_server::testing::TestServer::start_with(|c| {
        c.heartbeat_interval = Duration::from_millis(100);
    })
    .await?;
    let stop = CancellationToken::new();
    let worker = Worker::new(server.endpoint()).register::<Import, _, _>(|ctx, total| async move {
        // Where an earlier attempt got to, if one did.
        let mut done: u32 = ctx.last_heartbeat()?.unwrap_or(0);
        println!(
            "attempt {}: starting at item {done} of {total}",
            ctx.info().attempt
        );
        while done < total {
            if ctx.is_cancelled() {
                return Err(ActivityError::retryable(
                    "Cancelled",
                    format!("{:?}", ctx.cancel_reason()),
                ));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
            done += 1;
            ctx.heartbeat_with(&done)?;
            // The first attempt is interrupted halfway, as a crash would.
            if ctx.info().attempt == 1 && done == total / 2 {
                tokio::time::sleep(Duration::from_millis(300)).await; // let it be stored
                return Err(ActivityError::retryable("Interrupted", "halfway"));
            }
        }
        Ok::<_, ActivityError>(done)
    });
    let running = tokio::spawn(worker.run(stop.clone()));

    let client = Client::builder(server.endpoint()).connect().await?;
    let handle = client
        .activity::<Import>(&20)?
        .retry_policy(spool_client::v1::RetryPolicy {
            max_attempts: 3,
            initial_interval: Some(spool_proto::duration::to_proto(Duration::from_millis(50))),
            ..Default::default()
        })
        .send()
        .await?;
    let done = handle.wait().await?;
    let activity = handle.get().await?;
    println!("imported {done} items in {} attempts", activity.attempt);
    assert_eq!((done, activity.attempt), (20, 2));

    stop.cancel();
    running.await??;
    server.stop().await?;
    Ok(())
}
