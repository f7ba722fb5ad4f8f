//! Tests of `validate`.

use super::*;

#[test]
fn namespaces() {
    assert_eq!(namespace("").ok().as_deref(), Some("default"));
    assert!(namespace("prod-eu.1_a").is_ok());
    assert!(namespace("has space").is_err());
    assert!(namespace(&"a".repeat(65)).is_err());
    assert!(namespace("ünï").is_err());
}

#[test]
fn names() {
    assert!(name("f", "ok").is_ok());
    assert!(name("f", "").is_err());
    assert!(name("f", &"x".repeat(256)).is_err());
    assert!(name("f", &"x".repeat(255)).is_ok());
    assert!(name("f", "tab\there").is_err());
    assert!(name("f", "nul\0here").is_err());
}

#[test]
fn free_text_allows_line_breaks_but_not_nul() {
    assert!(text("reason", "two\nlines\twith tab\r\n", 100).is_ok());
    assert!(text("reason", "nul\0", 100).is_err());
    assert!(text("reason", "bell\u{7}", 100).is_err());
    assert!(text("reason", "escape\u{1b}[0m", 100).is_err());
    assert!(text("reason", &"x".repeat(101), 100).is_err());
}

#[test]
fn a_set_fairness_weight_names_its_key_and_stays_in_range() {
    let asked = |key: &str, weight: u32| {
        fairness_weight(Some(v1::FairnessWeight {
            namespace: String::new(),
            activity_type: "t".into(),
            fairness_key: key.into(),
            weight,
            ..Default::default()
        }))
    };
    assert_eq!(
        asked("tenant", 3).ok(),
        Some(FairnessWeight {
            namespace: "default".into(),
            activity_type: "t".into(),
            key: "tenant".into(),
            weight: 3,
        })
    );
    assert!(asked("tenant", 1_000).is_ok());
    assert!(asked("tenant", 0).is_err());
    assert!(asked("tenant", 1_001).is_err());
    assert!(asked("", 3).is_err());
    assert!(asked("nul\0", 3).is_err());
    assert!(fairness_weight(None).is_err());
}

#[test]
fn a_fairness_weight_needs_its_key_and_stays_in_range() {
    let config = Config::new("sqlite://x.db");
    let asked = |key: &str, weight: u32| {
        submit(
            v1::SubmitRequest {
                activity_type: "email.send".into(),
                fairness_key: key.into(),
                fairness_weight: weight,
                ..Default::default()
            },
            &config,
            0,
        )
        .map(|n| n.fairness)
    };
    let fair = |weight| {
        Some(Fairness {
            key: "t".into(),
            weight,
        })
    };
    assert_eq!(asked("", 0).ok(), Some(None));
    assert_eq!(asked("t", 0).ok(), Some(fair(1)), "0 is weight 1");
    assert_eq!(asked("t", 1_000).ok(), Some(fair(1_000)));
    for (key, weight, says) in [
        ("", 2, "give the fairness_key"),
        ("t", 1_001, "from 1 to 1000"),
        ("a\u{7}b", 1, "fairness_key"),
    ] {
        match asked(key, weight) {
            Err(Error::InvalidArgument(message)) => {
                assert!(message.contains(says), "{key:?} {weight}: {message}")
            }
            other => panic!("{key:?} {weight}: {other:?}"),
        }
    }
}

#[test]
fn worker_text_is_sanitised_not_refused() {
    assert_eq!(worker_text("a\0b\nc".to_owned(), 100), "a\u{fffd}b\nc");
    assert_eq!(worker_text("nul\0only".to_owned(), 100), "nul\u{fffd}only");
    assert_eq!(worker_text("plain".to_owned(), 100), "plain");
    assert_eq!(worker_text("héllo".to_owned(), 2), "h");
    let mut p = Payload {
        content_type: "text/\0plain\n".to_owned(),
        data: Vec::new(),
    };
    worker_content_type(&mut p);
    assert_eq!(p.content_type, "text/\u{fffd}plain ");
}

