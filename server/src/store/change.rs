//! What each write does to a row, decided once for both dialects: the status it
//! moves to, every value it writes, and which existing rows a submit answers with.
//! `sqlite/` and `postgres/` only say it in SQL: each binds these values to one
//! statement per operation and decides nothing of its own.
//!
//! Every way a row leaves RUNNING (or SCHEDULED, for a cancel or an expiry) is an
//! [`Ending`], and each dialect writes all endings with one `SET` clause, so a
//! column cannot be forgotten by one kind of ending or one code path (a single op,
//! a run of them) and not another. The fences stay in each statement's `WHERE`:
//! - an attempt's ending matches only `id`, `attempt` and RUNNING (and, for a
//!   reclaim, a lease that expired by then), so a late or repeated result never
//!   lands;
//! - a cancel matches a row [`cancellable`](super::cancellable) in the same
//!   transaction, an expiry a SCHEDULED row whose deadline passed;
//! - no ending touches `attempt`: it only grows, at a claim, so a fence never
//!   matches an older attempt.

use std::collections::HashMap;

use spool_proto::time::UnixMillis;

use super::{
    ActivityError, ActivityRow, ActivityStatus, ErrorKind, Key, NewActivity, Payload, Transition,
};

/// The values an ending writes. Each dialect binds them, in this order, to its one
/// `SET` clause: `status`, `next_at` (kept when `None`), `finished_at`,
/// `uncounted` (added), `lease_expires_at = NULL`, the output, the five error
/// columns (kept when `error` is `None`), then `attempt_outcome` and
/// `attempt_ended_at`, which the store's `attempt_ended` trigger copies into the
/// attempt's history record when the row leaves RUNNING.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Ending<'a> {
    pub status: ActivityStatus,
    /// When it is next claimable; `None` keeps the stored time.
    pub next_at: Option<UnixMillis>,
    /// Set when the activity is finished for good, cleared otherwise.
    pub finished_at: Option<UnixMillis>,
    /// 1 when the attempt does not count against `max_attempts`.
    pub uncounted: i64,
    /// Written as is: only a completion has an output, and no other row holds one.
    pub output: Option<&'a Payload>,
    /// The last error; `None` keeps the one stored (a completion or a snooze does not
    /// erase why an earlier attempt failed).
    pub error: Option<&'a ActivityError>,
    /// How the attempt ended, as its history record and metrics name it.
    pub outcome: AttemptOutcome,
    /// When the attempt ended.
    pub ended_at: UnixMillis,
}

/// How one attempt ended. `dead_lettered` is not one: it is what happens to the
/// activity when an attempt ends `Failed`, `TimedOut` or `Lost` with no attempts left.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AttemptOutcome {
    Completed,
    /// Failed; another attempt follows.
    Retried,
    /// Failed for good (terminal error, or no attempts left).
    Failed,
    TimedOut,
    /// Its worker went away.
    Lost,
    Cancelled,
    Snoozed,
    /// The server gave it back (a drain).
    Released,
}

impl AttemptOutcome {
    pub const ALL: [AttemptOutcome; 8] = [
        AttemptOutcome::Completed,
        AttemptOutcome::Retried,
        AttemptOutcome::Failed,
        AttemptOutcome::TimedOut,
        AttemptOutcome::Lost,
        AttemptOutcome::Cancelled,
        AttemptOutcome::Snoozed,
        AttemptOutcome::Released,
    ];

    /// The stored and displayed name.
    pub fn name(self) -> &'static str {
        match self {
            AttemptOutcome::Completed => "completed",
            AttemptOutcome::Retried => "retried",
            AttemptOutcome::Failed => "failed",
            AttemptOutcome::TimedOut => "timed_out",
            AttemptOutcome::Lost => "lost",
            AttemptOutcome::Cancelled => "cancelled",
            AttemptOutcome::Snoozed => "snoozed",
            AttemptOutcome::Released => "released",
        }
    }

    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|o| o.name() == name)
    }

    /// How an attempt that ends by `transition` ended.
    pub fn of(transition: &Transition) -> Self {
        match transition {
            Transition::Complete { .. } => AttemptOutcome::Completed,
            Transition::Retry { error, .. } => AttemptOutcome::of_error(error, true),
            Transition::Fail { error } => AttemptOutcome::of_error(error, false),
            Transition::Snooze { .. } => AttemptOutcome::Snoozed,
            Transition::Release => AttemptOutcome::Released,
        }
    }

    /// Why an attempt that ended with `error` ended: the server's own kinds (a
    /// timeout, a lost worker) say more than whether it is retried.
    fn of_error(error: &ActivityError, retried: bool) -> Self {
        match ErrorKind::try_from(error.kind) {
            Ok(ErrorKind::Timeout) => AttemptOutcome::TimedOut,
            Ok(ErrorKind::WorkerLost) => AttemptOutcome::Lost,
            _ if retried => AttemptOutcome::Retried,
            _ => AttemptOutcome::Failed,
        }
    }
}

