//! A store wrapped in hooks, for tests that inject faults: every [`Store`] method
//! is the inner store's, but for the hooks a [`Layer`] sets. A wrapper writes only
//! its faults, and a method added to [`Store`] reaches every wrapper from here.
//!
//! Invariant: a hook that errs before a write leaves the inner store untouched;
//! one that errs after a write reports a batch failed that was written (a lost
//! reply), which is the only way a layer can lie.

use std::sync::Arc;

use spool_proto::time::UnixMillis;
use tokio::sync::mpsc;

use super::{
    ActivityRow, AttemptRecord, DueTimes, Error, Event, Key, ListPage, ListQuery, Op, Outcome,
    Reads, Remote, RunningPage, SessionTicket, StatusCounts, Store, TakeSession, TypeCounts,
    concurrency::ConcurrencyLimit, fairness::FairnessWeightUse, rate::RateLimitUse,
};

/// The hooks of a wrapped store. Each defaults to the inner store's behaviour.
#[async_trait::async_trait]
pub trait Layer: Send + Sync + 'static {
    /// The store every call goes on to.
    fn inner(&self) -> &dyn Store;

    /// Runs before a batch is written; an error fails the batch unwritten.
    async fn before_apply(&self, ops: &[Op]) -> Result<(), Error> {
        let _ = ops;
        Ok(())
    }

    /// Runs after a batch was written; an error reports it failed all the same.
    async fn after_apply(&self, ops: &[Op]) -> Result<(), Error> {
        let _ = ops;
        Ok(())
    }

    /// Runs before a read of one row; an error fails the read.
    async fn before_get(&self) -> Result<(), Error> {
        Ok(())
    }

    /// Runs before the committer's read of due times.
    fn before_due_times(&self) {}

    /// Runs before a session's ticket is saved.
    async fn before_save_ticket(&self) {}

    fn single_node(&self) -> bool {
        self.inner().single_node()
    }

    fn writers(&self) -> usize {
        self.inner().writers()
    }

    fn beside_min_rows(&self) -> usize {
        self.inner().beside_min_rows()
    }

    async fn subscribe(&self) -> Result<Option<mpsc::Receiver<Remote>>, Error> {
        self.inner().subscribe().await
    }
}

#[async_trait::async_trait]
impl<L: Layer> Reads for L {
    async fn get(&self, key: &Key) -> Result<Option<ActivityRow>, Error> {
        self.before_get().await?;
        self.inner().get(key).await
    }
    async fn list(&self, query: &ListQuery) -> Result<ListPage, Error> {
        self.inner().list(query).await
    }
    async fn stats(&self, namespace: &str) -> Result<StatusCounts, Error> {
        self.inner().stats(namespace).await
    }
    async fn history(&self, id: i64) -> Result<Vec<AttemptRecord>, Error> {
        self.inner().history(id).await
    }
    async fn type_counts(&self, now: UnixMillis) -> Result<Vec<TypeCounts>, Error> {
        self.inner().type_counts(now).await
    }
    async fn running(&self, after_id: i64, limit: u32) -> Result<RunningPage, Error> {
        self.inner().running(after_id, limit).await
    }
    async fn expired_leases(&self, now: UnixMillis, limit: u32) -> Result<Vec<ActivityRow>, Error> {
        self.inner().expired_leases(now, limit).await
    }
    async fn due_times(&self, after: UnixMillis, limit: u32) -> Result<DueTimes, Error> {
        self.before_due_times();
        self.inner().due_times(after, limit).await
    }
    async fn rate_limits(
        &self,
        namespace: Option<&str>,
        now: UnixMillis,
    ) -> Result<Vec<RateLimitUse>, Error> {
        self.inner().rate_limits(namespace, now).await
    }
    async fn concurrency_limits(
        &self,
        namespace: Option<&str>,
    ) -> Result<Vec<ConcurrencyLimit>, Error> {
        self.inner().concurrency_limits(namespace).await
    }
    async fn fairness_weights(
        &self,
        namespace: Option<&str>,
    ) -> Result<Vec<FairnessWeightUse>, Error> {
        self.inner().fairness_weights(namespace).await
    }
    async fn concurrency_key(
        &self,
        namespace: &str,
        activity_type: &str,
        key: &str,
    ) -> Result<Option<(u64, u64)>, Error> {
        self.inner()
            .concurrency_key(namespace, activity_type, key)
            .await
    }
}

#[async_trait::async_trait]
impl<L: Layer> Store for L {
    async fn apply(&self, ops: Arc<[Op]>, now: UnixMillis) -> Result<Vec<Outcome>, Error> {
        self.before_apply(&ops).await?;
        let outcomes = self.inner().apply(ops.clone(), now).await?;
        self.after_apply(&ops).await?;
        Ok(outcomes)
    }
    async fn set_priority_aging(
        &self,
        per_level: Option<std::time::Duration>,
    ) -> Result<bool, Error> {
        self.inner().set_priority_aging(per_level).await
    }
    fn now(&self) -> UnixMillis {
        self.inner().now()
    }
    fn single_node(&self) -> bool {
        Layer::single_node(self)
    }
    fn others_staying(&self) -> bool {
        self.inner().others_staying()
    }
    async fn set_draining(&self, draining: bool) {
        self.inner().set_draining(draining).await
    }
    fn writers(&self) -> usize {
        Layer::writers(self)
    }
    fn beside_min_rows(&self) -> usize {
        Layer::beside_min_rows(self)
    }
    async fn publish(&self, events: Vec<Event>) -> Result<(), Error> {
        self.inner().publish(events).await
    }
    async fn save_ticket(&self, ticket: &SessionTicket) -> Result<(), Error> {
        self.before_save_ticket().await;
        self.inner().save_ticket(ticket).await
    }
    async fn take_session(&self, take: &TakeSession) -> Result<Option<Vec<ActivityRow>>, Error> {
        self.inner().take_session(take).await
    }
    async fn subscribe(&self) -> Result<Option<mpsc::Receiver<Remote>>, Error> {
        Layer::subscribe(self).await
    }
}
