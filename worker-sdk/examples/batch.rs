//! Submitting many activities at once: one commit for the whole batch (all or
//! nothing), a handle for each, and the outputs gathered as they finish. Runs
//! against an in-process server: `cargo run -p spool-worker --example batch`.

use spool_client::Client;
use spool_worker::{ActivityError, Worker};
use tokio_util::sync::CancellationToken;

spool_worker::activity_type!(Square = "square", u64 => u64);

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let server = spool_server::testing::TestServer::start().await?;
    let stop = CancellationToken::new();
    let worker = Worker::new(server.endpoint())
        .max_concurrency(32)
        .register::<Square, _, _>(|_ctx, n| async move { Ok::<_, ActivityError>(n * n) });
    let running = tokio::spawn(worker.run(stop.clone()));

    let client = Client::builder(server.endpoint()).connect().await?;
    let inputs: Vec<u64> = (1..=1_000).collect();
    let handles = client.submit_all::<Square>(&inputs).await?;
    let mut sum = 0;
    for handle in &handles {
        sum += handle.wait().await?;
    }
    println!(
        "{} activities in one commit; the sum of their squares is {sum}",
        handles.len()
    );
    assert_eq!(sum, (1..=1_000u64).map(|n| n * n).sum::<u64>());

    stop.cancel();
    running.await??;
    server.stop().await?;
    Ok(())
}
