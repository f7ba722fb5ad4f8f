//! The typed layer over the untyped calls: [`Client::activity`] starts a
//! [`Submit`] of an [`Activity`], whose [`Handle`] waits for its decoded output.

use std::{marker::PhantomData, time::Duration};

use spool_proto::{activity::Activity, duration, v1};

use crate::{Client, Error};

impl Client {
    /// Submits one activity of `A` per input, all or nothing, in one commit (new
    /// ids, the server's defaults); a handle for each, in order.
    pub async fn submit_all<A: Activity>(
        &self,
        inputs: &[A::Input],
    ) -> Result<Vec<Handle<A>>, Error> {
        let activities = inputs
            .iter()
            .map(|input| {
                Ok(v1::SubmitRequest {
                    activity_type: A::NAME.to_owned(),
                    input: Some(encode::<A>(input)?),
                    headers: [(TRACEPARENT.to_owned(), caller_traceparent())].into(),
                    ..Default::default()
                })
            })
            .collect::<Result<Vec<_>, Error>>()?;
        let response = self
            .submit_batch(v1::SubmitBatchRequest { activities })
            .await?;
        Ok(response
            .results
            .into_iter()
            .map(|r| Handle::submitted(self.clone(), r.activity, r.created))
            .collect())
    }

    /// A submit of the typed activity `A` with `input`, to set options on and send:
    /// `client.activity::<Greet>(&input)?.workflow_id("order-7").execute().await`.
    pub fn activity<A: Activity>(&self, input: &A::Input) -> Result<Submit<'_, A>, Error> {
        Ok(Submit {
            client: self,
            request: v1::SubmitRequest {
                activity_type: A::NAME.to_owned(),
                input: Some(encode::<A>(input)?),
                ..Default::default()
            },
            activity: PhantomData,
        })
    }
}

fn encode<A: Activity>(input: &A::Input) -> Result<v1::Payload, Error> {
    spool_proto::activity::encode(input).map_err(|e| Error::Encode {
        activity: A::NAME,
        reason: e.to_string(),
    })
}

/// A typed submit being described; [`Submit::send`] or [`Submit::execute`] sends it.
/// Every option of `SubmitRequest` has a setter; unset ones take the server's
/// defaults.
#[must_use = "a submit does nothing until sent"]
pub struct Submit<'c, A> {
    client: &'c Client,
    request: v1::SubmitRequest,
    activity: PhantomData<fn() -> A>,
}

impl<A: Activity> Submit<'_, A> {
    /// The workflow id (default: a new UUIDv7). With the activity id, the key that
    /// makes a submit idempotent.
    pub fn workflow_id(mut self, id: impl Into<String>) -> Self {
        self.request.workflow_id = id.into();
        self
    }

    /// The activity id within its workflow (default: a new UUIDv7).
    pub fn activity_id(mut self, id: impl Into<String>) -> Self {
        self.request.activity_id = id.into();
        self
    }

    /// The namespace (default: `default`).
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.request.namespace = namespace.into();
        self
    }

    /// Run no earlier than `delay` from now.
    pub fn delay(mut self, delay: Duration) -> Self {
        self.request.delay = Some(duration::to_proto(delay));
        self
    }

    /// The whole retry policy.
    pub fn retry_policy(mut self, policy: v1::RetryPolicy) -> Self {
        self.request.retry_policy = Some(policy);
        self
    }

    /// Attempts before the activity is FAILED for good (the rest of the retry
    /// policy as set, or the server's).
    pub fn max_attempts(mut self, n: u32) -> Self {
        self.request
            .retry_policy
            .get_or_insert_with(Default::default)
            .max_attempts = n;
        self
    }

    /// An attempt silent (no heartbeat) this long fails and is retried.
    pub fn heartbeat_timeout(mut self, timeout: Duration) -> Self {
        self.request.heartbeat_timeout = Some(duration::to_proto(timeout));
        self
    }

    /// Each attempt must finish this long after it starts.
    pub fn start_to_close_timeout(mut self, timeout: Duration) -> Self {
        self.request.start_to_close_timeout = Some(duration::to_proto(timeout));
        self
    }

    /// The whole activity, all attempts, must finish this long after submission.
    pub fn schedule_to_close_timeout(mut self, timeout: Duration) -> Self {
        self.request.schedule_to_close_timeout = Some(duration::to_proto(timeout));
        self
    }

    /// Higher runs first among due activities of its type.
    pub fn priority(mut self, priority: i32) -> Self {
        self.request.priority = priority;
        self
    }

    /// At most the type's concurrency limit of the activities sharing this key run
    /// at once, over all workers and nodes (a customer id, say).
    pub fn concurrency_key(mut self, key: impl Into<String>) -> Self {
        self.request.concurrency_key = key.into();
        self
    }

    /// Activities of the type are served fairly over these keys (a tenant, say):
    /// one key's backlog does not delay another key's activities.
    pub fn fairness_key(mut self, key: impl Into<String>) -> Self {
        self.request.fairness_key = key.into();
        self
    }

    /// This activity's weight within its fairness key, 1 to 1,000 (default 1): a
    /// key whose activities weigh 3 is served three times as often as one whose
    /// activities weigh 1.
    pub fn fairness_weight(mut self, weight: u32) -> Self {
        self.request.fairness_weight = weight;
        self
    }

    /// A header stored with the activity and delivered to every attempt (keys:
    /// lowercase ASCII letters, digits, `-`, `_`, `.`).
    pub fn header(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.request.headers.insert(key.into(), value.into());
        self
    }

    /// The W3C trace context to run the activity in (its `traceparent` header), to
    /// continue the caller's trace. Without it, `send` continues the current span's
    /// trace (with the `otel` feature) or starts a new one.
    pub fn traceparent(self, traceparent: impl Into<String>) -> Self {
        self.header(TRACEPARENT, traceparent)
    }

    /// Submits it; the handle waits for, inspects and manages it.
    pub async fn send(mut self) -> Result<Handle<A>, Error> {
        self.request
            .headers
            .entry(TRACEPARENT.to_owned())
            .or_insert_with(caller_traceparent);
        let response = self.client.submit(self.request).await?;
        Ok(Handle::submitted(
            self.client.clone(),
            response.activity,
            response.created,
        ))
    }

    /// Submits it and waits for its output.
    pub async fn execute(self) -> Result<A::Output, Error> {
        self.send().await?.wait().await
    }
}

