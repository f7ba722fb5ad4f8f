//! The validator property: generated submits, absurd ones among them, through the
//! request validator and the store, each refused or stored and read back equal.

use proptest::{
    prelude::*,
    strategy::ValueTree,
    test_runner::{Config as Cases, RngAlgorithm, TestRng, TestRunner},
};
use spool_proto::v1::{RetryPolicy, SubmitRequest};

use super::{Raw, support::*};
use crate::{
    api::{self, validate},
    store::*,
};

/// Generated submits, absurd ones among them, through the request validator and
/// the store: each is refused (INVALID_ARGUMENT, or RESOURCE_EXHAUSTED for a
/// payload) or stored and read back equal. Inputs mix valid values with the edges
/// (control characters, lengths at and past the limits, negative and enormous
/// durations, invalid nanos, NaN).
pub(super) async fn every_submit_is_refused_or_stored_and_read_back_equal(
    store: &dyn Store,
    _raw: &Raw,
) {
    let request = submit_request();
    let mut config = crate::Config::new("unused");
    config.max_payload_bytes = 32;
    let mut runner = TestRunner::new_with_rng(
        Cases {
            cases: 200,
            ..Cases::default()
        },
        TestRng::deterministic_rng(RngAlgorithm::ChaCha),
    );
    let (mut stored, mut refused) = (0, 0);
    for case in 0..200 {
        let submitted = request
            .new_tree(&mut runner)
            .unwrap_or_else(|e| panic!("{e}"))
            .current();
        let shown = format!("{submitted:?}");
        let asked = submitted.clone();
        let new = match validate::submit(submitted, &config, T0) {
            Ok(new) => new,
            Err(api::Error::InvalidArgument(_) | api::Error::PayloadTooLarge { .. }) => {
                refused += 1;
                continue;
            }
            Err(other) => panic!("case {case}: {other} for {shown}"),
        };
        accepted_as_asked(case, &asked, &new, &shown);
        stored_and_read_back_equal(store, case, &asked, new, &shown).await;
        stored += 1;
    }
    eprintln!("validator property: {stored} stored, {refused} refused");
    assert!(
        stored > 20 && refused > 20,
        "stored {stored}, refused {refused}"
    );
}

/// What was accepted is what was asked for (empty ids and namespace filled in).
fn accepted_as_asked(case: i32, asked: &SubmitRequest, new: &NewActivity, shown: &str) {
    let same_or_generated = |asked: &str, got: &str| {
        if asked.is_empty() {
            uuid::Uuid::parse_str(got).is_ok()
        } else {
            asked == got
        }
    };
    assert!(
        same_or_generated(&asked.workflow_id, &new.key.workflow_id)
            && same_or_generated(&asked.activity_id, &new.key.activity_id),
        "case {case}: ids changed: {shown}"
    );
    let namespace = if asked.namespace.is_empty() {
        "default"
    } else {
        asked.namespace.as_str()
    };
    assert_eq!(new.key.namespace, namespace, "case {case}");
    assert_eq!(
        (&new.activity_type, &new.input, new.priority),
        (
            &asked.activity_type,
            &asked.input.clone().unwrap_or_default(),
            asked.priority
        ),
        "case {case}"
    );
}

/// Stores what the validator accepted, under a key of its own, and reads it back
/// equal to what was sent.
async fn stored_and_read_back_equal(
    store: &dyn Store,
    case: i32,
    asked: &SubmitRequest,
    mut new: NewActivity,
    shown: &str,
) {
    // Each case a key of its own: the generated ids may repeat.
    new.key.workflow_id = format!("{case}-{}", new.key.workflow_id);
    new.key.workflow_id = validate::truncate(new.key.workflow_id, validate::MAX_NAME_BYTES);
    let outcome = store
        .apply(vec![Op::Submit(vec![new.clone()])].into(), T0)
        .await
        .unwrap_or_else(|e| {
            panic!("case {case}: the store refused a valid submit: {e} for {shown}")
        });
    assert!(
        matches!(&outcome[..], [Outcome::Submitted(s)] if s[0].created),
        "case {case}: {outcome:?}"
    );
    let row = store
        .get(&new.key)
        .await
        .unwrap_or_else(|e| panic!("case {case}: {e} for {shown}"))
        .unwrap_or_else(|| panic!("case {case}: not stored: {shown}"));
    let read_back = (
        &row.key,
        &row.activity_type,
        &row.input,
        row.next_at,
        &row.retry,
        row.timeouts,
        row.priority,
        row.expires_at,
        row.status,
        &row.headers,
        &row.concurrency_key,
        &row.fairness_key,
    );
    let sent = (
        &new.key,
        &new.activity_type,
        &new.input,
        new.next_at,
        &new.retry,
        new.timeouts,
        new.priority,
        change::expires_at(T0, new.timeouts.schedule_to_close_ms),
        ActivityStatus::Scheduled,
        &asked.headers.clone().into_iter().collect::<Headers>(),
        &Some(asked.concurrency_key.clone()).filter(|k| !k.is_empty()),
        &Some(asked.fairness_key.clone()).filter(|k| !k.is_empty()),
    );
    assert_eq!(read_back, sent, "case {case}: {shown}");
}

