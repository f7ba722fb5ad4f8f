//! The registry's unit tests: slots, claims, resume and adoption, liveness and
//! heartbeat details, walked on paused time where time is the subject.

use std::time::Duration;

use super::*;
use crate::store::{ActivityRow, Op, Transition};

fn registration(max_concurrency: u32) -> Registration {
    Registration::for_tests(max_concurrency)
}

fn kinds(rx: &mut mpsc::Receiver<Outgoing>) -> Vec<&'static str> {
    let mut kinds = Vec::new();
    while let Ok(out) = rx.try_recv() {
        kinds.push(match out.message {
            ToWorker::Welcome { .. } => "welcome",
            ToWorker::Drain { .. } => "drain",
            ToWorker::Task(_) => "task",
            _ => "other",
        });
    }
    kinds
}

#[tokio::test(start_paused = true)]
async fn a_dropped_session_is_resumed_only_with_its_ticket_and_only_once() {
    let registry = Registry::default();
    let with_ticket = |caller: &str| Registration {
        ticket: Some(Ticket::new(caller.into())),
        ..registration(2)
    };
    let first = with_ticket("tokens[0]");
    let secret = first
        .ticket
        .as_ref()
        .map(|t| t.secret.clone())
        .unwrap_or_default();
    let (id, tx, _rx, _) = registry.register(first, 0);
    let grace = Duration::from_secs(5);
    assert!(
        !registry.detach(&id, &tx, grace),
        "nothing held, nothing kept"
    );
    registry.mark_all_due();
    let claim = registry.plan_claims(0, &[]).remove(0);
    let row = crate::store::running_row_for_tests(1, "a", &id);
    assert!(registry.assign(&claim, vec![row]).is_empty());
    assert!(registry.detach(&id, &tx, grace));
    registry.mark_all_due();
    assert!(
        registry.plan_claims(1, &[]).is_empty(),
        "no claims while detached"
    );
    let held = HashSet::new();
    let refused = |caller: &str, secret: &str, reg: Registration| {
        registry
            .resume_session(
                &id,
                secret,
                &Registration {
                    ticket: Some(Ticket {
                        secret: "next".into(),
                        caller: caller.into(),
                    }),
                    ..reg
                },
                &held,
            )
            .err()
    };
    assert_eq!(
        refused("tokens[0]", "forged", registration(2)),
        Some(ResumeRefused::Ticket)
    );
    assert_eq!(
        refused("tokens[1]", &secret, registration(2)),
        Some(ResumeRefused::Ticket),
        "bound to the token that opened it"
    );
    assert_eq!(
        refused("tokens[0]", &secret, registration(3)),
        Some(ResumeRefused::Changed)
    );
    let again = with_ticket("tokens[0]");
    let resumed = registry.resume_session(&id, &secret, &again, &held);
    assert!(
        resumed
            .as_ref()
            .is_ok_and(|r| r.resend.len() == 1 && r.reattached == 0),
        "the right ticket, once; the worker lacks attempt a: sent again"
    );
    assert_eq!(
        refused("tokens[0]", &secret, registration(2)),
        Some(ResumeRefused::Ticket),
        "the ticket is single-use"
    );
    assert!(!registry.owns(&id, &tx), "the old stream lost the session");
    assert!(
        registry.unregister_lost_owned(&id, &tx).is_none() && registry.knows(&id),
        "the old stream's end, however late, leaves the resumed session alone"
    );
    // Dropped again and never resumed: the sweep loses it after the grace.
    let new_tx = resumed.map(|r| r.tx).ok();
    assert!(new_tx.is_some_and(|tx| registry.detach(&id, &tx, grace)));
    let sweep = registry.sweep(
        Instant::now() + grace,
        Duration::from_secs(3600),
        Duration::MAX,
    );
    assert_eq!(
        sweep
            .abandoned
            .iter()
            .map(|(_, a)| a.len())
            .collect::<Vec<_>>(),
        [1],
        "lost with its attempt"
    );
    assert_eq!(registry.worker_count(), 0);
}

#[test]
fn a_worker_registering_after_a_drain_began_is_told_at_once() {
    let registry = Registry::default();
    let (_, _tx, mut before, _) = registry.register(registration(1), 0);
    registry.begin_drain(None);
    let (_, _tx2, mut after, _) = registry.register(registration(1), 0);
    assert_eq!(kinds(&mut before), ["welcome", "drain"]);
    assert_eq!(kinds(&mut after), ["welcome", "drain"]);
    registry.mark_all_due();
    assert!(
        registry.plan_claims(1, &[]).is_empty(),
        "a drain plans no claims"
    );
}

#[test]
fn evicted_and_leaving_workers_are_planned_no_claims() {
    let registry = Registry::default();
    let (silent, _tx, _rx, evict) = registry.register(registration(4), 0);
    let (leaving, _tx2, _rx2, _) = registry.register(registration(4), 1_000);
    let (live, _tx3, _rx3, _) = registry.register(registration(4), 1_000);
    let later = Instant::now() + Duration::from_secs(1);
    registry.touch(&leaving, later);
    registry.touch(&live, later);
    // Found silent by two sweeps in a row.
    let sweep = registry.sweep(later, Duration::from_millis(500), Duration::MAX);
    assert!(sweep.lost_workers.is_empty());
    let sweep = registry.sweep(later, Duration::from_millis(500), Duration::MAX);
    assert_eq!(sweep.lost_workers, vec![silent.clone()]);
    assert!(evict.is_cancelled());
    registry.leave(&leaving);
    registry.mark_all_due();
    let claims = registry.plan_claims(1, &[]);
    let for_whom: Vec<_> = claims.iter().map(|c| c.worker_id.clone()).collect();
    assert_eq!(for_whom, vec![live]);
}

