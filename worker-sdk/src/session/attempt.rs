//! One attempt on a task of its own: its context and span made from the task,
//! the wait for its type's permit, the handler run with its panics caught, and
//! its outcome cut to what the server takes before it is reported.

use std::sync::Arc;

use spool_proto::{
    duration,
    v1::{self, activity_result},
};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::{
    ActivityContext, ActivityError, ActivityInfo, Handler, HandlerResult, Payload,
    context::{Cancel, system_time},
    telemetry::{Ended, TypeMetrics},
};

/// What every attempt of one activity type shares, looked up at a session's first
/// task of the type rather than at every task.
pub(super) struct OfType {
    /// `None`: this worker has no handler for the type.
    pub(super) handler: Option<Handler>,
    /// The type's own concurrency limit, if it has one.
    pub(super) limit: Option<Arc<Semaphore>>,
    pub(super) metrics: TypeMetrics,
}

/// What an attempt's future holds of its task. The future is allocated and moved
/// once per activity, so it keeps only what it needs, not the whole task.
pub(super) struct Attempt {
    ctx: ActivityContext,
    /// The activity's info, shared with the context: the result's ids are moved
    /// out of it once the handler has let its context go (copied if it kept it).
    info: Arc<ActivityInfo>,
    input: Payload,
    /// The context's cancellation, watched while the attempt waits for a permit.
    cancelled: CancellationToken,
    span: tracing::Span,
}

impl Attempt {
    pub(super) fn new(
        task: v1::ActivityTask,
        cancel: Arc<Cancel>,
        heartbeats: mpsc::Sender<v1::Heartbeat>,
    ) -> Self {
        let info = Arc::new(ActivityInfo {
            namespace: task.namespace,
            workflow_id: task.workflow_id,
            activity_id: task.activity_id,
            activity_type: task.activity_type,
            attempt: task.attempt,
            max_attempts: task.max_attempts,
            counted_attempts: task.counted_attempts,
            scheduled_at: task.scheduled_at.as_ref().and_then(system_time),
            started_at: task.started_at.as_ref().and_then(system_time),
            deadline: task.deadline.as_ref().and_then(system_time),
            heartbeat_timeout: duration::from_proto(task.heartbeat_timeout.as_ref())
                .ok()
                .flatten(),
            headers: task.headers.into_iter().collect(),
        });
        // One span per attempt: what the handler logs carries the activity's
        // identity and its trace.
        let span = tracing::info_span!(
            "activity",
            namespace = %info.namespace,
            workflow_id = %info.workflow_id,
            activity_id = %info.activity_id,
            activity_type = %info.activity_type,
            attempt = info.attempt,
            trace_id = %info.trace_id().unwrap_or_default(),
        );
        spool_proto::trace::join_trace(&span, &info.headers);
        let cancelled = cancel.token.clone();
        let ctx = ActivityContext::new(
            info.clone(),
            cancel,
            task.last_heartbeat_details,
            heartbeats,
        );
        Self {
            ctx,
            info,
            input: task.input.unwrap_or_default(),
            cancelled,
            span,
        }
    }

