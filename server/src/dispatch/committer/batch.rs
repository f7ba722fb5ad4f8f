//! One batch's way through the store: formed, sent (alone, or beside the one in
//! flight), landed in the order batches formed, and, when the store failed it,
//! retried request by request so one bad request cannot fail its neighbours.

use super::*;

impl Loop {
    /// Writes `ops` (the requests' ops, then the loop's own from `first_claim` on:
    /// carried releases precede requests, claims come last), applies effects, answers.
    pub(super) async fn write(
        &mut self,
        ops: Vec<Op>,
        requests: Vec<Request>,
        first_claim: usize,
        now: UnixMillis,
    ) {
        let (batch, fenced) = self.batch(ops, requests, first_claim, now).await;
        let applied = self.store.apply(fenced, now).await;
        self.landed(batch, applied).await;
    }

    /// [`Loop::write`], but only sent: the store writes it on a task of its own
    /// while the loop goes on; `beside` says whether the next may go beside it.
    pub(super) async fn launch(
        &mut self,
        ops: Vec<Op>,
        requests: Vec<Request>,
        first_claim: usize,
        now: UnixMillis,
        beside: bool,
    ) -> Flight {
        let (batch, fenced) = self.batch(ops, requests, first_claim, now).await;
        let store = self.store.clone();
        Flight {
            batch,
            applied: tokio::spawn(async move { store.apply(fenced, now).await }),
            beside,
        }
    }

    /// `ops` as a batch, and as the store is to write them.
    pub(super) async fn batch(
        &mut self,
        ops: Vec<Op>,
        requests: Vec<Request>,
        first_claim: usize,
        now: UnixMillis,
    ) -> (Batch, Arc<[Op]>) {
        tracing::trace!(
            ops = ops.len(),
            requests = requests.len(),
            claims = ops.len() - first_claim,
            "batch"
        );

        let ops: Arc<[Op]> = ops.into();
        let fenced = crate::breakage::unfence(&*self.store, ops.clone()).await;
        let batch = Batch {
            ops,
            requests,
            first_claim,
            now,
            started: std::time::Instant::now(),
            overtaken: false,
        };
        (batch, fenced)
    }

    /// Waits for the batch in flight, if there is one, and lands it.
    pub(super) async fn land(&mut self) {
        if self.flight.is_some() {
            let applied = landing(&mut self.flight).await;
            if let Some(landed) = self.flight.take() {
                self.landed(landed.batch, applied).await;
            }
        }
    }

    /// Applies the effects of a batch the store has written and answers its
    /// requests; a batch that failed is retried request by request.
    pub(super) async fn landed(
        &mut self,
        batch: Batch,
        applied: Result<Vec<Outcome>, store::Error>,
    ) {
        let Batch {
            ops,
            requests,
            first_claim,
            now,
            started,
            overtaken,
        } = batch;
        if overtaken {
            // A claim sent after this batch ran beside it, before its submits
            // committed, and may come back short for want of them, with the due
            // mark they set taken: marked again, so that claim cannot leave their
            // group idle with rows due (`Registry::assign`).
            mark_submits_due(&self.registry, &ops, now);
        }
        let took = started.elapsed();
        crate::metrics::commit(ops.len(), took.as_secs_f64(), applied.is_ok());
        tracing::trace!(micros = took.as_micros() as u64, "applied");
        match applied {
            Ok(mut outcomes) => {
                self.failure_pause = FIRST_FAILURE_PAUSE;
                self.apply_effects(&ops, &mut outcomes, now);
                answer(requests, outcomes);
            }
            Err(e) => {
                tracing::warn!(error = %e, ops = ops.len(), "batch failed; retrying its requests one by one");
                self.retry_alone(&ops, requests, first_claim, now).await;
                return;
            }
        }
        self.publish_outgoing();
    }

    /// Writes `mine` in a transaction of its own, and sets off what it did.
    async fn apply_alone(
        &mut self,
        mine: &[Op],
        now: UnixMillis,
    ) -> Result<Vec<Outcome>, store::Error> {
        let ops = crate::breakage::unfence(&*self.store, Arc::from(mine)).await;
        let mut outcomes = self.store.apply(ops, now).await?;
        self.apply_effects(mine, &mut outcomes, now);
        Ok(outcomes)
    }