#[test]
fn silence_is_not_counted_while_the_session_waits_on_the_server() {
    let registry = Registry::default();
    let (id, _tx, _rx, evict) = registry.register(registration(1), 0);
    let silence = Duration::from_secs(1);
    {
        let _paused = registry.pause_silence(&id);
        let sweep = registry.sweep(
            Instant::now() + Duration::from_secs(10),
            silence,
            Duration::MAX,
        );
        assert!(sweep.lost_workers.is_empty());
        assert!(!evict.is_cancelled());
    }
    // Resuming counts as being heard from.
    assert!(
        registry
            .sweep(Instant::now(), silence, Duration::MAX)
            .lost_workers
            .is_empty()
    );
    let later = Instant::now() + Duration::from_secs(10);
    registry.sweep(later, silence, Duration::MAX);
    assert!(
        !registry
            .sweep(later, silence, Duration::MAX)
            .lost_workers
            .is_empty()
    );
}

/// A worker is lost only when two sweeps in a row find it silent: a message
/// read in between (one that waited while the server did not run) keeps it.
#[test]
fn a_worker_found_silent_once_is_kept_when_heard_before_the_next_sweep() {
    let registry = Registry::default();
    let (id, _tx, _rx, evict) = registry.register(registration(1), 0);
    let silence = Duration::from_secs(1);
    let at = |secs: u64| Instant::now() + Duration::from_secs(secs);
    assert!(
        registry
            .sweep(at(2), silence, Duration::MAX)
            .lost_workers
            .is_empty()
    );
    registry.touch(&id, at(2));
    assert!(
        registry
            .sweep(at(2), silence, Duration::MAX)
            .lost_workers
            .is_empty()
    );
    assert!(!evict.is_cancelled(), "heard from in between");
    // Silent again: a first finding is needed again, then it is lost.
    assert!(
        registry
            .sweep(at(4), silence, Duration::MAX)
            .lost_workers
            .is_empty()
    );
    assert_eq!(
        registry.sweep(at(4), silence, Duration::MAX).lost_workers,
        [id]
    );
    assert!(evict.is_cancelled());
}

/// A session taken over from another node: what the worker holds is
/// reattached, a row it lacks within its slots is sent again, and rows beyond
/// its slots (claimed ahead on the node it left, never sent) go back for the
/// committer to release, uncounted; none waits here without its payload.
#[test]
fn a_taken_over_session_releases_the_rows_claimed_ahead_elsewhere() {
    let registry = Registry::default();
    let id = "taken-over";
    let rows = ["a", "b", "c", "d"]
        .iter()
        .enumerate()
        .map(|(i, name)| row(i as i64 + 1, name, id))
        .collect();
    // It holds a; b was sent and lost on the way; c and d were ahead.
    let held: HashSet<AttemptKey> = [AttemptKey::new("wf", "a", 1)].into();
    let resumed = registry.adopt(id, registration(2), rows, &held, 0);
    assert_eq!(resumed.reattached, 1);
    assert_eq!(
        resumed
            .resend
            .iter()
            .map(|a| a.key.activity_id.as_str())
            .collect::<Vec<_>>(),
        ["b"]
    );
    assert_eq!(registry.claimed_ahead(None), 0);
    let released: Vec<(i64, u32, Option<Arc<str>>)> = take_released(&registry)
        .iter()
        .map(|a| (a.id, a.attempt, a.owner_node.clone()))
        .collect();
    let here = Some(registry.node.clone());
    assert_eq!(
        released,
        [(3, 1, here.clone()), (4, 1, here)],
        "released only while still this node's"
    );
    assert!(registry.holds(1, 1) && registry.holds(2, 1));
    assert!(!registry.holds(3, 1) && !registry.holds(4, 1));
}

/// A row taken back by a node that held the session before: the rows it kept
/// claimed ahead for the worker are stale, and one of them the worker now
/// runs (another node sent it). Adopting the session must not release that
/// one: the release would be fenced to this node, which the row is again, and
/// would send it to run a second time.
#[test]
fn a_session_taken_back_keeps_the_rows_the_worker_runs() {
    let registry = Registry::new("n");
    let (id, _tx, _rx, _) = registry.register(registration(1), 0);
    registry.mark_all_due();
    let claim = registry.plan_claims(0, &[]).remove(0);
    // One row is sent, the other waits ahead.
    let ops = registry.assign(&claim, vec![row(1, "a", &id), row(2, "b", &id)]);
    assert!(ops.is_empty());
    assert_eq!(registry.claimed_ahead(None), 1);
    // The worker ran both elsewhere, and comes back holding both.
    let rows = vec![row(1, "a", &id), row(2, "b", &id)];
    let held: HashSet<AttemptKey> =
        [AttemptKey::new("wf", "a", 1), AttemptKey::new("wf", "b", 1)].into();
    let resumed = registry.adopt(&id, registration(2), rows, &held, 0);
    assert_eq!(resumed.reattached, 2);
    assert!(take_released(&registry).is_empty(), "nothing released");
    assert!(registry.holds(1, 1) && registry.holds(2, 1));
    assert_eq!(registry.claimed_ahead(None), 0);
    // A stale row the session does not hold any more still goes back.
    let (other, _tx, _rx, _) = registry.register(registration(1), 0);
    registry.mark_all_due();
    let claim = registry.plan_claims(0, &[]).remove(0);
    let ops = registry.assign(&claim, vec![row(3, "c", &other), row(4, "d", &other)]);
    assert!(ops.is_empty());
    let rows = vec![row(3, "c", &other)];
    let held: HashSet<AttemptKey> = [AttemptKey::new("wf", "c", 1)].into();
    registry.adopt(&other, registration(1), rows, &held, 0);
    let released: Vec<(i64, Option<Arc<str>>)> = take_released(&registry)
        .iter()
        .map(|a| (a.id, a.owner_node.clone()))
        .collect();
    assert_eq!(released, [(4, Some("n".into()))]);
}

