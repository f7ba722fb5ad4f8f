//! Tests of `config`.

use super::*;

#[test]
fn passwords_never_reach_a_log_line() {
    assert_eq!(
        redact_url("postgres://spool:s3cret@db.example:5432/spool?sslmode=require"),
        "postgres://spool:***@db.example:5432/spool?sslmode=require"
    );
    assert_eq!(
        redact_url("postgres://db/spool?user=a&password=s3cret"),
        "postgres://db/spool?user=a&password=***"
    );
    assert_eq!(
        redact_url("postgresql://p%40ss:x@y@host/db"),
        "postgresql://p%40ss:***@host/db"
    );
    assert_eq!(redact_url("sqlite://spool.db"), "sqlite://spool.db");
    assert!(!redact_url("postgres://u:hunter2@h/d").contains("hunter2"));
    assert!(!redact_url("postgres://u:pa/ss?w@h/d").contains("pa/ss"));
}

#[test]
fn absurd_settings_name_their_flag() {
    type Break = fn(&mut Config);
    let bad: [(&str, Break); 8] = [
        ("--heartbeat-interval", |c| {
            c.heartbeat_interval = Duration::ZERO
        }),
        ("--lease-timeout", |c| {
            c.lease_timeout = Duration::from_millis(1500)
        }),
        ("--auth-token", |c| c.auth_token = Some("short".to_owned())),
        ("--max-payload-bytes", |c| c.max_payload_bytes = 0),
        ("--max-connections", |c| c.limits.max_connections = 0),
        ("--max-worker-concurrency", |c| {
            c.limits.max_worker_concurrency = u32::MAX
        }),
        ("--priority-aging", |c| {
            c.priority_aging = Some(Duration::from_micros(500))
        }),
        ("--priority-aging", |c| {
            c.priority_aging = Some(Duration::from_secs(2 * 86_400))
        }),
    ];
    for (flag, break_it) in bad {
        let mut config = Config::new("sqlite://x.db");
        break_it(&mut config);
        let err = config.check().err().map(|e| e.to_string());
        assert!(
            err.as_deref().is_some_and(|e| e.starts_with(flag)),
            "{flag}: {err:?}"
        );
    }
    assert!(Config::new("sqlite://x.db").check().is_ok());
}
