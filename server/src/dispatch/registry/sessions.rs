//! How a worker's session comes and goes: registration, the end of a stream
//! (detached for the grace, or removed), a resume on this node with its ticket,
//! a session taken over from another node, and what a resumed worker lacks.
//! A stream's end removes its worker only while it still owns it, so a resume
//! that comes between the check and the removal keeps its attempts.

use super::*;
use crate::dispatch::outbound::Task;

impl Registry {
    /// Adds a worker; returns its id and the receiving end of its outbound channel,
    /// which starts with its welcome, ahead of any task.
    pub fn register(
        &self,
        reg: Registration,
        now: UnixMillis,
    ) -> (
        Arc<str>,
        mpsc::Sender<Outgoing>,
        mpsc::Receiver<Outgoing>,
        CancellationToken,
    ) {
        let id: Arc<str> = uuid::Uuid::now_v7().to_string().into();
        let (tx, rx) = outbound_channel(&id, reg.max_concurrency);
        let evict = CancellationToken::new();
        let group: GroupKey = (reg.namespace.clone(), reg.activity_types.clone());
        let mut inner = self.lock();
        // A worker registering after a drain began is told at once, under the same
        // lock that `begin_drain` broadcasts under, so none is missed.
        if let Some(drain) = inner.drain {
            let _ = tx.try_send(Outgoing::new(ToWorker::Drain {
                deadline: drain.deadline,
            }));
        }
        inner
            .groups
            .entry(group.clone())
            .or_default()
            .workers
            .push(id.clone());
        // A new worker may be able to take rows that were waiting for one.
        if let Some(g) = inner.groups.get_mut(&group) {
            g.refresh();
        }
        let worker = Worker::new(id.clone(), group, reg, now, tx.clone(), evict.clone());
        inner.workers.insert(id.clone(), worker);
        drop(inner);
        self.wake.notify_one();
        (id, tx, rx, evict)
    }

    #[cfg(test)]
    /// Removes a worker; returns the attempts it still ran that the server had not
    /// already ended, for the caller to fail or release.
    pub fn unregister(&self, worker_id: &str) -> Vec<Arc<Attempt>> {
        self.unregister_if(worker_id, |_| true).unwrap_or_default()
    }

    /// [`Registry::unregister`] by the session writing to `tx`, only while that
    /// session still owns the worker: checked under the same lock, since a resume
    /// may hand the worker to a new stream at any moment. `None` if it does not.
    pub fn unregister_owned(
        &self,
        worker_id: &str,
        tx: &mpsc::Sender<Outgoing>,
    ) -> Option<Vec<Arc<Attempt>>> {
        self.unregister_if(worker_id, |w| w.outbound.same_channel(tx))
    }

    /// [`Registry::unregister_owned`] for a session that is lost: its attempts
    /// come back to be ended only where still this node's, since the worker may
    /// have resumed its session on another node, which took the rows over.
    pub fn unregister_lost_owned(
        &self,
        worker_id: &str,
        tx: &mpsc::Sender<Outgoing>,
    ) -> Option<Vec<Arc<Attempt>>> {
        self.unregister_owned(worker_id, tx)
            .map(|attempts| self.lost(attempts))
    }

    /// Removes the worker if `still` holds of it, under the lock that checks it.
    pub(super) fn unregister_if(
        &self,
        worker_id: &str,
        still: impl FnOnce(&Worker) -> bool,
    ) -> Option<Vec<Arc<Attempt>>> {
        let mut inner = self.lock();
        if !inner.workers.get(worker_id).is_some_and(still) {
            return None;
        }
        let (worker, releasing) = inner.remove_worker(worker_id, |_| false)?;
        drop(inner);
        if releasing {
            self.wake.notify_one();
        }
        self.answered.notify_waiters();
        Some(
            worker
                .inflight
                .into_values()
                .filter(|i| !i.cancel_sent)
                .map(|i| i.attempt)
                .collect(),
        )
    }

