//! W3C trace context across processes, for the server, the worker SDK and the
//! client alike. With the `otel` feature (anywhere in the build: features unify)
//! these link `tracing` spans into OpenTelemetry traces; without it they do
//! nothing, so callers need no feature of their own.

use std::collections::BTreeMap;

/// Makes `span` a child of the trace context a `traceparent` in `headers` names.
pub fn join_trace(span: &tracing::Span, headers: &BTreeMap<String, String>) {
    #[cfg(feature = "otel")]
    crate::otel::join_trace(span, headers);
    #[cfg(not(feature = "otel"))]
    let _ = (span, headers);
}

/// The current span's trace context as a `traceparent` value, when the current
/// span is in an OpenTelemetry trace.
pub fn current_traceparent() -> Option<String> {
    #[cfg(feature = "otel")]
    return crate::otel::current_traceparent();
    #[cfg(not(feature = "otel"))]
    None
}