impl<'a> Ending<'a> {
    /// How an attempt ends by `transition`, at `now`.
    pub fn of(transition: &'a Transition, now: UnixMillis) -> Self {
        let outcome = AttemptOutcome::of(transition);
        let rescheduled = |next_at, uncounted, error| Ending {
            status: ActivityStatus::Scheduled,
            next_at: Some(next_at),
            finished_at: None,
            uncounted,
            output: None,
            error,
            outcome,
            ended_at: now,
        };
        match transition {
            Transition::Complete { output } => Ending {
                output: Some(output),
                ..Ending::finished(ActivityStatus::Completed, now, None)
            },
            Transition::Fail { error } => Ending {
                outcome,
                ..Ending::finished(ActivityStatus::Failed, now, Some(error))
            },
            Transition::Retry { next_at, error } => rescheduled(*next_at, 0, Some(error)),
            Transition::Snooze { next_at } => rescheduled(*next_at, 1, None),
            Transition::Release => rescheduled(now, 1, None),
        }
    }

    /// A SCHEDULED row's schedule-to-close deadline passed: it fails at `now`.
    pub fn expired(now: UnixMillis) -> Ending<'static> {
        Ending::finished(ActivityStatus::Failed, now, Some(schedule_to_close_error()))
    }

    /// Finished for good at `now` (completed, failed or cancelled).
    pub fn finished(
        status: ActivityStatus,
        now: UnixMillis,
        error: Option<&'a ActivityError>,
    ) -> Self {
        let outcome = match (status, error) {
            (ActivityStatus::Cancelled, _) => AttemptOutcome::Cancelled,
            (ActivityStatus::Completed, _) => AttemptOutcome::Completed,
            (_, Some(error)) => AttemptOutcome::of_error(error, false),
            (_, None) => AttemptOutcome::Failed,
        };
        Ending {
            status,
            next_at: None,
            finished_at: Some(now),
            uncounted: 0,
            output: None,
            error,
            outcome,
            ended_at: now,
        }
    }

    /// The output's content type and bytes, as bound.
    pub fn output_columns(&self) -> (Option<&'a str>, Option<&'a [u8]>) {
        match self.output {
            Some(p) => (Some(p.content_type.as_str()), Some(p.data.as_slice())),
            None => (None, None),
        }
    }
}

/// When schedule-to-close fails an activity whose window starts at `from`:
/// computed here, saturating, and bound as an integer, never added up in SQL.
pub(crate) fn expires_at(
    from: UnixMillis,
    schedule_to_close_ms: Option<i64>,
) -> Option<UnixMillis> {
    schedule_to_close_ms.map(|ms| from.saturating_add(ms))
}

/// What a cancelled activity shows as its last error: who stopped it and why.
pub(crate) fn cancelled_error(reason: &str) -> ActivityError {
    ActivityError {
        kind: ErrorKind::Terminal as i32,
        r#type: "Cancelled".to_owned(),
        message: if reason.is_empty() {
            "cancelled by request".to_owned()
        } else {
            reason.to_owned()
        },
        details: None,
        next_retry_delay: None,
    }
}

/// The error type and message of a schedule-to-close timeout, whether the row
/// waits (an expiry) or runs (the dispatcher's timeouts).
pub(crate) const SCHEDULE_TO_CLOSE: (&str, &str) = (
    "ScheduleToCloseTimeout",
    "schedule_to_close_timeout passed before the activity finished",
);

/// What a SCHEDULED row whose schedule-to-close deadline passed fails with.
pub(crate) fn schedule_to_close_error() -> &'static ActivityError {
    static ERROR: std::sync::LazyLock<ActivityError> = std::sync::LazyLock::new(|| {
        let (error_type, message) = SCHEDULE_TO_CLOSE;
        super::server_error(ErrorKind::Timeout, error_type, message.to_owned())
    });
    &ERROR
}

/// The values a re-drive writes: SCHEDULED now, every attempt so far uncounted
/// (`uncounted = attempt`: a fresh budget, while `attempt` keeps growing so late
/// results of old attempts stay fenced out), `finished_at`, the output and the last
/// error cleared (the run starts afresh), and a new schedule-to-close window from
/// now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Redrive {
    pub next_at: UnixMillis,
    pub expires_at: Option<UnixMillis>,
}

impl Redrive {
    pub fn of(row: &ActivityRow, now: UnixMillis) -> Self {
        Redrive {
            next_at: now,
            expires_at: expires_at(now, row.timeouts.schedule_to_close_ms),
        }
    }
}

