//! A worker for the typed `greet` activity: `{"name": "Ada"}` → `{"greeting": "Hello, Ada!"}`.
//!
//! Run a server (`spool serve`), then this, then
//! `spool submit greet --input '{"name":"Ada"}' --wait`. SIGTERM or Ctrl-C stops it
//! the way a deploy should: running greetings finish and report first.

use spool_worker::{ActivityError, Worker};

spool_worker::activity_type!(
    /// The contract a service submitting greetings shares with this worker.
    Greet = "greet", Person => Greeting
);

#[derive(serde::Serialize, serde::Deserialize)]
struct Person {
    #[serde(default = "world")]
    name: String,
}

fn world() -> String {
    "world".to_owned()
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Greeting {
    greeting: String,
}

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
    let endpoint = std::env::var("SPOOL_SERVER").unwrap_or_else(|_| "127.0.0.1:7070".to_owned());
    println!("greeter: serving 'greet' for {endpoint}; Ctrl-C or SIGTERM to stop");
    Worker::new(endpoint)
        .identity("greeter-example")
        .register::<Greet, _, _>(|ctx, person| async move {
            println!("greeting {} (attempt {})", person.name, ctx.info().attempt);
            Ok::<_, ActivityError>(Greeting {
                greeting: format!("Hello, {}!", person.name),
            })
        })
        .run_until_signal()
        .await
}
