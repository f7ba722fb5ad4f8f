//! Testing handlers without a server: [`ActivityEnvironment`] runs one with a
//! context you set up (which attempt, what an earlier attempt reported), lets the
//! test cancel it, and records the heartbeats it sent.
//!
//! ```
//! use spool_worker::{Activity, ActivityError, testing::ActivityEnvironment};
//!
//! struct Double;
//! impl Activity for Double {
//!     const NAME: &'static str = "double";
//!     type Input = u32;
//!     type Output = u32;
//! }
//!
//! # tokio_test_block(async {
//! let mut env = ActivityEnvironment::new().attempt(2, 3);
//! let out = env
//!     .run::<Double, _, _>(
//!         |ctx, n| async move {
//!             ctx.heartbeat_with(&n).ok();
//!             Ok::<_, ActivityError>(n * 2)
//!         },
//!         21,
//!     )
//!     .await;
//! assert_eq!(out.ok(), Some(42));
//! assert_eq!(env.heartbeats().len(), 1);
//! # });
//! # fn tokio_test_block(f: impl std::future::Future<Output = ()>) {
//! #     tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(f)
//! # }
//! ```

use std::{future::Future, sync::Arc, time::SystemTime};

use spool_proto::v1::{self, Payload};
use tokio::sync::mpsc;

use crate::{
    Activity, ActivityContext, ActivityError, ActivityInfo, CancelReason, context::Cancel,
};

/// A fake attempt to run handlers in.
pub struct ActivityEnvironment {
    info: ActivityInfo,
    last_heartbeat: Option<Payload>,
    cancel: Arc<Cancel>,
    heartbeats: (mpsc::Sender<v1::Heartbeat>, mpsc::Receiver<v1::Heartbeat>),
}

impl Default for ActivityEnvironment {
    fn default() -> Self {
        Self::new()
    }
}

impl ActivityEnvironment {
    /// The first attempt of an activity `test-workflow/test-activity` in the default
    /// namespace, with a budget of 10 attempts, started now.
    pub fn new() -> Self {
        Self {
            info: ActivityInfo {
                namespace: spool_proto::DEFAULT_NAMESPACE.to_owned(),
                workflow_id: "test-workflow".to_owned(),
                activity_id: "test-activity".to_owned(),
                activity_type: String::new(),
                attempt: 1,
                max_attempts: 10,
                counted_attempts: 0,
                scheduled_at: Some(SystemTime::now()),
                started_at: Some(SystemTime::now()),
                deadline: None,
                heartbeat_timeout: None,
                headers: Default::default(),
            },
            last_heartbeat: None,
            cancel: Arc::default(),
            heartbeats: mpsc::channel(4096),
        }
    }

    /// Attempt `attempt` of a budget of `max_attempts`, the earlier ones all counted.
    pub fn attempt(mut self, attempt: u32, max_attempts: u32) -> Self {
        self.info.attempt = attempt;
        self.info.max_attempts = max_attempts;
        self.info.counted_attempts = attempt.saturating_sub(1);
        self
    }

    /// Changes any part of what the handler sees in [`ActivityContext::info`].
    pub fn info(mut self, change: impl FnOnce(&mut ActivityInfo)) -> Self {
        change(&mut self.info);
        self
    }

    /// What an earlier attempt last reported ([`ActivityContext::last_heartbeat_details`]).
    pub fn last_heartbeat_details(mut self, details: Payload) -> Self {
        self.last_heartbeat = Some(details);
        self
    }

    /// A context for this attempt, for handlers called directly.
    pub fn context(&self) -> ActivityContext {
        ActivityContext::new(
            Arc::new(self.info.clone()),
            self.cancel.clone(),
            self.last_heartbeat.clone(),
            self.heartbeats.0.clone(),
        )
    }

    /// Asks the attempt to stop, as the server would (the handler sees `reason`).
    pub fn cancel(&self, reason: CancelReason) {
        self.cancel.cancel(reason);
    }

    /// The heartbeat details sent since the last call, oldest first.
    pub fn heartbeats(&mut self) -> Vec<Option<Payload>> {
        let mut sent = Vec::new();
        while let Ok(beat) = self.heartbeats.1.try_recv() {
            sent.push(beat.details);
        }
        sent
    }

    /// Runs a typed handler for `A` with `input`, as the worker would (its output
    /// must encode, as it must to be sent).
    pub async fn run<A, F, Fut>(
        &self,
        handler: F,
        input: A::Input,
    ) -> Result<A::Output, ActivityError>
    where
        A: Activity,
        F: FnOnce(ActivityContext, A::Input) -> Fut,
        Fut: Future<Output = Result<A::Output, ActivityError>>,
    {
        let output = handler(self.context(), input).await?;
        crate::json(&output)?;
        Ok(output)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    spool_proto::activity_type!(Count = "count", u32 => u32);
    /// A handler resumes from what the last attempt reported, heartbeats as it goes,
    /// and stops on a cancel with its reason.
    #[tokio::test]
    async fn a_handler_resumes_reports_and_stops_on_cancel() {
        let mut env = ActivityEnvironment::new()
            .attempt(3, 3)
            .last_heartbeat_details(spool_proto::activity::encode(&5u32).unwrap_or_default());
        let ctx = env.context();
        assert!(ctx.info().is_last_attempt());
        env.cancel(CancelReason::Requested("enough".into()));
        let out = env
            .run::<Count, _, _>(
                |ctx, to| async move {
                    let mut at: u32 = ctx.last_heartbeat()?.unwrap_or(0);
                    while at < to {
                        if ctx.is_cancelled() {
                            return Err(ActivityError::retryable(
                                "Cancelled",
                                format!("{:?}", ctx.cancel_reason()),
                            ));
                        }
                        at += 1;
                        ctx.heartbeat_with(&at)?;
                    }
                    Ok(at)
                },
                10,
            )
            .await;
        match out {
            Err(ActivityError::Retryable { message, .. }) => {
                assert!(message.contains("enough"), "{message}")
            }
            other => panic!("expected the cancel, got {other:?}"),
        }
        assert!(
            env.heartbeats().is_empty(),
            "cancelled before the first step"
        );
        let mut fresh = ActivityEnvironment::new();
        let out = fresh
            .run::<Count, _, _>(
                |ctx, to| async move {
                    for at in 1..=to {
                        ctx.heartbeat_with(&at)?;
                    }
                    Ok(to)
                },
                3,
            )
            .await;
        assert_eq!(out.ok(), Some(3));
        assert_eq!(fresh.heartbeats().len(), 3);
    }
}