/// Rows a claim took for a worker that left, or whose stream closed, while the
/// claim was written go back fenced to this node: the worker may have resumed
/// on another node, which took them over and may be running them.
#[test]
fn rows_claimed_for_a_worker_that_cannot_take_them_are_released_only_while_still_this_nodes() {
    let here: Option<Arc<str>> = Some("n".into());
    let released_by = |ops: Vec<Op>| -> Vec<(i64, Option<Arc<str>>)> {
        ops.into_iter()
            .map(|op| match op {
                Op::Finish {
                    attempt,
                    transition: Transition::Release,
                    ..
                } => (attempt.id, attempt.owner_node.clone()),
                other => panic!("not a release: {other:?}"),
            })
            .collect()
    };
    // The stream closed while the claim was written.
    let registry = Registry::new("n");
    let (id, _tx, rx, _) = registry.register(registration(2), 0);
    drop(rx);
    registry.mark_all_due();
    let claim = registry.plan_claims(0, &[]).remove(0);
    let ops = registry.assign(&claim, vec![row(1, "a", &id)]);
    assert_eq!(released_by(ops), [(1, here.clone())]);
    // The worker was evicted (silent too long) while the claim was written.
    let registry = Registry::new("n");
    let (id, _tx, _rx, evict) = registry.register(registration(2), 0);
    registry.mark_all_due();
    let claim = registry.plan_claims(0, &[]).remove(0);
    evict.cancel();
    let ops = registry.assign(&claim, vec![row(3, "c", &id)]);
    assert_eq!(released_by(ops), [(3, here.clone())]);
    assert!(
        !registry.holds(3, 1),
        "not in flight for the evicted worker"
    );
    // The worker is gone from the registry.
    let (id, _tx, _rx, _) = registry.register(registration(2), 0);
    registry.mark_all_due();
    let claim = registry.plan_claims(0, &[]).remove(0);
    let _ = registry.unregister(&id);
    let ops = registry.assign(&claim, vec![row(2, "b", &id)]);
    assert_eq!(released_by(ops), [(2, here)]);
}

/// The attempts the committer is handed to release; any other op fails the test.
fn take_released(registry: &Registry) -> Vec<Arc<Attempt>> {
    registry
        .take_released()
        .into_iter()
        .map(|op| match op {
            Op::Finish {
                attempt,
                transition: Transition::Release,
                ..
            } => attempt,
            other => panic!("not a release: {other:?}"),
        })
        .collect()
}

/// The limits of the claims a plan would make now (their reservations undone).
fn planned_limits(registry: &Registry) -> Vec<u32> {
    registry.mark_all_due();
    let claims = registry.plan_claims(0, &[]);
    for c in &claims {
        registry.unreserve(c);
    }
    claims.iter().map(|c| c.limit).collect()
}

/// A claimed row of activity `activity_id` for worker `worker_id`.
fn row(id: i64, activity_id: &str, worker_id: &str) -> ActivityRow {
    crate::store::running_row_for_tests(id, activity_id, worker_id)
}

/// Whether the committer was woken since this was last asked (a wake-up is
/// kept until taken).
fn was_woken(registry: &Registry) -> bool {
    let woken = registry.woken();
    let mut woken = std::pin::pin!(woken);
    woken.as_mut().enable()
}

/// Rows claimed ahead hold their inputs in memory: past
/// [`MAX_AHEAD_BYTES`] a worker keeps no more of them (what a claim brought
/// beyond goes back uncounted), and plans ask for its free slots only.
#[test]
fn rows_ahead_hold_a_bounded_amount_of_memory() {
    let registry = Registry::new("n");
    let (id, _tx, _rx, _) = registry.register(registration(1), 0);
    registry.mark_all_due();
    let claim = registry.plan_claims(0, &[]).remove(0);
    let big = |n: i64| {
        let mut row = row(n, &format!("r{n}"), &id);
        row.input.data = vec![0; 4 * 1024 * 1024];
        row
    };
    let released = registry.assign(&claim, (1..=7).map(big).collect());
    // One runs; four (16 MiB) wait; two go back.
    assert_eq!(released.len(), 2);
    assert!(released.iter().all(|op| matches!(
        op,
        Op::Finish {
            transition: Transition::Release,
            ..
        }
    )));
    assert_eq!(registry.claimed_ahead(None), 4);
    let lock = registry.lock();
    let Some(worker) = lock.workers.get(&*id) else {
        panic!("registered")
    };
    assert_eq!(worker.wanted(), 0, "no room ahead, no free slot");
}

/// With two batches written at once, a claim takes half of a worker's room, so
/// the next batch can claim beside it; a short claim planned before a row came
/// due does not mark the group exhausted once a later plan has taken that mark.
#[test]
fn overlapping_claims_share_the_room_and_keep_due_marks() {
    let registry = Registry::new("n").with_writers(2);
    let (_id, _tx, _rx, _) = registry.register(registration(4), 0);
    registry.mark_all_due();
    let first = registry.plan_claims(0, &[]).remove(0);
    assert_eq!(first.limit, 2, "half of the room");
    // A row comes due while the first claim is written; the next plan takes
    // the mark and claims from what is left.
    registry.mark_due("default", "t");
    let second = registry.plan_claims(0, &[]).remove(0);
    assert_eq!(second.limit, 1, "half of what the first left");
    // The first finds nothing: it was planned before the row came due. The
    // loop is woken to plan again: the second plan had less room than the
    // first claim gives back now.
    let _ = was_woken(&registry);
    assert!(registry.assign(&first, Vec::new()).is_empty());
    assert!(was_woken(&registry), "woken to plan again");
    let third = registry.plan_claims(0, &[]);
    assert_eq!(
        third.iter().map(|c| c.limit).collect::<Vec<_>>(),
        [2],
        "not exhausted: the second claim may still find the row"
    );
    for c in &third {
        registry.unreserve(c);
    }
    // The second, planned after the mark, finds nothing either: exhausted.
    assert!(registry.assign(&second, Vec::new()).is_empty());
    assert!(registry.plan_claims(0, &[]).is_empty(), "exhausted");
}