    /// Runs the type's handler once its limit, if it has one, gives a permit, and
    /// reports the result on `results`.
    // A block rather than an `async fn`, and fields used in place rather than
    // destructured: either would keep a second copy of them in the future, which
    // is allocated once per activity.
    #[expect(
        clippy::manual_async_fn,
        reason = "an async fn's future stores its arguments twice"
    )]
    pub(super) fn run(
        self,
        of: Arc<OfType>,
        results: mpsc::Sender<v1::ActivityResult>,
        max_payload: usize,
    ) -> impl Future<Output = ()> + Send + 'static {
        async move {
            let permit = permit(of.limit.clone(), &self.cancelled).await;
            let started = permit.is_ok();
            if started {
                of.metrics.handler_started(self.ctx.info().scheduled_at);
            }
            let began = std::time::Instant::now();
            let outcome = match (permit, &of.handler) {
                (Err(()), _) => Err(ActivityError::retryable(
                    "Cancelled",
                    format!(
                        "cancelled before it started, while it waited for a handler of \
                         {:?} to end (type_concurrency): {:?}",
                        self.ctx.info().activity_type,
                        self.ctx.cancel_reason()
                    ),
                )),
                (Ok(_permit), Some(handler)) => {
                    call(handler, self.ctx, self.input, &self.span).await
                }
                (Ok(_), None) => Err(ActivityError::retryable(
                    "NoHandler",
                    format!(
                        "this worker has no handler for {:?}",
                        self.ctx.info().activity_type
                    ),
                )),
            };
            let outcome = as_sent(outcome, max_payload);
            if let activity_result::Outcome::Error(e) = &outcome {
                self.span
                    .in_scope(|| tracing::info!(error_type = %e.r#type, "attempt failed"));
            }
            if started {
                of.metrics
                    .handler_ended(ended_as(&outcome, &self.cancelled), began.elapsed());
            }
            // A reserved slot, then the result: `send` would hold the result inside
            // its own future, beside the outcome already held here.
            if let Ok(slot) = results.reserve().await {
                let attempt = self.info.attempt;
                let (workflow_id, activity_id) = match Arc::try_unwrap(self.info) {
                    Ok(info) => (info.workflow_id, info.activity_id),
                    Err(info) => (info.workflow_id.clone(), info.activity_id.clone()),
                };
                slot.send(v1::ActivityResult {
                    workflow_id,
                    activity_id,
                    attempt,
                    outcome: Some(outcome),
                });
            }
        }
    }
}

/// The permit of a type with its own concurrency limit (`None`: it has none), or
/// `Err` when the attempt is cancelled first: the server holds its slot until it
/// is answered, which waiting for the permit would put off until a running
/// handler of its type ends.
async fn permit(
    limit: Option<Arc<Semaphore>>,
    cancelled: &CancellationToken,
) -> Result<Option<OwnedSemaphorePermit>, ()> {
    match limit {
        Some(limit) => tokio::select! {
            biased;
            permit = limit.acquire_owned() => Ok(permit.ok()),
            () = cancelled.cancelled() => Err(()),
        },
        None => Ok(None),
    }
}

/// The handler's result; a panicking handler still yields one, whether it
/// panics when called or when its future is polled.
async fn call(
    handler: &Handler,
    ctx: ActivityContext,
    input: Payload,
    span: &tracing::Span,
) -> HandlerResult {
    match unwind::call(|| handler(ctx, input)) {
        Ok(running) => unwind::Caught(running.instrument(span.clone()))
            .await
            .unwrap_or_else(|panic| Err(unwind::error(panic))),
        Err(panic) => Err(unwind::error(panic)),
    }
}

/// The outcome as the server takes it: an output over its payload limit is
/// replaced by a terminal error, an error is cut to what it keeps.
fn as_sent(outcome: HandlerResult, max_payload: usize) -> activity_result::Outcome {
    match outcome {
        Ok(output) if too_large(output.data.len(), max_payload) => ActivityError::terminal(
            "PayloadTooLarge",
            format!(
                "the output is {} bytes, over the server's limit of {max_payload} bytes \
                 (--max-payload-bytes); it was not sent",
                output.data.len()
            ),
        )
        .into_outcome(),
        Ok(output) => activity_result::Outcome::Output(output),
        Err(e) => within_limit(e.into_outcome(), max_payload),
    }
}

/// How a handler that started ended, as its metrics count it.
fn ended_as(outcome: &activity_result::Outcome, cancelled: &CancellationToken) -> Ended {
    match outcome {
        activity_result::Outcome::Output(_) => Ended::Completed,
        _ if cancelled.is_cancelled() => Ended::Cancelled,
        _ => Ended::Failed,
    }
}

/// A handler's panic caught where it happens, in this task: a task of its own
/// per attempt would cost a second allocation and wake-up for every activity.
mod unwind {
    use std::{
        any::Any,
        future::Future,
        panic::{AssertUnwindSafe, catch_unwind},
        pin::Pin,
        task::{Context, Poll},
    };