    /// A failed batch, retried request by request so one bad request cannot fail
    /// its neighbours; its claims are planned again and committed on their own,
    /// so dispatch does not wait on it. Pauses only when nothing commits at all.
    async fn retry_alone(
        &mut self,
        ops: &[Op],
        requests: Vec<Request>,
        first_claim: usize,
        now: UnixMillis,
    ) {
        for claim in store::claims(&ops[first_claim..]) {
            self.registry.unreserve(claim);
        }
        // Whether any retry below commits: if one does, the store works and
        // the failure was one request's own; no pause is due.
        let mut committed = false;
        // Ops outside any request (carried releases) are retried on their own.
        let owned_end = requests.first().map_or(first_claim, |r| r.range.start);
        if owned_end > 0 {
            match self.apply_alone(&ops[..owned_end], now).await {
                Ok(_) => committed = true,
                Err(e) => {
                    tracing::error!(error = %e, "cannot release rows; they stay RUNNING until reclaimed")
                }
            }
        }
        for request in requests {
            let result = match self.apply_alone(&ops[request.range.clone()], now).await {
                Ok(outcomes) => {
                    committed = true;
                    Ok(outcomes)
                }
                Err(e) => {
                    tracing::warn!(error = %e, "request failed");
                    Err(CommitError::Store {
                        why: Arc::new(e),
                        ops: ops[request.range.clone()].to_vec(),
                    })
                }
            };
            if let Some(reply) = request.reply {
                reply(result);
            }
        }
        // Dispatch must not wait on a neighbour's failure: the claims are
        // planned again and committed on their own.
        if first_claim < ops.len() {
            let claims: Vec<Op> = self
                .registry
                .plan_claims(now.saturating_add(self.lease_ms), &[])
                .into_iter()
                .map(Op::Claim)
                .collect();
            if !claims.is_empty() {
                self.claimed_alone = true;
                match self.store.apply(Arc::from(claims.as_slice()), now).await {
                    Ok(mut outcomes) => {
                        committed = true;
                        self.apply_effects(&claims, &mut outcomes, now);
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "claims failed");
                        for claim in store::claims(&claims) {
                            self.registry.unreserve(claim);
                        }
                    }
                }
            }
        }
        self.publish_outgoing();
        if committed {
            self.failure_pause = FIRST_FAILURE_PAUSE;
        } else {
            // Nothing commits: the store itself is failing. Pause (doubling,
            // up to 2 s) so a broken disk does not turn the loop into a spin.
            tokio::time::sleep(self.failure_pause).await;
            self.failure_pause = (self.failure_pause * 2).min(Duration::from_secs(2));
        }
    }
}

/// A batch sent to the store and not yet landed.
pub(super) struct Flight {
    pub(super) batch: Batch,
    pub(super) applied: tokio::task::JoinHandle<Result<Vec<Outcome>, store::Error>>,
    /// Whether the next batch may be written beside it ([`side_by_side`]).
    pub(super) beside: bool,
}

/// The ops of one transaction, and the requests they answer.
pub(super) struct Batch {
    pub(super) ops: Arc<[Op]>,
    pub(super) requests: Vec<Request>,
    pub(super) first_claim: usize,
    pub(super) now: UnixMillis,
    pub(super) started: std::time::Instant,
    /// A batch with claims was sent before this one landed.
    pub(super) overtaken: bool,
}

/// What the store made of the batch in `flight`, once it is written; never,
/// without one.
pub(super) async fn landing(flight: &mut Option<Flight>) -> Result<Vec<Outcome>, store::Error> {
    match flight {
        // A writing task that ended without an answer (it panicked, or the
        // runtime is going down) is a failed batch: its requests are retried.
        Some(f) => (&mut f.applied)
            .await
            .unwrap_or_else(|_| Err(store::Error::Database(sqlx::Error::WorkerCrashed))),
        None => std::future::pending().await,
    }
}

/// Whether `op` may be written beside another batch: it meets the other batch's
/// rows only at their locks, and whichever commits first, landing the two in the
/// order they formed tells the registry the truth. A submit inserts, an ending is
/// fenced by its attempt, a claim skips locked rows. Not so a cancel, whose
/// batch could find a row a later batch's claim took (RUNNING) and land first,
/// before the registry holds the attempt to stop; nor a renewal, which could miss
/// an attempt a later batch ended and take it for lost. Those batches are written
/// alone.
pub(super) fn side_by_side(op: &Op) -> bool {
    matches!(op, Op::Submit(_) | Op::Finish { .. } | Op::Claim(_))
}

/// Marks the types of the rows `ops` submit due now.
pub(super) fn mark_submits_due(registry: &Registry, ops: &[Op], now: UnixMillis) {
    for op in ops {
        if let Op::Submit(batch) = op {
            for new in batch.iter().filter(|new| new.next_at <= now) {
                registry.mark_due(&new.key.namespace, &new.activity_type);
            }
        }
    }
}

/// The rows `ops` write for requests: a submit's rows, one for any other op.
/// Claims are left out: how many rows one finds is known only once it lands.
pub(super) fn rows_written(ops: &[Op]) -> usize {
    ops.iter()
        .map(|op| match op {
            Op::Submit(rows) => rows.len(),
            Op::Claim(_) => 0,
            _ => 1,
        })
        .sum()
}