/// With a claim of the group in flight, another is planned beside it only if
/// rows may be left for it: the group's last claim took all it asked for, or
/// a row came due since the last plan. A claim that lands full wakes the loop.
#[test]
fn a_claim_goes_beside_one_in_flight_only_when_rows_may_be_left() {
    let registry = Registry::new("n").with_writers(2);
    let (id, _tx, _rx, _) = registry.register(registration(8), 0);
    registry.mark_all_due();
    let first = registry.plan_claims(0, &[]).remove(0);
    assert_eq!(first.limit, 4, "half of the room");
    // Nothing says rows are left beyond what the first may take.
    assert!(registry.plan_claims(0, &[&first]).is_empty(), "none beside");
    // A row comes due: a claim goes beside.
    registry.mark_due("default", "t");
    let second = registry.plan_claims(0, &[&first]).remove(0);
    assert_eq!(second.limit, 2);
    // The first lands full: rows may be left, so the loop plans again, and
    // a claim goes beside the second while it is written.
    let _ = was_woken(&registry);
    let rows: Vec<_> = (1..=4).map(|i| row(i, &format!("a{i}"), &id)).collect();
    assert!(registry.assign(&first, rows).is_empty());
    assert!(was_woken(&registry), "woken to plan again");
    let third = registry.plan_claims(0, &[&second]).remove(0);
    assert_eq!(third.limit, 1);
    // The second lands short (after the mark it was planned at): the group is
    // exhausted, and nothing goes beside the third.
    assert!(registry.assign(&second, Vec::new()).is_empty());
    assert!(registry.plan_claims(0, &[&third]).is_empty(), "exhausted");
}

/// Slots: a claim reserves what is free; assigned attempts hold their slots
/// until answered, also after the server ended them; a short claim marks the
/// group exhausted until a row comes due; rows for a worker that is gone come
/// back as releases.
#[test]
fn slots_are_reserved_held_and_freed_exactly() {
    let registry = Registry::default();
    let (id, _tx, _rx, _) = registry.register(registration(3), 0);
    registry.mark_all_due();
    let claim = registry.plan_claims(0, &[]).remove(0);
    assert_eq!(claim.limit, 3);
    assert!(
        registry.plan_claims(0, &[]).is_empty(),
        "reserved slots are not planned twice"
    );
    // Two of three found: the group is exhausted until something comes due.
    let released = registry.assign(&claim, vec![row(1, "a", &id), row(2, "b", &id)]);
    assert!(released.is_empty());
    assert!(registry.plan_claims(0, &[]).is_empty(), "exhausted");
    assert_eq!(planned_limits(&registry), [1], "two held, one free");
    // The server ends attempt a (a cancel): its slot stays taken until answered.
    registry.cancel_running(
        &id,
        &Key {
            namespace: "default".into(),
            workflow_id: "wf".into(),
            activity_id: "a".into(),
        },
        1,
        "stop",
    );
    assert_eq!(planned_limits(&registry), [1]);
    assert_eq!(registry.running_count(), 1, "a no longer counts as running");
    assert!(matches!(registry.answer(&id, "wf", "a", 1), Answer::Ended));
    // Two free, and room ahead for two more: it answered one since the last
    // plan, so a slot may free again while the claim commits.
    assert_eq!(planned_limits(&registry), [2 + 2]);
    assert!(matches!(
        registry.answer(&id, "wf", "b", 1),
        Answer::Held(..)
    ));
    assert!(matches!(
        registry.answer(&id, "wf", "b", 1),
        Answer::Unknown
    ));
    assert_eq!(planned_limits(&registry), [3 + 2]);
    // The worker leaves mid-claim: what the claim took is released.
    registry.mark_all_due();
    let claim = registry.plan_claims(0, &[]).remove(0);
    registry.unregister(&id);
    let released = registry.assign(&claim, vec![row(3, "c", &id)]);
    assert!(matches!(
        released.as_slice(),
        [Op::Finish {
            transition: Transition::Release,
            ..
        }]
    ));
}

/// A worker with every slot busy whose results come in fast gets rows
/// claimed ahead; a result hands it the next one at once, with no commit in
/// between. Rows ahead never push it past its slots.
#[test]
fn a_freed_slot_takes_a_row_claimed_ahead_at_once() {
    let registry = Registry::default();
    let (id, _tx, mut rx, _) = registry.register(registration(2), 0);
    let plan = |registry: &Registry| {
        registry.mark_all_due();
        registry.plan_claims(0, &[])
    };
    let claim = plan(&registry).remove(0);
    assert_eq!(claim.limit, 2, "nothing answered yet: no room ahead");
    assert!(
        registry
            .assign(&claim, vec![row(1, "a", &id), row(2, "b", &id)])
            .is_empty()
    );
    assert_eq!(kinds(&mut rx), ["welcome", "task", "task"]);
    // One result; the next plan makes room ahead for two.
    assert!(matches!(
        registry.answer(&id, "wf", "a", 1),
        Answer::Held(..)
    ));
    let claim = plan(&registry).remove(0);
    assert_eq!(claim.limit, 1 + 2, "one free slot and two ahead");
    let rows = vec![row(3, "c", &id), row(4, "d", &id), row(5, "e", &id)];
    assert!(registry.assign(&claim, rows).is_empty());
    assert_eq!(kinds(&mut rx), ["task"], "c fills the free slot");
    assert_eq!(registry.claimed_ahead(None), 2);
    assert_eq!(registry.running_count(), 2);
    assert!(registry.holds(4, 1) && registry.holds(5, 1));
    // b answers: d is sent before anything is written.
    assert!(matches!(
        registry.answer(&id, "wf", "b", 1),
        Answer::Held(..)
    ));
    assert_eq!(kinds(&mut rx), ["task"]);
    assert_eq!(registry.claimed_ahead(None), 1);
    assert_eq!(registry.running_count(), 2, "never past its slots");
    assert!(matches!(
        registry.answer(&id, "wf", "d", 1),
        Answer::Held(..)
    ));
    assert_eq!(kinds(&mut rx), ["task"], "e, the last one ahead");
    assert_eq!(registry.claimed_ahead(None), 0);
    assert!(registry.take_released().is_empty(), "nothing given back");
}