/// What a store found for one key of a submit.
#[derive(Debug)]
pub(crate) enum Found {
    /// No row: insert one.
    Absent,
    /// This submit's own insert created the row, with this id.
    Inserted(i64),
    /// The row was there before.
    Existing(Box<ActivityRow>),
}

/// How each activity of a submit is answered.
#[derive(Debug)]
pub(crate) enum Entry {
    /// Nothing stored it yet: insert it.
    Insert,
    /// Stored by this submit, with this id.
    Created(i64),
    /// Stored before: answered with the stored row, unchanged.
    Existing(Box<ActivityRow>),
    /// The same key as entry `n` of this batch: answered as that one is.
    SameAs(usize),
}

/// A submit that must write nothing: activity `index` names a key stored (or
/// submitted earlier in the batch) with another type.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Conflict {
    pub index: usize,
    pub existing_type: String,
}

/// Decides a submit's answer for each activity of `batch`, all or nothing:
/// `found` is asked once per distinct key, in batch order, and stops being asked at
/// the first conflict. A key repeated in the batch is answered as its first
/// occurrence, and must name the same type.
pub(crate) fn settle<E>(
    batch: &[NewActivity],
    mut found: impl FnMut(&NewActivity) -> Result<Found, E>,
) -> Result<Result<Vec<Entry>, Conflict>, E> {
    let mut first: HashMap<&Key, usize> = HashMap::with_capacity(batch.len());
    let mut entries = Vec::with_capacity(batch.len());
    for (index, new) in batch.iter().enumerate() {
        if let Some(&earlier) = first.get(&new.key) {
            if batch[earlier].activity_type != new.activity_type {
                return Ok(Err(Conflict {
                    index,
                    existing_type: batch[earlier].activity_type.clone(),
                }));
            }
            entries.push(Entry::SameAs(earlier));
            continue;
        }
        first.insert(&new.key, index);
        entries.push(match found(new)? {
            Found::Absent => Entry::Insert,
            Found::Inserted(id) => Entry::Created(id),
            Found::Existing(row) if row.activity_type != new.activity_type => {
                return Ok(Err(Conflict {
                    index,
                    existing_type: row.activity_type,
                }));
            }
            Found::Existing(row) => Entry::Existing(row),
        });
    }
    Ok(Ok(entries))
}

/// A freshly inserted row, built from what was inserted.
pub(crate) fn new_row(id: i64, new: &NewActivity, now: UnixMillis) -> ActivityRow {
    ActivityRow {
        id,
        key: new.key.clone(),
        activity_type: new.activity_type.clone(),
        status: ActivityStatus::Scheduled,
        attempt: 0,
        uncounted: 0,
        retry: new.retry.clone(),
        timeouts: new.timeouts,
        priority: new.priority,
        input: new.input.clone(),
        output: None,
        last_error: None,
        heartbeat_details: None,
        created_at: now,
        next_at: new.next_at,
        started_at: None,
        finished_at: None,
        lease_expires_at: None,
        worker_id: None,
        expires_at: expires_at(now, new.timeouts.schedule_to_close_ms),
        headers: new.headers.clone(),
        concurrency_key: new.concurrency_key.clone(),
        fairness_key: new.fairness.as_ref().map(|f| f.key.clone()),
    }
}