/// A submit request of generated fields, every edge among them.
fn submit_request() -> impl Strategy<Value = SubmitRequest> {
    let payload = proptest::option::of(
        (text(), proptest::collection::vec(any::<u8>(), 0..64))
            .prop_map(|(content_type, data)| Payload { content_type, data }),
    );
    let namespace = prop_oneof![4 => Just(String::new()), 8 => "[a-z]{1,8}", 1 => text()];
    (
        (namespace, text(), text(), text()),
        payload,
        (duration(), duration(), duration(), duration()),
        retry_policy(),
        any::<i32>(),
    )
        .prop_map(
            |(
                (namespace, workflow_id, activity_id, activity_type),
                input,
                d,
                retry_policy,
                priority,
            )| {
                SubmitRequest {
                    namespace,
                    workflow_id,
                    activity_id,
                    activity_type,
                    input,
                    delay: d.0,
                    retry_policy,
                    heartbeat_timeout: d.1,
                    start_to_close_timeout: d.2,
                    schedule_to_close_timeout: d.3,
                    priority,
                    // Every other one carries headers, a W3C traceparent among them.
                    headers: if priority % 2 == 0 {
                        [
                            ("tenant".to_owned(), format!("t{priority}")),
                            (
                                "traceparent".to_owned(),
                                "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
                                    .to_owned(),
                            ),
                        ]
                        .into()
                    } else {
                        Default::default()
                    },
                    concurrency_key: if priority % 3 == 0 {
                        format!("customer-{priority}")
                    } else {
                        String::new()
                    },
                    // Every fifth one has a fairness key, some with a weight out
                    // of range.
                    fairness_key: if priority % 5 == 0 {
                        format!("tenant-{}", priority % 4)
                    } else {
                        String::new()
                    },
                    fairness_weight: if priority % 5 == 0 {
                        priority.unsigned_abs() % 1_200
                    } else {
                        0
                    },
                }
            },
        )
}

/// A retry policy, or none.
fn retry_policy() -> impl Strategy<Value = Option<RetryPolicy>> {
    proptest::option::of(
        (
            prop_oneof![
                10 => Just(0u32),
                20 => 1u32..20,
                2 => Just(10_000),
                1 => Just(10_001),
                1 => Just(u32::MAX)
            ],
            duration(),
            prop_oneof![
                10 => Just(0.0f64),
                20 => 1.0f64..3.0,
                2 => Just(100.0),
                1 => Just(0.5),
                1 => Just(f64::NAN),
                1 => Just(f64::INFINITY),
                1 => Just(100.5)
            ],
            duration(),
            proptest::collection::vec("[A-Za-z]{1,10}|\\PC{0,5}", 0..3),
        )
            .prop_map(
                |(max_attempts, initial, coefficient, max, types)| RetryPolicy {
                    max_attempts,
                    initial_interval: initial,
                    backoff_coefficient: coefficient,
                    max_interval: max,
                    non_retryable_error_types: types,
                },
            ),
    )
}

/// Mostly valid, so that both outcomes are common; every edge shows up.
fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        24 => "[a-z0-9._-]{1,20}",
        8 => "\\PC{1,30}",
        1 => Just(String::new()),
        1 => "[a-zA-Z0-9 ._/-]{250,260}",
        1 => ".{0,12}",
        1 => "[a-z]{1,5}[\\x00-\\x1f\\x7f][a-z]{0,5}",
    ]
}

/// A duration, or none; some negative, enormous or with invalid nanos.
fn duration() -> impl Strategy<Value = Option<prost_types::Duration>> {
    let seconds = prop_oneof![
        40 => 0i64..5_000,
        2 => Just(10 * 365 * 86_400),
        1 => Just(10 * 365 * 86_400 + 1),
        1 => -5i64..0,
        1 => Just(i64::MAX),
        1 => Just(i64::MIN),
        1 => 1_000_000_000_000i64..1_000_000_000_001,
    ];
    let nanos = prop_oneof![
        20 => Just(0i32),
        20 => 0i32..1_000_000_000,
        1 => Just(1_000_000_000),
        1 => Just(-1)
    ];
    proptest::option::weighted(
        0.4,
        (seconds, nanos).prop_map(|(seconds, nanos)| prost_types::Duration { seconds, nanos }),
    )
}