/// However fast a worker answers, the room ahead is at most twice its slots a
/// round (with one batch written at a time, as here).
#[test]
fn rows_ahead_are_at_most_twice_the_slots() {
    let registry = Registry::default();
    let (id, _tx, _rx, _) = registry.register(registration(2), 0);
    let plan = |registry: &Registry| {
        registry.mark_all_due();
        registry.plan_claims(0, &[]).remove(0)
    };
    let claim = plan(&registry);
    assert!(
        registry
            .assign(&claim, vec![row(1, "a0", &id), row(2, "a1", &id)])
            .is_empty()
    );
    let answer = |i: i64| {
        assert!(matches!(
            registry.answer(&id, "wf", &format!("a{i}"), 1),
            Answer::Held(..)
        ));
    };
    answer(0);
    answer(1);
    let claim = plan(&registry);
    assert_eq!(claim.limit, 2 + 4, "two free, and twice the two answered");
    let rows = (2..8).map(|i| row(i + 1, &format!("a{i}"), &id)).collect();
    assert!(registry.assign(&claim, rows).is_empty());
    assert_eq!(registry.claimed_ahead(None), 4);
    // Six answered in one round: eight ahead would be asked for, four are.
    (2..8).for_each(answer);
    assert_eq!(registry.claimed_ahead(None), 0);
    assert_eq!(planned_limits(&registry), [2 + 4]);
}

/// A worker whose attempts are long answers nothing between plans, and the
/// room ahead shrinks to nothing: it holds no rows another worker could run.
#[test]
fn a_worker_of_long_attempts_claims_nothing_ahead() {
    let registry = Registry::default();
    let (id, _tx, _rx, _) = registry.register(registration(4), 0);
    registry.mark_all_due();
    let claim = registry.plan_claims(0, &[]).remove(0);
    let rows = (1..=4).map(|i| row(i, &format!("a{i}"), &id)).collect();
    assert!(registry.assign(&claim, rows).is_empty());
    for i in 1..=2 {
        assert!(matches!(
            registry.answer(&id, "wf", &format!("a{i}"), 1),
            Answer::Held(..)
        ));
    }
    assert_eq!(planned_limits(&registry), [2 + 4], "two free, four ahead");
    assert_eq!(planned_limits(&registry), [2 + 2], "quiet: halved");
    assert_eq!(planned_limits(&registry), [2 + 1]);
    assert_eq!(planned_limits(&registry), [2], "none ahead");
}

/// Rows claimed ahead that will not be sent go back for the committer to
/// release, uncounted: when the worker leaves, when a drain begins, when they
/// waited too long. One cancelled meanwhile is dropped, not released.
#[test]
fn rows_claimed_ahead_go_back_when_they_cannot_be_sent() {
    let registry = Registry::default();
    let released = |registry: &Registry| -> Vec<i64> {
        take_released(registry).iter().map(|a| a.id).collect()
    };
    // Both slots busy, two rows ahead.
    let busy_with_two_ahead = |first: i64| {
        let (id, tx, rx, _) = registry.register(registration(2), 0);
        registry.mark_all_due();
        let claim = registry.plan_claims(0, &[]).remove(0);
        let busy = vec![
            row(first, &format!("busy{first}"), &id),
            row(first + 100, "long", &id),
        ];
        assert!(registry.assign(&claim, busy).is_empty());
        assert!(matches!(
            registry.answer(&id, "wf", &format!("busy{first}"), 1),
            Answer::Held(..)
        ));
        registry.mark_all_due();
        let claim = registry.plan_claims(0, &[]).remove(0);
        assert_eq!(claim.limit, 3);
        let rows = (1..=3)
            .map(|i| row(first + i, &format!("r{}", first + i), &id))
            .collect();
        assert!(registry.assign(&claim, rows).is_empty());
        assert_eq!(registry.claimed_ahead(None), 2);
        (id, tx, rx)
    };

    let (id, _tx, _rx) = busy_with_two_ahead(10);
    registry.cancel_running(
        &id,
        &Key {
            namespace: "default".into(),
            workflow_id: "wf".into(),
            activity_id: "r12".into(),
        },
        1,
        "stop",
    );
    assert_eq!(
        registry.claimed_ahead(None),
        1,
        "the cancelled row is dropped"
    );
    registry.unregister(&id);
    assert_eq!(released(&registry), [13], "the worker left");

    let (id, _tx, _rx) = busy_with_two_ahead(20);
    let sweep = registry.sweep(Instant::now(), Duration::MAX, Duration::from_secs(3600));
    assert!(
        sweep.running.contains(&(22, 1)) && sweep.running.contains(&(23, 1)),
        "their leases are renewed while they wait"
    );
    assert!(released(&registry).is_empty());
    registry.sweep(
        Instant::now() + Duration::from_secs(3600),
        Duration::MAX,
        Duration::from_secs(3600),
    );
    assert_eq!(released(&registry), [22, 23], "they waited too long");
    registry.unregister(&id);
    assert!(released(&registry).is_empty());

    let (id, _tx, mut rx) = busy_with_two_ahead(30);
    kinds(&mut rx);
    registry.begin_drain(None);
    assert_eq!(released(&registry), [32, 33], "a drain");
    assert!(matches!(
        registry.answer(&id, "wf", "r31", 1),
        Answer::Held(..)
    ));
    assert_eq!(kinds(&mut rx), ["drain"], "nothing is sent once draining");
}

