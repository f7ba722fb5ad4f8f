//! A worker for the `greet` activity type: `{"name": "Ada"}` → `{"greeting": "Hello, Ada!"}`.
//!
//! Run a server (`spool serve`), then this, then
//! `spool submit greet --input '{"name":"Ada"}' --wait`.

use spool_worker::{ActivityError, Payload, Worker};
use tokio_util::sync::CancellationToken;

#[tokio::main]
async fn main() -> Result<(), spool_worker::Error> {
    // The SDK says what its sessions do (connected, draining, reconnecting,
    // stopped) through `tracing`; RUST_LOG=debug says more.
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let endpoint =
        std::env::var("SPOOL_SERVER").unwrap_or_else(|_| "http://127.0.0.1:7070".to_owned());
    let shutdown = CancellationToken::new();
    let on_signal = shutdown.clone();
    tokio::spawn(async move {
        let _ = tokio::signal::ctrl_c().await;
        on_signal.cancel();
    });
    println!("greeter: serving 'greet' for {endpoint}; Ctrl-C to stop");
    Worker::new(endpoint)
        .identity("greeter-example")
        .activity("greet", |ctx, input: Payload| async move {
            let value: serde_json::Value = serde_json::from_slice(&input.data).map_err(|e| {
                ActivityError::terminal("BadInput", format!("input is not JSON: {e}"))
            })?;
            let name = value["name"].as_str().unwrap_or("world");
            println!("greeting {name} (attempt {})", ctx.info().attempt);
            Ok(spool_worker::json(
                &serde_json::json!({ "greeting": format!("Hello, {name}!") }),
            ))
        })
        .run(shutdown)
        .await
}
