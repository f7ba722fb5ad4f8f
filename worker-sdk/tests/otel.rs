//! With the `otel` feature, a submit made inside a span carries that trace, the
//! server's and the worker's spans of the attempt join it, and all reach an OTLP
//! collector (`cargo test -p spool-worker --features otel`; the feature reaches the
//! client and the in-process server through `spool-proto`).

#![cfg(feature = "otel")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
    trace_service_server::{TraceService, TraceServiceServer},
};
use spool_worker::{ActivityError, Worker};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

/// Spans received, as (name, trace id in hex).
#[derive(Clone, Default)]
struct Collector(Arc<Mutex<Vec<(String, String)>>>);

#[tonic::async_trait]
impl TraceService for Collector {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut spans = self.0.lock().unwrap();
        for resource in request.into_inner().resource_spans {
            for scope in resource.scope_spans {
                for span in scope.spans {
                    let trace_id: String =
                        span.trace_id.iter().map(|b| format!("{b:02x}")).collect();
                    spans.push((span.name, trace_id));
                }
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

spool_worker::activity_type!(Echo = "echo", String => String);

#[tokio::test(flavor = "multi_thread")]
async fn the_callers_trace_reaches_the_server_and_the_worker_and_is_exported() {
    let collector = Collector::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(TraceServiceServer::new(collector.clone()))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    let otel = spool_worker::otel::install("spool-test-worker", &format!("http://{address}"))
        .expect("install");

    let server = spool_server::testing::TestServer::start().await.unwrap();
    let stop = CancellationToken::new();
    let worker = Worker::new(server.endpoint()).register::<Echo, _, _>(|_ctx, s| async move {
        tracing::info!("echoing");
        Ok::<_, ActivityError>(s)
    });
    let running = tokio::spawn(worker.run(stop.clone()));
    let client = spool_client::Client::builder(server.endpoint())
        .connect()
        .await
        .unwrap();
    // A traceparent given by hand is kept.
    let given = "4bf92f3577b34da6a3ce929d0e0e4736";
    let out = client
        .activity::<Echo>(&"hi".to_owned())
        .unwrap()
        .traceparent(format!("00-{given}-00f067aa0ba902b7-01"))
        .execute()
        .await
        .unwrap();
    assert_eq!(out, "hi");
    // Without one, the submit continues the caller's current span.
    let root = tracing::info_span!("checkout");
    let from_span = client
        .activity::<Echo>(&"again".to_owned())
        .unwrap()
        .send()
        .instrument(root.clone())
        .await
        .unwrap();
    let headers = from_span.get().await.unwrap().headers;
    let traceparent = headers.get("traceparent").cloned().unwrap_or_default();
    assert_eq!(from_span.wait().await.unwrap(), "again");
    drop(root);
    stop.cancel();
    running.await.unwrap().unwrap();
    // Dropping the guard flushes the batch to the collector.
    tokio::task::spawn_blocking(move || drop(otel))
        .await
        .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let root_trace = loop {
        let spans = collector.0.lock().unwrap().clone();
        let root = spans.iter().find(|(name, _)| name == "checkout").cloned();
        let joined = |name: &str, trace: &str| spans.iter().any(|(n, t)| n == name && t == trace);
        if let Some((_, root_trace)) = root
            && joined("activity", given)
            && joined("attempt", given)
            && joined("activity", &root_trace)
            && joined("attempt", &root_trace)
        {
            break root_trace;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the worker's and the server's spans did not join both traces: {spans:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(
        traceparent.contains(&root_trace),
        "the submit carried the caller's trace: {traceparent} vs {root_trace}"
    );
}