/// The submit's answer once every `Insert` entry is `Created`: one
/// [`Submitted`](super::Submitted) per activity, in order.
pub(crate) fn submitted(
    batch: &[NewActivity],
    entries: Vec<Entry>,
    now: UnixMillis,
) -> Result<Vec<super::Submitted>, super::Error> {
    let mut out: Vec<super::Submitted> = Vec::with_capacity(entries.len());
    for (new, entry) in batch.iter().zip(entries) {
        let s = match entry {
            Entry::Created(id) => super::Submitted {
                row: new_row(id, new, now),
                created: true,
            },
            Entry::Existing(row) => super::Submitted {
                row: *row,
                created: false,
            },
            Entry::SameAs(earlier) => super::Submitted {
                row: out
                    .get(earlier)
                    .map(|s| s.row.clone())
                    .ok_or_else(|| super::Error::Corrupt("a repeat before its key".to_owned()))?,
                created: false,
            },
            Entry::Insert => {
                return Err(super::Error::Corrupt(format!(
                    "{:?} was never inserted",
                    new.key
                )));
            }
        };
        out.push(s);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn new(id: &str, ty: &str) -> NewActivity {
        crate::store::new_activity_for_tests(id, ty)
    }

    #[test]
    fn each_transition_writes_what_it_means() {
        let error = schedule_to_close_error().clone();
        let output = Payload::default();
        let complete = Transition::Complete {
            output: output.clone(),
        };
        let e = Ending::of(&complete, 7);
        assert_eq!(
            (e.status, e.finished_at, e.next_at, e.uncounted),
            (ActivityStatus::Completed, Some(7), None, 0)
        );
        assert!(
            e.output.is_some() && e.error.is_none(),
            "keeps the last error"
        );
        let retry = Transition::Retry {
            next_at: 9,
            error: error.clone(),
        };
        let e = Ending::of(&retry, 7);
        assert_eq!(
            (e.status, e.finished_at, e.next_at, e.uncounted),
            (ActivityStatus::Scheduled, None, Some(9), 0),
            "a retry counts"
        );
        assert!(e.error.is_some());
        let e = Ending::of(&Transition::Snooze { next_at: 9 }, 7);
        assert_eq!((e.next_at, e.uncounted), (Some(9), 1), "a snooze does not");
        let e = Ending::of(&Transition::Release, 7);
        assert_eq!(
            (e.status, e.next_at, e.uncounted),
            (ActivityStatus::Scheduled, Some(7), 1),
            "a release is due at once, uncounted"
        );
        let fail = Transition::Fail { error };
        let e = Ending::of(&fail, 7);
        assert_eq!(
            (e.status, e.finished_at, e.next_at),
            (ActivityStatus::Failed, Some(7), None)
        );
        assert!(e.error.is_some() && e.output.is_none());
        assert_eq!(e.outcome, AttemptOutcome::TimedOut, "a timeout says so");
        let failure = |kind: ErrorKind| ActivityError {
            kind: kind as i32,
            ..Default::default()
        };
        let outcome = |t: Transition| Ending::of(&t, 7).outcome;
        let retried = |kind| Transition::Retry {
            next_at: 9,
            error: failure(kind),
        };
        assert_eq!(
            outcome(retried(ErrorKind::Retryable)),
            AttemptOutcome::Retried
        );
        assert_eq!(
            outcome(retried(ErrorKind::WorkerLost)),
            AttemptOutcome::Lost
        );
        let failed = Transition::Fail {
            error: failure(ErrorKind::Terminal),
        };
        assert_eq!(outcome(failed), AttemptOutcome::Failed);
        assert_eq!(
            outcome(Transition::Snooze { next_at: 9 }),
            AttemptOutcome::Snoozed
        );
        let cancelled = Ending::finished(ActivityStatus::Cancelled, 7, None);
        assert_eq!(
            (cancelled.outcome, cancelled.ended_at),
            (AttemptOutcome::Cancelled, 7)
        );
        for o in AttemptOutcome::ALL {
            assert_eq!(AttemptOutcome::parse(o.name()), Some(o));
        }
    }

    #[test]
    fn a_submit_settles_repeats_existing_rows_and_conflicts() {
        let existing = |ty: &str| {
            let mut row = crate::store::running_row_for_tests(5, "b", "w");
            row.activity_type = ty.into();
            row
        };
        let batch = [new("a", "t"), new("b", "t"), new("a", "t")];
        let mut asked = Vec::new();
        let entries = settle::<()>(&batch, |n| {
            asked.push(n.key.activity_id.clone());
            Ok(match n.key.activity_id.as_str() {
                "b" => Found::Existing(Box::new(existing("t"))),
                _ => Found::Absent,
            })
        })
        .unwrap_or_else(|_| panic!("no store error"))
        .unwrap_or_else(|c| panic!("no conflict: {c:?}"));
        assert_eq!(asked, ["a", "b"], "each key asked once");
        assert!(matches!(
            entries.as_slice(),
            [Entry::Insert, Entry::Existing(_), Entry::SameAs(0)]
        ));
        let rows = submitted(
            &batch,
            vec![
                Entry::Created(1),
                Entry::Existing(Box::new(existing("t"))),
                Entry::SameAs(0),
            ],
            3,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let created: Vec<_> = rows.iter().map(|s| (s.row.id, s.created)).collect();
        assert_eq!(created, [(1, true), (5, false), (1, false)]);

        let stored_as_other = settle::<()>(&batch, |n| {
            Ok(match n.key.activity_id.as_str() {
                "b" => Found::Existing(Box::new(existing("other"))),
                _ => Found::Inserted(1),
            })
        });
        assert_eq!(
            stored_as_other.ok().and_then(Result::err),
            Some(Conflict {
                index: 1,
                existing_type: "other".into()
            })
        );
        let repeated_as_other = [new("a", "t"), new("a", "u")];
        let settled = settle::<()>(&repeated_as_other, |_| Ok(Found::Absent));
        assert_eq!(
            settled.ok().and_then(Result::err),
            Some(Conflict {
                index: 1,
                existing_type: "t".into()
            })
        );
    }
}