    /// Sends a resumed worker the task of an attempt it lacked, read again from
    /// the store, only while the attempt is still in flight for it and not
    /// stopped by the server (a task sent after its cancel would run, unasked;
    /// one stopped is forgotten, freeing its slot), and only on the stream `tx`
    /// of the resume that found it lacking (a later resume sends what it lacks
    /// itself).
    pub fn send_lacked(
        &self,
        worker_id: &str,
        tx: &mpsc::Sender<Outgoing>,
        attempt: &Attempt,
        task: Task,
    ) {
        let inner = self.lock();
        let Some(worker) = inner.owned(worker_id, tx) else {
            return;
        };
        let ids = Ids::new(
            &attempt.key.workflow_id,
            &attempt.key.activity_id,
            attempt.attempt,
        );
        let stopped = match worker.inflight.get(ids.key()) {
            Some(inflight) if !inflight.cancel_sent => {
                let _ = worker
                    .outbound
                    .try_send(Outgoing::new(ToWorker::Task(Box::new(task))));
                return;
            }
            Some(_) => true,
            None => false,
        };
        drop(inner);
        // Stopped while it was read: the worker, never having had it, will not
        // answer its cancel either.
        if stopped {
            self.forget_unsent(worker_id, attempt);
        }
    }

    /// A resumed worker lacked this attempt, and it is not sent again: its row
    /// ended meanwhile. The worker never had it, so it will never answer it, nor
    /// a cancel for it: the slot is freed here.
    pub fn forget_unsent(&self, worker_id: &str, attempt: &Attempt) {
        let mut inner = self.lock();
        let paused = inner.paused;
        let Some(worker) = inner.workers.get_mut(worker_id) else {
            return;
        };
        let ids = Ids::new(
            &attempt.key.workflow_id,
            &attempt.key.activity_id,
            attempt.attempt,
        );
        if worker.inflight.remove(ids.key()).is_none() {
            return;
        }
        worker.fill(paused);
        drop(inner);
        self.wake.notify_one();
        // The attempt no longer counts as running: a drain may be waiting on that.
        self.answered.notify_waiters();
    }

    /// Whether the session writing to `tx` still owns the worker (a resume hands
    /// it to a new stream).
    pub fn owns(&self, worker_id: &str, tx: &mpsc::Sender<Outgoing>) -> bool {
        self.lock().owned(worker_id, tx).is_some()
    }

    /// The stream of the session writing to `tx` dropped: keep the worker, its
    /// attempts and their slots for `grace`, for the worker to resume. False (and
    /// nothing kept) when the session cannot be resumed, or need not be: no grace,
    /// no ticket, no attempt held, the worker was evicted, or another stream owns
    /// it already. A worker that said Goodbye is kept too: cut off while it
    /// finishes, it resumes to report what it ran.
    pub fn detach(&self, worker_id: &str, tx: &mpsc::Sender<Outgoing>, grace: Duration) -> bool {
        let mut inner = self.lock();
        let Some(w) = inner.workers.get_mut(worker_id) else {
            return false;
        };
        // Holding nothing, there is nothing to keep: the worker may simply start a
        // new session.
        if grace.is_zero()
            || w.ticket.is_none()
            || w.inflight.is_empty()
            || w.evict.is_cancelled()
            || !w.outbound.same_channel(tx)
        {
            return false;
        }
        w.detached_until = Some(Instant::now() + grace);
        true
    }

