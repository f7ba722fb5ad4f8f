//! A typed service and worker, end to end: one `Activity` type both sides share, a
//! worker registering a handler for it, a client executing it. Runs against an
//! in-process server (`spool_server::testing`), so it needs nothing running:
//! `cargo run -p spool-worker --example typed`.

use spool_client::Client;
use spool_worker::{ActivityError, Worker};
use tokio_util::sync::CancellationToken;

spool_worker::activity_type!(
    /// The contract: name, input and output.
    Resize = "image.resize", Image => Resized
);

#[derive(serde::Serialize, serde::Deserialize)]
struct Image {
    url: String,
    width: u32,
}

#[derive(serde::Serialize, serde::Deserialize, Debug, PartialEq)]
struct Resized {
    url: String,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let server = spool_server::testing::TestServer::start().await?;

    // The worker side.
    let stop = CancellationToken::new();
    let worker = Worker::new(server.endpoint()).register::<Resize, _, _>(|ctx, image| async move {
        if image.width == 0 {
            return Err(ActivityError::terminal(
                "BadWidth",
                "width must be positive",
            ));
        }
        println!("resizing {} (attempt {})", image.url, ctx.info().attempt);
        Ok(Resized {
            url: format!("{}?w={}", image.url, image.width),
        })
    });
    let running = tokio::spawn(worker.run(stop.clone()));

    // The service side.
    let client = Client::builder(server.endpoint()).connect().await?;
    let resized = client
        .activity::<Resize>(&Image {
            url: "https://example.com/cat.png".into(),
            width: 320,
        })?
        .workflow_id("upload-1")
        .activity_id("thumbnail")
        .execute()
        .await?;
    println!("done: {}", resized.url);
    assert_eq!(resized.url, "https://example.com/cat.png?w=320");

    let refused = client
        .activity::<Resize>(&Image {
            url: "https://example.com/dog.png".into(),
            width: 0,
        })?
        .execute()
        .await;
    match refused {
        Err(spool_client::Error::NotCompleted { activity }) => {
            println!(
                "failed as it should: {:?}",
                activity.last_error.map(|e| e.message)
            );
        }
        other => return Err(format!("expected a failure, got {other:?}").into()),
    }

    stop.cancel();
    running.await??;
    server.stop().await?;
    Ok(())
}