/// A row claimed ahead that waits before it is sent: its start-to-close
/// timeout runs from its dispatch, not from its claim.
#[tokio::test(start_paused = true)]
async fn timeouts_of_a_row_claimed_ahead_count_from_its_dispatch() {
    let registry = Registry::default();
    let (id, _tx, mut rx, _) = registry.register(registration(1), 0);
    let plan = |registry: &Registry| {
        registry.mark_all_due();
        registry.plan_claims(0, &[]).remove(0)
    };
    let claim = plan(&registry);
    assert!(registry.assign(&claim, vec![row(1, "a", &id)]).is_empty());
    assert!(matches!(
        registry.answer(&id, "wf", "a", 1),
        Answer::Held(..)
    ));
    let claim = plan(&registry);
    assert_eq!(claim.limit, 1 + 2, "a free slot, and two ahead");
    let mut busy = row(2, "busy", &id);
    busy.timeouts.start_to_close_ms = None;
    let mut ahead = row(3, "ahead", &id);
    ahead.timeouts.start_to_close_ms = Some(2_000);
    assert!(registry.assign(&claim, vec![busy, ahead]).is_empty());
    assert_eq!(registry.claimed_ahead(None), 1);
    kinds(&mut rx);
    // It waits 5 s ahead (past its start-to-close of 2 s), then is sent.
    tokio::time::advance(Duration::from_secs(5)).await;
    let timed_out = |at: Duration| -> Vec<(String, &'static str)> {
        registry
            .sweep(Instant::now() + at, Duration::MAX, Duration::MAX)
            .timed_out
            .into_iter()
            .map(|t| (t.attempt.key.activity_id.clone(), t.error_type))
            .collect()
    };
    assert!(
        timed_out(Duration::ZERO).is_empty(),
        "not sent: no clock yet"
    );
    assert!(matches!(
        registry.answer(&id, "wf", "busy", 1),
        Answer::Held(..)
    ));
    assert_eq!(kinds(&mut rx), ["task"], "sent at 5 s");
    assert!(
        timed_out(Duration::from_millis(1_900)).is_empty(),
        "1.9 s after its dispatch: still in time"
    );
    assert_eq!(
        timed_out(Duration::from_millis(2_100)),
        [("ahead".to_owned(), "StartToCloseTimeout")],
        "2 s after its dispatch"
    );
}

/// What this node ends on its own (a timeout, a drain's leftovers) is fenced
/// to rows still its own: a worker that resumed its session on another node
/// runs its attempt there.
#[tokio::test(start_paused = true)]
async fn timeouts_and_drain_leftovers_are_fenced_to_this_node() {
    let registry = Registry::default();
    let (id, _tx, _rx, _evict) = registry.register(registration(2), 0);
    registry.mark_all_due();
    let claim = registry.plan_claims(0, &[]).remove(0);
    let mut beats = row(1, "beats", &id);
    beats.timeouts.heartbeat_ms = Some(1_000);
    assert!(
        registry
            .assign(&claim, vec![beats, row(2, "left", &id)])
            .is_empty()
    );
    let this_node = Some(registry.node().clone());
    let sweep = registry.sweep(
        Instant::now() + Duration::from_secs(2),
        Duration::from_secs(10),
        Duration::MAX,
    );
    assert_eq!(
        sweep
            .timed_out
            .iter()
            .map(|t| t.attempt.owner_node.clone())
            .collect::<Vec<_>>(),
        std::slice::from_ref(&this_node)
    );
    let left = registry.end_all("stopping", false).release;
    assert_eq!(
        left.iter()
            .map(|a| a.owner_node.clone())
            .collect::<Vec<_>>(),
        [this_node]
    );
}