    /// Hands the session of `worker_id` to a new stream, if `secret` is its ticket,
    /// presented by the token that opened it, with the same registration. The
    /// stream that held it (if its drop went unnoticed) is told to end; the ticket
    /// becomes `next`. `held` are the attempts the worker says it still has.
    pub fn resume_session(
        &self,
        worker_id: &str,
        secret: &str,
        reg: &Registration,
        held: &HashSet<AttemptKey>,
    ) -> Result<Resumption, ResumeRefused> {
        let mut inner = self.lock();
        let drain = inner.drain;
        let paused = inner.paused;
        let Some(worker) = inner.workers.get_mut(worker_id) else {
            return Err(ResumeRefused::Unknown);
        };
        // A leaving session resumes leaving: it is planned no claim, and its
        // worker, which says Goodbye again on the new stream, hears Drain again.
        if worker.evict.is_cancelled() {
            return Err(ResumeRefused::Unknown);
        }
        let (Some(ticket), Some(next)) = (&worker.ticket, &reg.ticket) else {
            return Err(ResumeRefused::Ticket);
        };
        if !ticket.admits(secret, &next.caller) {
            return Err(ResumeRefused::Ticket);
        }
        if worker.group.0 != reg.namespace
            || worker.group.1 != reg.activity_types
            || worker.max_concurrency != reg.max_concurrency.max(1)
        {
            return Err(ResumeRefused::Changed);
        }
        let (tx, rx) = outbound_channel(&worker.id, worker.max_concurrency);
        tell_draining(&tx, drain);
        // The old stream, if it still reads, ends now; it no longer owns the worker.
        worker.evict.cancel();
        let evict = CancellationToken::new();
        worker.evict = evict.clone();
        worker.outbound = tx.clone();
        worker.ticket = reg.ticket.clone();
        worker.detached_until = None;
        worker.last_seen = Instant::now();
        worker.identity = reg.identity.as_str().into();
        let resumption = reconcile(worker, held, (tx, rx), evict);
        // What it lacks is sent first (by the session, in `resend`), then what was
        // claimed ahead for it fills the slots left.
        worker.fill(paused);
        drop(inner);
        Ok(self.resumed(resumption))
    }

    /// Wakes the dispatcher for the slots a resumed session may have, and the
    /// waiters for the answers it may bring.
    fn resumed(&self, resumption: Resumption) -> Resumption {
        self.wake.notify_one();
        self.answered.notify_waiters();
        resumption
    }

    /// Whether this worker's session can be resumed (it has a ticket).
    pub fn resumable(&self, worker_id: &str) -> bool {
        self.lock()
            .workers
            .get(worker_id)
            .is_some_and(|w| w.ticket.is_some())
    }

    /// Whether a worker of this id is registered here (live, detached or ending).
    pub fn knows(&self, worker_id: &str) -> bool {
        self.lock().workers.contains_key(worker_id)
    }

    /// Registers a session another node held, resumed here: `rows` are its RUNNING
    /// rows, which the store made this node's. As a local resume, the worker is told
    /// again what it lacks (`held`: what it says it has). What this node still
    /// kept of the session (it held it before) is stale and replaced, under the
    /// same lock: its rows claimed ahead go back, but for those among `rows`,
    /// which are this session's now (given back apart, a release fenced to this
    /// node would pass and end an attempt the worker runs).
    pub fn adopt(
        &self,
        worker_id: &str,
        reg: Registration,
        rows: Vec<crate::store::ActivityRow>,
        held: &HashSet<AttemptKey>,
        now_wall: UnixMillis,
    ) -> Resumption {
        let id: Arc<str> = worker_id.into();
        let adopted: foldhash::HashSet<(i64, u32)> =
            rows.iter().map(|row| (row.id, row.attempt)).collect();
        let (tx, rx) = outbound_channel(&id, reg.max_concurrency);
        let evict = CancellationToken::new();
        let group: GroupKey = (reg.namespace.clone(), reg.activity_types.clone());
        let now = Instant::now();
        let mut inflight = foldhash::HashMap::default();
        // What the worker runs first; then rows it lacks, up to its slots (to send
        // again). The rest were claimed ahead on the node it left and never sent:
        // they go back, uncounted, for any worker (the rows read for a takeover
        // carry no payloads to send them with).
        let (has, lacks): (Vec<_>, Vec<_>) = rows.into_iter().partition(|row| {
            held.contains(Ids::new(&row.key.workflow_id, &row.key.activity_id, row.attempt).key())
        });
        let mut unsent = Vec::new();
        for row in has.into_iter().chain(lacks) {
            let attempt = Arc::new(Attempt::from_row(&row));
            if inflight.len() >= reg.max_concurrency.max(1) as usize {
                unsent.push(attempt);
                continue;
            }
            let span = claims::attempt_span(&row, &id);
            inflight.insert(
                AttemptKey::new(&row.key.workflow_id, &row.key.activity_id, row.attempt),
                Inflight::new(attempt, now, now_wall, span),
            );
        }
        let mut worker = Worker::new(
            id.clone(),
            group.clone(),
            reg,
            now_wall,
            tx.clone(),
            evict.clone(),
        );
        worker.inflight = inflight;
        let resumption = reconcile(&mut worker, held, (tx, rx), evict);
        let mut inner = self.lock();
        inner.remove_worker(worker_id, |a| adopted.contains(&(a.id, a.attempt)));
        inner.released.extend(unsent);
        tell_draining(&resumption.tx, inner.drain);
        let g = inner.groups.entry(group).or_default();
        g.workers.push(id.clone());
        g.refresh();
        inner.workers.insert(id, worker);
        drop(inner);
        self.resumed(resumption)
    }