#[test]
fn durations_are_bounded() {
    let d = |seconds, nanos| prost_types::Duration { seconds, nanos };
    assert!(duration("f", Some(&d(-1, 0))).is_err());
    assert!(duration("f", Some(&d(0, -1))).is_err());
    assert!(duration("f", Some(&d(1, 1_000_000_000))).is_err());
    assert!(duration("f", Some(&d(i64::MAX, 0))).is_err());
    assert!(duration("f", Some(&d(1_000_000_000_000, 0))).is_err());
    let max = i64::try_from(MAX_DURATION.as_secs()).unwrap_or(i64::MAX);
    assert_eq!(
        duration("f", Some(&d(max, 0))).ok().flatten(),
        Some(MAX_DURATION)
    );
    assert!(duration("f", Some(&d(max, 1))).is_err());
    assert_eq!(worker_delay(Some(&d(i64::MAX, 0))), MAX_DURATION);
    assert_eq!(worker_delay(Some(&d(-5, 0))), Duration::ZERO);
}

#[test]
fn hello_caps_concurrency_and_types() {
    let hello_with = |types: usize, max_concurrency: u32| v1::Hello {
        activity_types: (0..types).map(|i| format!("t{i}")).collect(),
        max_concurrency,
        ..Default::default()
    };
    let granted = hello(hello_with(1, u32::MAX), 64).map(|r| r.max_concurrency);
    assert_eq!(granted.ok(), Some(64));
    let granted = hello(hello_with(1, 0), 64).map(|r| r.max_concurrency);
    assert_eq!(granted.ok(), Some(1));
    assert!(hello(hello_with(MAX_HELLO_TYPES, 1), 64).is_ok());
    assert!(hello(hello_with(MAX_HELLO_TYPES + 1, 1), 64).is_err());
    let bad_identity = v1::Hello {
        identity: "host\0".to_owned(),
        ..hello_with(1, 1)
    };
    assert!(hello(bad_identity, 64).is_err());
}

#[test]
fn retry_policy_defaults_and_bounds() {
    let d = RetryDefaults::default();
    let spec = retry_policy(None, &d).map_err(|e| e.to_string());
    assert_eq!(spec.as_ref().map(|s| s.max_attempts), Ok(10));
    let too_many = v1::RetryPolicy {
        max_attempts: 10_001,
        ..Default::default()
    };
    assert!(retry_policy(Some(&too_many), &d).is_err());
    for coefficient in [0.5, f64::NAN, f64::INFINITY, 100.5, -1.0] {
        let bad_coefficient = v1::RetryPolicy {
            backoff_coefficient: coefficient,
            ..Default::default()
        };
        assert!(
            retry_policy(Some(&bad_coefficient), &d).is_err(),
            "{coefficient}"
        );
    }
    let negative = v1::RetryPolicy {
        initial_interval: Some(prost_types::Duration {
            seconds: -1,
            nanos: 0,
        }),
        ..Default::default()
    };
    assert!(retry_policy(Some(&negative), &d).is_err());
    let many_types = v1::RetryPolicy {
        non_retryable_error_types: vec!["X".to_owned(); MAX_NON_RETRYABLE_TYPES + 1],
        ..Default::default()
    };
    assert!(retry_policy(Some(&many_types), &d).is_err());
}

/// The limits are part of the documented contract (docs/SECURITY.md).
#[test]
fn the_documented_limits() {
    assert_eq!(MAX_NAME_BYTES, 255);
    assert_eq!(MAX_NAMESPACE_BYTES, 64);
    assert_eq!(MAX_MESSAGE_BYTES, 32_768);
    assert_eq!(MAX_ATTEMPTS, 10_000);
    assert_eq!(MAX_NON_RETRYABLE_TYPES, 100);
    assert_eq!(MAX_DURATION, Duration::from_secs(315_360_000));
    assert_eq!(MAX_BATCH, 10_000);
    assert_eq!(MAX_PAGE, 1_000);
    assert_eq!(MAX_PAGE_BYTES, 3_145_728);
    assert_eq!(MAX_HELLO_TYPES, 1_000);
    assert_eq!(MAX_WORKER_CONCURRENCY, 10_000);
    assert_eq!(DEFAULT_WORKER_CONCURRENCY, 1_000);
}