/// Every timeout kind and the eviction, walked on paused time: each fires at
/// its instant, once, and a heartbeat moves its deadline; no real sleep.
#[tokio::test(start_paused = true)]
async fn timeouts_and_eviction_walk_on_paused_time() {
    let registry = Registry::default();
    let (id, _tx, _rx, evict) = registry.register(registration(3), 0);
    registry.mark_all_due();
    let claim = registry.plan_claims(0, &[]).remove(0);
    let mut beats = row(1, "beats", &id);
    beats.timeouts.heartbeat_ms = Some(2_000);
    let mut slow = row(2, "slow", &id);
    slow.timeouts.start_to_close_ms = Some(5_000);
    // Started at wall time 0, due by 3,000: three seconds from dispatch.
    let mut late = row(3, "late", &id);
    late.expires_at = Some(3_000);
    assert!(registry.assign(&claim, vec![beats, slow, late]).is_empty());
    let silence = Duration::from_secs(10);
    let timed_out = |at: Duration| -> Vec<(String, &'static str, bool)> {
        registry
            .sweep(Instant::now() + at, silence, Duration::MAX)
            .timed_out
            .into_iter()
            .map(|t| (t.attempt.key.activity_id.clone(), t.error_type, t.final_))
            .collect()
    };
    tokio::time::advance(Duration::from_millis(1_500)).await;
    assert!(registry.heartbeat(&id, "wf", "beats", 1, None, Instant::now()));
    // Now at 1.5 s; offsets below are from here.
    assert!(
        timed_out(Duration::from_millis(1_000)).is_empty(),
        "2.5 s: none"
    );
    assert_eq!(
        timed_out(Duration::from_millis(1_600)),
        [("late".to_owned(), "ScheduleToCloseTimeout", true)],
        "3.1 s: schedule-to-close, for good"
    );
    assert_eq!(
        timed_out(Duration::from_millis(2_100)),
        [("beats".to_owned(), "HeartbeatTimeout", false)],
        "3.6 s: two seconds after the last heartbeat"
    );
    assert_eq!(
        timed_out(Duration::from_millis(3_600)),
        [("slow".to_owned(), "StartToCloseTimeout", false)],
        "5.1 s: start-to-close"
    );
    assert!(
        timed_out(Duration::from_millis(4_000)).is_empty(),
        "each ends once"
    );
    assert_eq!(registry.running_count(), 0);
    // Last heard from at 1.5 s: silent from 11.5 s, and lost on the sweep
    // after the one that first finds it so.
    let lost = |at: Duration| {
        registry
            .sweep(Instant::now() + at, silence, Duration::MAX)
            .lost_workers
    };
    assert!(lost(Duration::from_millis(9_900)).is_empty());
    assert!(lost(Duration::from_millis(10_000)).is_empty());
    assert!(!evict.is_cancelled());
    assert_eq!(lost(Duration::from_millis(10_025)).len(), 1);
    assert!(evict.is_cancelled(), "the session is told to end");
}

/// A worker running attempt 1 of `a`, which reported `details` at `now`; its
/// session may be resumed.
struct Reported {
    registry: Registry,
    id: Arc<str>,
    details: Payload,
    now: Instant,
    channel: (mpsc::Sender<Outgoing>, mpsc::Receiver<Outgoing>),
}

fn reported_details() -> Reported {
    let registry = Registry::default();
    let resumable = Registration {
        ticket: Some(Ticket::new("tokens[0]".into())),
        ..registration(1)
    };
    let (id, tx, rx, _) = registry.register(resumable, 0);
    registry.mark_all_due();
    let claim = registry.plan_claims(60_000, &[]).remove(0);
    assert!(registry.assign(&claim, vec![row(7, "a", &id)]).is_empty());
    let details = Payload {
        content_type: String::new(),
        data: b"50%".to_vec(),
    };
    let now = Instant::now();
    assert!(registry.heartbeat(&id, "wf", "a", 1, Some(details.clone()), now));
    Reported {
        registry,
        id,
        details,
        now,
        channel: (tx, rx),
    }
}

/// A worker that does not resume within its grace: details whose last write
/// failed are written by the tick that ends its attempts, ahead of the endings,
/// so the next attempt starts from them.
#[test]
fn details_of_an_abandoned_session_are_written_before_its_attempts_end() {
    let Reported {
        registry,
        id,
        details,
        now,
        channel,
    } = reported_details();
    let quiet = Duration::from_secs(60);
    let sweep = registry.sweep(now, quiet, Duration::MAX);
    registry.details_flushed(&sweep.flushed, false);
    assert!(registry.detach(&id, &channel.0, Duration::from_secs(1)));
    let sweep = registry.sweep(
        Instant::now() + Duration::from_secs(2),
        quiet,
        Duration::MAX,
    );
    assert_eq!(sweep.abandoned.len(), 1, "its grace ran out");
    let written: Vec<_> = sweep.heartbeats.iter().map(|h| h.details.clone()).collect();
    assert_eq!(written, [Some(details)]);
}

#[test]
fn a_heartbeat_without_details_keeps_what_was_reported() {
    let Reported {
        registry,
        id,
        details,
        now,
        ..
    } = reported_details();
    let quiet = Duration::from_secs(60);
    assert!(registry.heartbeat(&id, "wf", "a", 1, None, now));
    let sweep = registry.sweep(now, quiet, Duration::MAX);
    assert_eq!(sweep.heartbeats.len(), 1);
    assert_eq!(sweep.heartbeats[0].details.as_ref(), Some(&details));
    // Another bare heartbeat: nothing new to write.
    assert!(registry.heartbeat(&id, "wf", "a", 1, None, now));
    assert!(
        registry
            .sweep(now, quiet, Duration::MAX)
            .heartbeats
            .is_empty()
    );
    // The result still carries them: the sweep's write of them may land after
    // the result's ending, which fences it out.
    assert_eq!(carried(&registry, &id), Some(details));
}

/// The details attempt 1 of `a` answers with.
fn carried(registry: &Registry, id: &str) -> Option<Payload> {
    match registry.answer(id, "wf", "a", 1) {
        Answer::Held(_, carried) => carried,
        _ => panic!("the attempt is held"),
    }
}

/// An attempt that times out in the tick that takes its details: if that
/// tick's write fails, the attempt is stopped, yet its details are taken again
/// by the next tick (written before the attempt ends in the store, by the
/// tick or by its lease's reclaim, so the next attempt starts from them).
#[test]
fn details_of_a_timed_out_attempt_are_taken_again_after_a_failed_write() {
    let registry = Registry::default();
    let (id, _tx, _rx, _) = registry.register(registration(1), 0);
    registry.mark_all_due();
    let claim = registry.plan_claims(0, &[]).remove(0);
    let mut slow = row(7, "a", &id);
    slow.timeouts.start_to_close_ms = Some(1_000);
    assert!(registry.assign(&claim, vec![slow]).is_empty());
    let details = Payload {
        content_type: String::new(),
        data: b"90%".to_vec(),
    };
    let now = Instant::now();
    assert!(registry.heartbeat(&id, "wf", "a", 1, Some(details.clone()), now));
    let quiet = Duration::from_secs(60);
    let sweep = registry.sweep(now + Duration::from_secs(2), quiet, Duration::MAX);
    assert_eq!(sweep.timed_out.len(), 1);
    assert_eq!(sweep.heartbeats.len(), 1, "written before the ending");
    registry.details_flushed(&sweep.flushed, false);
    let again = registry.sweep(now + Duration::from_secs(3), quiet, Duration::MAX);
    assert!(again.timed_out.is_empty(), "stopped once");
    let taken: Vec<_> = again.heartbeats.into_iter().map(|h| h.details).collect();
    assert_eq!(taken, [Some(details)], "a failed write is taken again");
    registry.details_flushed(&again.flushed, true);
    assert!(
        registry
            .sweep(now + Duration::from_secs(4), quiet, Duration::MAX)
            .heartbeats
            .is_empty()
    );
}

