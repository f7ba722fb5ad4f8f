//! Worker sessions across nodes: a lost session's ending is fenced to its node,
//! and a session is taken over once, with its ticket, by its own caller.

use std::sync::Arc;

use super::{Raw, support::*};
use crate::store::*;

pub(super) async fn a_lost_sessions_ending_is_fenced_to_its_node(store: &dyn Store, _raw: &Raw) {
    submit(store, new("a", "t")).await;
    let row = claim(store, &["t"], 1, T0).await.remove(0);
    let lost = |node: &str| Op::Finish {
        attempt: Arc::new(Attempt {
            owner_node: Some(node.into()),
            ..Attempt::from_row(&row)
        }),
        transition: Transition::Release,
        lease_expired_by: None,
    };
    assert!(
        matches!(
            one(store, lost("node-b"), T0 + 1).await,
            Outcome::Finished { accepted: false }
        ),
        "not node-b's row"
    );
    assert!(matches!(
        one(store, lost("node-a"), T0 + 2).await,
        Outcome::Finished { accepted: true }
    ));
}

pub(super) async fn a_session_is_taken_over_once_with_its_ticket(store: &dyn Store, _raw: &Raw) {
    submit(store, new("a", "t")).await;
    claim(store, &["t"], 1, T0).await;
    let ticket = |secret: &str, caller: &str| SessionTicket {
        worker_id: "w1".into(),
        secret: secret.into(),
        caller: caller.into(),
        registration: "default|t|1".into(),
        at: T0,
    };
    let take = |old: &str, new: &str, caller: &str| TakeSession {
        ticket: ticket(new, caller),
        old_secret: old.into(),
        node: "node-b".into(),
    };
    store
        .save_ticket(&ticket("s1", "tokens[0]"))
        .await
        .unwrap_or_else(|e| panic!("save: {e}"));
    let taken = |t: TakeSession| async move {
        store
            .take_session(&t)
            .await
            .unwrap_or_else(|e| panic!("take: {e}"))
    };
    if store.single_node() {
        // One node holds every session: there is nothing to take over.
        assert!(taken(take("s1", "s2", "tokens[0]")).await.is_none());
        return;
    }
    assert!(taken(take("forged", "s2", "tokens[0]")).await.is_none());
    assert!(
        taken(take("s1", "s2", "tokens[1]")).await.is_none(),
        "bound to its caller"
    );
    let rows = taken(take("s1", "s2", "tokens[0]")).await;
    assert_eq!(
        rows.map(|r| r
            .iter()
            .map(|r| (r.key.activity_id.clone(), r.attempt))
            .collect::<Vec<_>>()),
        Some(vec![("a".to_owned(), 1)])
    );
    assert!(
        taken(take("s1", "s3", "tokens[0]")).await.is_none(),
        "a ticket is used once"
    );
    // The rows are node-b's now: node-a's ending of its lost session changes nothing.
    let row = get(store, "a").await;
    let lost = Op::Finish {
        attempt: Arc::new(Attempt {
            owner_node: Some("node-a".into()),
            ..Attempt::from_row(&row)
        }),
        transition: Transition::Release,
        lease_expired_by: None,
    };
    assert!(matches!(
        one(store, lost, T0 + 1).await,
        Outcome::Finished { accepted: false }
    ));
}
