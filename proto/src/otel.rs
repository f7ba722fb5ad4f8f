//! OpenTelemetry, with the `otel` feature: what [`crate::trace`] does when it is on,
//! and [`install`], which exports this process's `tracing` spans over OTLP/gRPC.

use std::collections::{BTreeMap, HashMap};

use opentelemetry::{propagation::TextMapPropagator, trace::TracerProvider as _};
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::{Resource, propagation::TraceContextPropagator, trace::SdkTracerProvider};
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::{EnvFilter, layer::SubscriberExt, util::SubscriberInitExt};

/// See [`crate::trace::join_trace`].
pub(crate) fn join_trace(span: &tracing::Span, headers: &BTreeMap<String, String>) {
    let carrier: HashMap<String, String> = headers.clone().into_iter().collect();
    let parent = TraceContextPropagator::new().extract(&carrier);
    let _ = span.set_parent(parent);
}

/// See [`crate::trace::current_traceparent`].
pub(crate) fn current_traceparent() -> Option<String> {
    let context = tracing::Span::current().context();
    let mut carrier: HashMap<String, String> = HashMap::new();
    TraceContextPropagator::new().inject_context(&context, &mut carrier);
    carrier.remove("traceparent")
}

/// Why OTLP export could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum OtelError {
    /// The exporter could not be built (a bad endpoint).
    #[error("cannot build the OTLP exporter: {0}")]
    Exporter(#[from] opentelemetry_otlp::ExporterBuildError),
    /// A global `tracing` subscriber was installed already.
    #[error("a tracing subscriber is installed already: {0}")]
    Subscriber(#[from] tracing_subscriber::util::TryInitError),
}

/// Keeps the export running; dropping it flushes what is buffered and stops.
pub struct Otel {
    provider: SdkTracerProvider,
}

impl Drop for Otel {
    fn drop(&mut self) {
        let _ = self.provider.shutdown();
    }
}

/// Installs the global `tracing` subscriber: logs to stderr (level from
/// `RUST_LOG`, default info) and every span exported over OTLP/gRPC to `endpoint`
/// (for example `http://127.0.0.1:4317`) as service `service_name`.
pub fn install(service_name: &str, endpoint: &str) -> Result<Otel, OtelError> {
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .with_endpoint(endpoint)
        .build()?;
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(
            Resource::builder()
                .with_service_name(service_name.to_owned())
                .build(),
        )
        .build();
    let tracer = provider.tracer("spool");
    tracing_subscriber::registry()
        .with(EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")))
        .with(tracing_opentelemetry::layer().with_tracer(tracer))
        .with(tracing_subscriber::fmt::layer().with_writer(std::io::stderr))
        .try_init()?;
    Ok(Otel { provider })
}