/// Details whose flush failed are taken again by the next sweep; once known
/// stored, a result no longer carries them (nor does the registry keep them).
#[test]
fn details_are_carried_until_known_stored() {
    let Reported {
        registry, id, now, ..
    } = reported_details();
    let quiet = Duration::from_secs(60);
    let sweep = registry.sweep(now, quiet, Duration::MAX);
    assert_eq!(sweep.flushed.len(), 1);
    registry.details_flushed(&sweep.flushed, false);
    let again = registry.sweep(now, quiet, Duration::MAX);
    assert_eq!(again.heartbeats.len(), 1, "a failed flush is taken again");
    registry.details_flushed(&again.flushed, true);
    assert!(
        registry
            .sweep(now, quiet, Duration::MAX)
            .heartbeats
            .is_empty()
    );
    assert_eq!(carried(&registry, &id), None, "known stored");
}

/// What the server logs about an attempt is inside that attempt's span: its
/// identity, its worker, and the trace id of its `traceparent` header.
#[test]
fn an_attempts_events_carry_its_span_and_trace() {
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);
    impl std::io::Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::DEBUG)
        .finish();
    // Global, not scoped: a scoped subscriber races other tests' threads over
    // the callsites' cached interest. Other tests' events land here too; the
    // one looked for is told apart by its trace id.
    tracing::subscriber::set_global_default(subscriber)
        .unwrap_or_else(|e| panic!("only this test sets the global subscriber: {e}"));
    {
        let registry = Registry::default();
        let (id, _tx, _rx, _) = registry.register(registration(1), 0);
        registry.mark_all_due();
        let claim = registry.plan_claims(0, &[]).remove(0);
        let mut row = row(1, "a", &id);
        row.headers.insert(
            "traceparent".into(),
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".into(),
        );
        assert!(registry.assign(&claim, vec![row]).is_empty());
        let key = Key {
            namespace: "default".into(),
            workflow_id: "wf".into(),
            activity_id: "a".into(),
        };
        registry.cancel_running(&id, &key, 1, "no longer needed");
    }
    let log =
        String::from_utf8_lossy(&captured.0.lock().unwrap_or_else(|e| e.into_inner())).into_owned();
    let ended = log
        .lines()
        .find(|l| {
            l.contains("attempt ended by the server")
                && l.contains("trace_id=0af7651916cd43dd8448eb211c80319c")
        })
        .unwrap_or_else(|| panic!("no event: {log}"));
    for field in [
        "workflow_id=wf",
        "activity_id=a",
        "attempt=1",
        "trace_id=0af7651916cd43dd8448eb211c80319c",
        "kind=\"CANCEL_KIND_REQUESTED\"",
    ] {
        assert!(ended.contains(field), "{field} missing from {ended}");
    }
}

/// A claim in flight holds back another claim of its own group only: a group
/// beside it, in the same namespace, claims its free slot.
#[test]
fn a_claim_in_flight_holds_back_only_its_own_group() {
    let registry = Registry::default();
    let of_type = |t: &str| Registration {
        activity_types: vec![t.into()],
        ..registration(2)
    };
    let (a, _a_tx, _a_rx, _) = registry.register(of_type("a"), 0);
    let (b, _b_tx, _b_rx, _) = registry.register(of_type("b"), 0);
    registry.mark_all_due();
    let claims = registry.plan_claims(0, &[]);
    let claim_of = |id: &Arc<str>| {
        claims
            .iter()
            .find(|c| &c.worker_id == id)
            .cloned()
            .unwrap_or_else(|| panic!("no claim for {id}"))
    };
    let (for_a, for_b) = (claim_of(&a), claim_of(&b));
    // b's type comes due again while its claim is in flight: no room to plan.
    registry.mark_due("default", "b");
    assert!(registry.plan_claims(0, &[&for_a, &for_b]).is_empty());
    // b's claim lands short, but a row came due since: b is not exhausted.
    assert!(registry.assign(&for_b, vec![row(1, "b1", &b)]).is_empty());
    let planned: Vec<Arc<str>> = registry
        .plan_claims(0, &[&for_a])
        .into_iter()
        .map(|c| c.worker_id)
        .collect();
    assert_eq!(planned, [b], "a's claim in flight held b back");
}

/// A worker of several types has each first in its claims in turn, so no type
/// waits behind the others' backlog.
#[test]
fn a_workers_types_take_turns_first_in_its_claims() {
    let registry = Registry::default();
    let both = Registration {
        activity_types: vec!["a".into(), "b".into()],
        ..registration(1)
    };
    let (_id, _tx, _rx, _) = registry.register(both, 0);
    let mut firsts = Vec::new();
    for _ in 0..2 {
        registry.mark_all_due();
        let claim = registry.plan_claims(0, &[]).remove(0);
        firsts.push(claim.activity_types[0].to_string());
        registry.unreserve(&claim);
    }
    firsts.sort();
    assert_eq!(firsts, ["a", "b"]);
}