/// A submitted typed activity.
pub struct Handle<A> {
    client: Client,
    key: v1::ActivityKey,
    created: bool,
    activity: PhantomData<fn() -> A>,
}

// By hand: derived impls would ask `A`, a marker type, to be `Clone` and `Debug`.
impl<A> Clone for Handle<A> {
    fn clone(&self) -> Self {
        Self {
            client: self.client.clone(),
            key: self.key.clone(),
            created: self.created,
            activity: PhantomData,
        }
    }
}

impl<A: Activity> std::fmt::Debug for Handle<A> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Handle")
            .field("activity_type", &A::NAME)
            .field("key", &self.key)
            .field("created", &self.created)
            .finish()
    }
}

impl<A> Handle<A> {
    /// The handle of the activity a submit answered.
    fn submitted(client: Client, activity: Option<v1::Activity>, created: bool) -> Self {
        Self {
            client,
            key: activity.and_then(|a| a.key).unwrap_or_default(),
            created,
            activity: PhantomData,
        }
    }
}

impl<A: Activity> Handle<A> {
    /// Its key.
    pub fn key(&self) -> &v1::ActivityKey {
        &self.key
    }

    /// False when the key existed already (the submit changed nothing).
    pub fn created(&self) -> bool {
        self.created
    }

    /// Waits until it is finished: its output if it COMPLETED, otherwise
    /// [`Error::NotCompleted`] with the activity as it ended.
    pub async fn wait(&self) -> Result<A::Output, Error> {
        let activity = self.client.wait(self.key.clone(), None).await?;
        if activity.status != v1::ActivityStatus::Completed as i32 {
            return Err(Error::NotCompleted {
                activity: Box::new(activity),
            });
        }
        spool_proto::activity::decode(&activity.output.unwrap_or_default()).map_err(|e| {
            Error::Decode {
                activity: A::NAME,
                expected: std::any::type_name::<A::Output>(),
                reason: e.to_string(),
            }
        })
    }

    /// It now.
    pub async fn get(&self) -> Result<v1::Activity, Error> {
        self.client.get(self.key.clone()).await
    }

    /// Cancels it (SCHEDULED or RUNNING), saying why.
    pub async fn cancel(&self, reason: impl Into<String>) -> Result<v1::Activity, Error> {
        self.client.cancel(self.key.clone(), reason).await
    }

    /// Runs it again (FAILED or CANCELLED) with a fresh attempt budget.
    pub async fn retry(&self) -> Result<v1::Activity, Error> {
        self.client.retry(self.key.clone()).await
    }
}

/// The W3C trace context header.
pub const TRACEPARENT: &str = "traceparent";

/// A new W3C `traceparent`: version 00, a random trace id and parent id, sampled.
pub fn new_traceparent() -> String {
    let trace_id = uuid::Uuid::new_v4().simple().to_string();
    let parent_id = &uuid::Uuid::new_v4().simple().to_string()[..16];
    format!("00-{trace_id}-{parent_id}-01")
}

/// The trace a submit runs in when the caller names none: the current span's, when
/// it is in an OpenTelemetry trace (the `otel` feature); otherwise a new one.
fn caller_traceparent() -> String {
    spool_proto::trace::current_traceparent().unwrap_or_else(new_traceparent)
}