    /// The worker takes no more tasks (it said Goodbye).
    pub fn leave(&self, worker_id: &str) {
        if let Some(w) = self.lock().workers.get_mut(worker_id) {
            w.leaving = true;
        }
    }
}

/// A worker's outbound channel, its welcome first. Room for every task its
/// slots hold, a cancel for each, the acks of the window, and a few more (the
/// welcome, a drain, an ending): sends on it never wait.
fn outbound_channel(
    worker_id: &Arc<str>,
    max_concurrency: u32,
) -> (mpsc::Sender<Outgoing>, mpsc::Receiver<Outgoing>) {
    let capacity = 2 * max_concurrency.max(1) as usize + ACK_WINDOW + 8;
    let (tx, rx) = mpsc::channel(capacity);
    // The channel is new and empty: this cannot fail.
    let _ = tx.try_send(Outgoing::new(ToWorker::Welcome {
        worker_id: worker_id.clone(),
    }));
    (tx, rx)
}

/// The resumption of a worker's session on a new stream (`tx`, `rx`, `evict`),
/// with what the worker, which says it holds `held`, must be told: the tasks of
/// attempts the session holds that it lacks (to send again), cancels for attempts
/// it has that the server ended, and how many it still runs. Attempts the server ended that the
/// worker no longer has are forgotten (nothing would ever free their slots).
fn reconcile(
    worker: &mut Worker,
    held: &HashSet<AttemptKey>,
    (tx, rx): (mpsc::Sender<Outgoing>, mpsc::Receiver<Outgoing>),
    evict: CancellationToken,
) -> Resumption {
    let mut resend = Vec::new();
    let mut cancels = Vec::new();
    let mut reattached = 0;
    let mut forgotten = Vec::new();
    // Only what this resume lists: a worker that resumes again lists again what it
    // still has to send.
    worker.ended_away.clear();
    for (key, inflight) in &worker.inflight {
        let has = held.contains(key);
        match (&inflight.cancel, has) {
            (Some(cancel), true) => cancels.push(cancel.clone()),
            // Ended by the server, and the worker has nothing to answer with:
            // its slot would never be freed.
            (Some(_), false) => forgotten.push(key.clone()),
            (None, true) => reattached += 1,
            (None, false) => resend.push(inflight.attempt.clone()),
        }
    }
    for key in forgotten {
        worker.inflight.remove(&key);
    }
    // What a worker can still have to answer: its running attempts, the results
    // they came to while it was away, and those it sent whose acks it never saw.
    let answerable = 2 * worker.max_concurrency as usize + ACK_WINDOW;
    for key in held {
        if !worker.inflight.contains_key(key) {
            if worker.ended_away.len() < answerable {
                worker.ended_away.insert(key.clone());
            }
            cancels.push(Cancel {
                workflow_id: key.workflow_id.clone(),
                activity_id: key.activity_id.clone(),
                attempt: key.attempt,
                reason: "the attempt ended while the worker was disconnected".to_owned(),
                kind: CancelKind::EndedElsewhere,
            });
        }
    }
    Resumption {
        tx,
        rx,
        evict,
        resend,
        cancels,
        reattached,
    }
}

/// Tells a new stream of a draining node's worker to drain, as the stream it
/// replaces was told.
fn tell_draining(tx: &mpsc::Sender<Outgoing>, drain: Option<Draining>) {
    if let Some(drain) = drain {
        // A new stream's channel has room: it holds only the Welcome.
        let _ = tx.try_send(Outgoing::new(ToWorker::Drain {
            deadline: drain.deadline,
        }));
    }
}