fn d(seconds: i64, nanos: i32) -> Option<prost_types::Duration> {
    Some(prost_types::Duration { seconds, nanos })
}

/// Header keys are lowercase tokens, values text without control characters,
/// and their number and size are bounded.
#[test]
fn headers_are_bounded_and_well_formed() {
    let one = |k: &str, v: &str| headers([(k.to_owned(), v.to_owned())].into());
    assert!(
        one(
            "traceparent",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
        )
        .is_ok()
    );
    assert!(one("x-tenant.id_2", "acme corp").is_ok());
    for bad_key in ["", "Tenant", "a b", "ü", &"k".repeat(129)] {
        assert!(one(bad_key, "v").is_err(), "{bad_key:?}");
    }
    assert!(one("k", "line\nbreak").is_err());
    let many: std::collections::HashMap<String, String> =
        (0..65).map(|i| (format!("k{i}"), String::new())).collect();
    assert!(headers(many).is_err(), "more than 64");
    let big = [("k".to_owned(), "v".repeat(16 * 1024))].into();
    assert!(headers(big).is_err(), "over 16 KiB together");
}

/// A submit resolves to exactly what it asked for, defaults filled in.
#[test]
fn a_submit_resolves_to_what_it_asked_for() {
    let config = Config::new("sqlite://x.db");
    let request = v1::SubmitRequest {
        headers: [("tenant".to_owned(), "acme".to_owned())].into(),
        concurrency_key: "customer-7".into(),
        fairness_key: "tenant-1".into(),
        fairness_weight: 3,
        namespace: "orders".into(),
        workflow_id: "wf-1".into(),
        activity_id: "act-1".into(),
        activity_type: "email.send".into(),
        input: Some(Payload {
            content_type: "text/plain".into(),
            data: b"hi".to_vec(),
        }),
        delay: d(2, 500_000_000),
        retry_policy: Some(v1::RetryPolicy {
            max_attempts: 4,
            initial_interval: d(3, 0),
            backoff_coefficient: 1.5,
            max_interval: d(60, 0),
            non_retryable_error_types: vec!["Fatal".into()],
        }),
        heartbeat_timeout: d(10, 0),
        start_to_close_timeout: d(0, 1_000_000),
        schedule_to_close_timeout: d(0, 0),
        priority: -7,
    };
    let new = submit(request, &config, 1_000).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        new.key,
        Key {
            namespace: "orders".into(),
            workflow_id: "wf-1".into(),
            activity_id: "act-1".into(),
        }
    );
    assert_eq!(new.activity_type, "email.send");
    assert_eq!(new.input.data, b"hi");
    assert_eq!(new.input.content_type, "text/plain");
    assert_eq!(new.next_at, 3_500, "now plus the delay, in milliseconds");
    assert_eq!(
        new.timeouts,
        Timeouts {
            heartbeat_ms: Some(10_000),
            start_to_close_ms: Some(1),
            schedule_to_close_ms: None,
        },
        "a zero timeout is no timeout"
    );
    assert_eq!(new.priority, -7);
    assert_eq!(new.concurrency_key.as_deref(), Some("customer-7"));
    assert_eq!(
        new.fairness,
        Some(Fairness {
            key: "tenant-1".into(),
            weight: 3
        })
    );
    assert_eq!(
        new.retry,
        RetrySpec {
            max_attempts: 4,
            initial_interval_ms: 3_000,
            backoff_coefficient: 1.5,
            max_interval_ms: 60_000,
            non_retryable: vec!["Fatal".into()],
        }
    );
    // Empty ids are generated, as UUIDv7s; empty namespace is the default.
    let bare = submit(
        v1::SubmitRequest {
            activity_type: "t".into(),
            ..Default::default()
        },
        &config,
        0,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(bare.key.namespace, "default");
    for id in [&bare.key.workflow_id, &bare.key.activity_id] {
        let uuid = uuid::Uuid::parse_str(id).unwrap_or_else(|e| panic!("{id}: {e}"));
        assert_eq!(uuid.get_version_num(), 7);
    }
    assert_ne!(bare.key.workflow_id, bare.key.activity_id);
    assert_eq!(bare.input, Payload::default());
    assert_eq!(bare.next_at, 0);
}