    use crate::ActivityError;

    type Panic = Box<dyn Any + Send>;

    /// Calls `f`, catching a panic.
    pub(super) fn call<T>(f: impl FnOnce() -> T) -> Result<T, Panic> {
        // Nothing `f` touches is looked at again after a panic: the attempt ends
        // with the panic as its error.
        catch_unwind(AssertUnwindSafe(f))
    }

    /// A future whose panic, when polled, becomes its output.
    pub(super) struct Caught<F>(pub(super) F);

    impl<F: Future + Unpin> Future for Caught<F> {
        type Output = Result<F::Output, Panic>;

        fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
            match call(|| Pin::new(&mut self.0).poll(cx)) {
                Ok(Poll::Ready(output)) => Poll::Ready(Ok(output)),
                Ok(Poll::Pending) => Poll::Pending,
                Err(panic) => Poll::Ready(Err(panic)),
            }
        }
    }

    /// The retryable error an attempt whose handler panicked ends with.
    pub(super) fn error(panic: Panic) -> ActivityError {
        let message = panic
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a panic without a message".to_owned());
        ActivityError::retryable("Panic", format!("the handler panicked: {message}"))
    }
}

/// Whether `bytes` is over the server's payload limit (0: unknown, nothing is).
pub(super) fn too_large(bytes: usize, limit: usize) -> bool {
    limit > 0 && bytes > limit
}

/// What the server keeps of an error's type and message (longer ones it cuts).
/// Cut here too: a message over the transport's limit (16 MiB at least) would
/// fail the stream it is sent on, and every stream it is sent again on.
const ERROR_TYPE_BYTES: usize = 255;
const ERROR_MESSAGE_BYTES: usize = 32 * 1024;

/// `text` cut to at most `max` bytes, on a character boundary.
fn cut(text: &mut String, max: usize) {
    if text.len() > max {
        let mut end = max;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
}

/// An error's type and message cut to what the server keeps, and its details
/// dropped, and said so, when over the server's payload limit.
fn within_limit(outcome: activity_result::Outcome, limit: usize) -> activity_result::Outcome {
    match outcome {
        activity_result::Outcome::Error(mut e) => {
            cut(&mut e.r#type, ERROR_TYPE_BYTES);
            cut(&mut e.message, ERROR_MESSAGE_BYTES);
            if e.details
                .as_ref()
                .is_some_and(|d| too_large(d.data.len(), limit))
            {
                e.details = None;
                e.message.push_str(
                    " (its details were over the server's payload limit and were left out)",
                );
            }
            activity_result::Outcome::Error(e)
        }
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An error's type and message are cut to what the server keeps, on a
    /// character boundary: a message over the transport's limit would fail every
    /// stream the result is sent on.
    #[test]
    fn an_errors_type_and_message_are_cut_to_what_the_server_keeps() {
        let error = |r#type: String, message: String| {
            activity_result::Outcome::Error(v1::ActivityError {
                r#type,
                message,
                ..Default::default()
            })
        };
        let huge = "é".repeat(10 * 1024 * 1024);
        match within_limit(error("T".repeat(300), huge), 0) {
            activity_result::Outcome::Error(e) => {
                assert_eq!(e.r#type.len(), ERROR_TYPE_BYTES);
                assert!(
                    e.message.len() <= ERROR_MESSAGE_BYTES
                        && e.message.len() > ERROR_MESSAGE_BYTES - 2,
                    "{}",
                    e.message.len()
                );
                assert!(e.message.chars().all(|c| c == 'é'));
            }
            other => panic!("{other:?}"),
        }
        match within_limit(error("T".into(), "short".into()), 0) {
            activity_result::Outcome::Error(e) => {
                assert_eq!((e.r#type.as_str(), e.message.as_str()), ("T", "short"))
            }
            other => panic!("{other:?}"),
        }
    }
}