#[test]
fn retry_policy_defaults_fill_zeroes_and_bounds_are_inclusive() {
    let defaults = RetryDefaults::default();
    let resolve = |p: v1::RetryPolicy| retry_policy(Some(&p), &defaults);
    let zero = resolve(v1::RetryPolicy::default()).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        zero,
        RetrySpec {
            max_attempts: 10,
            initial_interval_ms: 1_000,
            backoff_coefficient: 2.0,
            max_interval_ms: 300_000,
            non_retryable: Vec::new(),
        }
    );
    // An initial interval above the default maximum lifts the maximum with it.
    let long = resolve(v1::RetryPolicy {
        initial_interval: d(600, 0),
        ..Default::default()
    })
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        (long.initial_interval_ms, long.max_interval_ms),
        (600_000, 600_000)
    );
    // Equal initial and maximum is allowed; a maximum below the initial is not.
    let bounded = |max| v1::RetryPolicy {
        initial_interval: d(5, 0),
        max_interval: d(max, 0),
        ..Default::default()
    };
    assert!(resolve(bounded(5)).is_ok());
    assert!(resolve(bounded(4)).is_err());
    let at_the_limits = v1::RetryPolicy {
        max_attempts: MAX_ATTEMPTS,
        non_retryable_error_types: vec!["X".into(); MAX_NON_RETRYABLE_TYPES],
        ..Default::default()
    };
    assert!(resolve(at_the_limits).is_ok());
    assert_eq!(
        resolve(v1::RetryPolicy {
            backoff_coefficient: 1.0,
            ..Default::default()
        })
        .map(|r| r.backoff_coefficient)
        .ok(),
        Some(1.0)
    );
}

#[test]
fn sizes_and_lengths_are_inclusive_limits() {
    let payload = |n: usize| Payload {
        content_type: String::new(),
        data: vec![0; n],
    };
    assert!(check_size("f", &payload(10), 10).is_ok());
    assert!(matches!(
        check_size("f", &payload(11), 10),
        Err(Error::PayloadTooLarge {
            size: 11,
            limit: 10,
            ..
        })
    ));
    assert!(check_size("f", &payload(0), 10).is_ok());
    assert!(text("reason", &"x".repeat(100), 100).is_ok());
    let kept = self::payload("input", Some(payload(3)), 10).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(kept.data.len(), 3);
    assert!(self::payload("input", Some(payload(11)), 10).is_err());
    assert_eq!(millis(Duration::from_millis(1_234)), 1_234);
    assert_eq!(millis(Duration::MAX), i64::MAX);
    assert_eq!(optional_ms("t", d(0, 0).as_ref()).ok(), Some(None));
    assert_eq!(
        optional_ms("t", d(1, 500_000_000).as_ref()).ok(),
        Some(Some(1_500))
    );
    assert_eq!(optional_ms("t", None).ok(), Some(None));
}

#[test]
fn truncate_respects_char_boundaries() {
    assert_eq!(truncate("héllo".to_owned(), 2), "h");
    assert_eq!(truncate("abc".to_owned(), 5), "abc");
}
