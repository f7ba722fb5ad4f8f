//! The `spool` client subcommands against a real server process: output, JSON, exit
//! codes, and errors a person can act on.

use std::process::Output;

use crate::support::*;

pub async fn spool(env: &Env, args: &[&str]) -> Output {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_spool"))
        .arg("--server")
        .arg(env.url())
        .args(args)
        .output()
        .await
        .expect("run spool")
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Fails the test unless `o`'s stderr says `text`.
fn assert_says(o: &Output, text: &str) {
    let said = stderr(o);
    assert!(said.contains(text), "expected {text:?} in: {said}");
}

fn json(o: &Output) -> serde_json::Value {
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {}", stdout(o)))
}

#[tokio::test(flavor = "multi_thread")]
async fn the_client_subcommands_work_and_fail_clearly() {
    let env = Env::new();
    let server = env.server(&[]);
    server.client().await;

    let out = spool(
        &env,
        &[
            "submit",
            "greet",
            "--input",
            r#"{"name":"Ada"}"#,
            "--workflow-id",
            "w",
            "--activity-id",
            "a",
        ],
    )
    .await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out).trim(), "submitted default/w/a");
    let again = spool(
        &env,
        &[
            "submit",
            "greet",
            "--workflow-id",
            "w",
            "--activity-id",
            "a",
        ],
    )
    .await;
    assert_eq!(stdout(&again).trim(), "exists default/w/a");

    let got = json(&spool(&env, &["--json", "get", "w", "a"]).await);
    assert_eq!(
        (got["status"].as_str(), got["input"]["name"].as_str()),
        (Some("SCHEDULED"), Some("Ada"))
    );
    let table = stdout(&spool(&env, &["get", "w", "a"]).await);
    assert!(table.contains("status        SCHEDULED"), "{table}");

    let input = env.file("input.json", br#"{"name":"Bob"}"#);
    let out = spool(
        &env,
        &[
            "submit",
            "greet",
            "--input",
            &format!("@{}", input.display()),
            "--workflow-id",
            "w",
            "--activity-id",
            "b",
            "--fairness-key",
            "tenant-b",
            "--fairness-weight",
            "2",
        ],
    )
    .await;
    assert!(out.status.success(), "{}", stderr(&out));
    let got = json(&spool(&env, &["--json", "get", "w", "b"]).await);
    assert_eq!(got["fairness_key"], "tenant-b");
    let table = stdout(&spool(&env, &["get", "w", "b"]).await);
    assert!(table.contains("fairness      tenant-b"), "{table}");
    // An operator's weight for the key, listed, then deleted.
    let set = spool(
        &env,
        &[
            "fairness-weight",
            "set",
            "greet",
            "--key",
            "tenant-b",
            "--weight",
            "7",
        ],
    )
    .await;
    assert!(set.status.success(), "{}", stderr(&set));
    assert!(stdout(&set).contains("tenant-b"), "{}", stdout(&set));
    let listed = json(&spool(&env, &["--json", "fairness-weight", "list"]).await);
    assert_eq!(listed["fairness_weights"][0]["fairness_key"], "tenant-b");
    assert_eq!(listed["fairness_weights"][0]["weight"], 7);
    // With its current use: b waits (a has no fairness key).
    assert_eq!(listed["fairness_weights"][0]["waiting"], 1);
    let table = stdout(&spool(&env, &["fairness-weight", "list"]).await);
    assert!(
        table.contains("WAITING") && table.contains("tenant-b      7       1"),
        "{table}"
    );
    let refused = spool(
        &env,
        &[
            "fairness-weight",
            "set",
            "greet",
            "--key",
            "tenant-b",
            "--weight",
            "0",
        ],
    )
    .await;
    assert!(!refused.status.success());
    assert_says(&refused, "weight is 0");
    let deleted = spool(
        &env,
        &["fairness-weight", "delete", "greet", "--key", "tenant-b"],
    )
    .await;
    assert!(
        stdout(&deleted).contains("no fairness weight now"),
        "{}",
        stdout(&deleted)
    );
    let listed = json(&spool(&env, &["--json", "fairness-weight", "list"]).await);
    assert_eq!(listed["fairness_weights"], serde_json::json!([]));
    let alone = spool(&env, &["submit", "greet", "--fairness-weight", "2"]).await;
    assert_eq!(alone.status.code(), Some(2), "a weight needs its key");
    assert_says(&alone, "--fairness-key");

    let listed = json(
        &spool(
            &env,
            &["--json", "ls", "--status", "scheduled", "--type", "greet"],
        )
        .await,
    );
    assert_eq!(listed["activities"].as_array().map(Vec::len), Some(2));
    let stats = json(&spool(&env, &["--json", "stats"]).await);
    assert_eq!(stats["scheduled"], 2);

    let cancelled =
        json(&spool(&env, &["--json", "cancel", "w", "b", "--reason", "not now"]).await);
    assert_eq!(cancelled["status"], "CANCELLED");
    let retried = json(&spool(&env, &["--json", "retry", "w", "b"]).await);
    assert_eq!(retried["status"], "SCHEDULED");

    // Waiting: completed exits 0, a dead letter exits 3.
    let _worker = in_process_worker(&server, "greet");
    let done = spool(
        &env,
        &[
            "--json",
            "submit",
            "greet",
            "--workflow-id",
            "w",
            "--activity-id",
            "c",
            "--wait",
        ],
    )
    .await;
    assert_eq!(done.status.code(), Some(0), "{}", stderr(&done));
    assert_eq!(json(&done)["status"], "COMPLETED");
    let waited = spool(&env, &["wait", "w", "a", "--timeout", "5s"]).await;
    assert!(waited.status.success());
    spool(
        &env,
        &[
            "submit",
            "unserved",
            "--workflow-id",
            "w",
            "--activity-id",
            "d",
        ],
    )
    .await;
    spool(&env, &["cancel", "w", "d"]).await;
    let failed = spool(&env, &["wait", "w", "d"]).await;
    assert_eq!(
        failed.status.code(),
        Some(3),
        "a CANCELLED activity exits 3"
    );
    let listed = stdout(&spool(&env, &["ls", "--status", "cancelled"]).await);
    assert!(
        listed.contains("LAST_ERROR") && listed.contains("Cancelled: cancelled by request"),
        "ls shows the last error: {listed}"
    );

    let workers = json(&spool(&env, &["--json", "workers"]).await);
    assert_eq!(workers["workers"][0]["identity"], "in-process");

    // Errors: not found, bad input, server down.
    let missing = spool(&env, &["get", "w", "nope"]).await;
    assert_eq!(missing.status.code(), Some(5));
    assert_says(&missing, "NotFound");
    assert_says(&missing, "default/w/nope");
    let bad = spool(&env, &["submit", "greet", "--input", "{not json"]).await;
    assert_eq!(bad.status.code(), Some(2));
    assert_says(&bad, "--input is not valid JSON");
    let down = tokio::process::Command::new(env!("CARGO_BIN_EXE_spool"))
        .args(["--server", "http://127.0.0.1:1", "stats"])
        .output()
        .await
        .expect("run spool");
    assert_eq!(down.status.code(), Some(6));
    assert_says(&down, "cannot reach the Spool server");

    let drained = spool(&env, &["drain", "--timeout", "1s"]).await;
    assert!(drained.status.success(), "{}", stderr(&drained));
    assert!(
        stdout(&drained).starts_with("drained:"),
        "{}",
        stdout(&drained)
    );
}

/// Every exit code a client command documents, a key pasted back from the CLI's own
/// output, `host:port` without a scheme, a port that does not speak gRPC, and a
/// drained node resumed.
#[tokio::test(flavor = "multi_thread")]
async fn exit_codes_pasted_keys_addresses_and_resume() {
    let env = Env::new();
    let server = env.server(&[]);
    server.client().await;

    // The key exactly as `submit` printed it (the input defaults to `{}`).
    let out = spool(&env, &["submit", "greet"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let printed = stdout(&out);
    let key = printed
        .trim()
        .strip_prefix("submitted ")
        .unwrap_or_else(|| panic!("{printed}"))
        .to_owned();
    assert!(key.starts_with("default/"), "{key}");
    let got = spool(&env, &["get", &key]).await;
    assert_eq!(got.status.code(), Some(0), "{}", stderr(&got));
    assert!(stdout(&got).contains(&format!("key           {key}")));
    assert!(
        stdout(&got).contains("attempt       0 (0 of 10 counted)"),
        "{}",
        stdout(&got)
    );
    let shown = json(&spool(&env, &["--json", "get", &key]).await);
    assert_eq!(shown["input"], serde_json::json!({}));

    // 4: nobody serves `greet` here, so the wait times out.
    let timed_out = spool(&env, &["wait", &key, "--timeout", "300ms"]).await;
    assert_eq!(timed_out.status.code(), Some(4), "{}", stderr(&timed_out));
    assert!(stdout(&timed_out).contains("SCHEDULED"));
    // 5: no such activity.
    let missing = spool(&env, &["get", "default/w/none"]).await;
    assert_eq!(missing.status.code(), Some(5));
    // 2: usage, refused before anything is sent.
    let zero = spool(&env, &["submit", "greet", "--max-attempts", "0"]).await;
    assert_eq!(zero.status.code(), Some(2));
    assert_says(&zero, "--max-attempts");
    let malformed = spool(&env, &["get", "justone"]).await;
    assert_eq!(malformed.status.code(), Some(2));
    assert_says(&malformed, "NAMESPACE/WORKFLOW_ID/ACTIVITY_ID");
    // 1: the server refuses (the key exists with another type).
    let (_, rest) = key.split_once('/').unwrap_or_default();
    let (workflow, activity) = rest.rsplit_once('/').unwrap_or_default();
    let conflict = spool(
        &env,
        &[
            "submit",
            "other",
            "--workflow-id",
            workflow,
            "--activity-id",
            activity,
        ],
    )
    .await;
    assert_eq!(conflict.status.code(), Some(1), "{}", stderr(&conflict));
    assert_says(&conflict, "AlreadyExists");

    // SPOOL_NAMESPACE: where neither the key nor a flag names one.
    let in_namespace = |args: &[&str]| {
        let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_spool"));
        command
            .args(args)
            .args(["--server", &env.url()])
            .env("SPOOL_NAMESPACE", "team-a");
        async move { command.output().await.expect("run spool") }
    };
    let out = in_namespace(&[
        "submit",
        "greet",
        "--workflow-id",
        "nw",
        "--activity-id",
        "na",
    ])
    .await;
    assert_eq!(
        stdout(&out).trim(),
        "submitted team-a/nw/na",
        "{}",
        stderr(&out)
    );
    assert_eq!(in_namespace(&["get", "nw/na"]).await.status.code(), Some(0));
    assert_eq!(spool(&env, &["get", "nw/na"]).await.status.code(), Some(5));
    assert_eq!(
        spool(&env, &["get", "team-a/nw/na"]).await.status.code(),
        Some(0)
    );

    // host:port means plaintext http://.
    let bare = env.url().trim_start_matches("http://").to_owned();
    let plain = tokio::process::Command::new(env!("CARGO_BIN_EXE_spool"))
        .args(["stats", "--server", &bare])
        .output()
        .await
        .expect("run spool");
    assert_eq!(plain.status.code(), Some(0), "{}", stderr(&plain));
    // 6: a port that answers, but not in gRPC.
    let not_grpc = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let address = not_grpc.local_addr().expect("address").to_string();
    // Every connection is answered, however often the client dials again: a
    // refused one would read as "unreachable" (exit 1), not as this answer.
    std::thread::spawn(move || {
        use std::io::Write;
        for stream in not_grpc.incoming().flatten() {
            let mut stream = stream;
            let _ = stream.write_all(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n");
        }
    });
    let wrong = tokio::process::Command::new(env!("CARGO_BIN_EXE_spool"))
        .args(["stats", "--server", &address])
        .output()
        .await
        .expect("run spool");
    assert_eq!(wrong.status.code(), Some(6), "{}", stderr(&wrong));
    assert_says(&wrong, "does not speak gRPC");

    // Drained: stats says so and nothing runs; resumed: a worker takes the activity.
    let drained = spool(&env, &["drain", "--timeout", "1s"]).await;
    assert!(drained.status.success(), "{}", stderr(&drained));
    let stats = json(&spool(&env, &["--json", "stats"]).await);
    assert_eq!(stats["draining"], true);
    assert!(stdout(&spool(&env, &["workers"]).await).contains("draining"));
    let resumed = spool(&env, &["resume"]).await;
    assert_eq!(resumed.status.code(), Some(0), "{}", stderr(&resumed));
    assert!(
        stdout(&resumed).starts_with("resumed"),
        "{}",
        stdout(&resumed)
    );
    let stats = json(&spool(&env, &["--json", "stats"]).await);
    assert_eq!(stats["draining"], false);
    let again = spool(&env, &["resume"]).await;
    assert!(
        stdout(&again).contains("was not draining"),
        "{}",
        stdout(&again)
    );
    let _worker = in_process_worker(&server, "greet");
    let done = spool(&env, &["wait", &key, "--timeout", "20s"]).await;
    assert_eq!(done.status.code(), Some(0), "{}", stdout(&done));
    assert!(stdout(&done).contains("COMPLETED"));
}

/// `--help` of every command describes every flag, and `serve` lists only its own.
#[tokio::test(flavor = "multi_thread")]
async fn help_describes_every_flag_and_serve_shows_only_its_own() {
    let help = |args: &'static [&'static str]| async move {
        let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_spool"))
            .args(args)
            .output()
            .await
            .expect("run spool");
        assert!(out.status.success());
        stdout(&out)
    };
    let completions = help(&["completions", "bash"]).await;
    assert!(completions.contains("_spool"), "{completions}");
    let serve = help(&["serve", "--help"]).await;
    assert!(serve.contains("--listen") && serve.contains("--database"));
    assert!(serve.contains("postgres://"), "{serve}");
    for client_only in ["--server ", "--token ", "--json", "--ca-cert "] {
        assert!(
            !serve.contains(client_only),
            "serve --help shows {client_only}"
        );
    }
    for command in [
        &["submit", "--help"][..],
        &["get", "--help"],
        &["wait", "--help"],
        &["cancel", "--help"],
        &["retry", "--help"],
        &["ls", "--help"],
        &["stats", "--help"],
        &["workers", "--help"],
        &["drain", "--help"],
        &["resume", "--help"],
        &["completions", "--help"],
        &["bench", "--help"],
        &["soak", "--help"],
    ] {
        let text = help(command).await;
        // Each option and argument says something about itself: on its own line
        // after two spaces, or on the next line, indented.
        let lines: Vec<&str> = text.lines().collect();
        for (i, line) in lines.iter().enumerate() {
            let item = line.trim_start();
            // Options and arguments are indented 2 or 6; their wrapped text, 10.
            let indent = line.len() - item.len();
            let starts_item =
                item.starts_with('-') || item.starts_with('<') || item.starts_with('[');
            if indent >= 10 || !starts_item {
                continue;
            }
            let same_line = item
                .split_once("  ")
                .is_some_and(|(_, d)| !d.trim().is_empty());
            let next_line = lines.get(i + 1).is_some_and(|next| {
                let next = next.trim_start();
                !next.is_empty() && !next.starts_with('-')
            });
            assert!(same_line || next_line, "{command:?}: undescribed: {line:?}");
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_client_asks_for_a_token_when_one_is_required() {
    let env = Env::new();
    let _server = env.server(&["--auth-token", "s3cret-token-0123456789"]);
    let anonymous = eventually("the server to answer", || async {
        let out = spool(&env, &["stats"]).await;
        (out.status.code() == Some(1) && stderr(&out).contains("Unauthenticated")).then_some(out)
    })
    .await;
    assert_says(&anonymous, "--token");
    let with_token = spool(&env, &["--token", "s3cret-token-0123456789", "stats"]).await;
    assert!(with_token.status.success(), "{}", stderr(&with_token));
}

/// `spool serve` with a setting it cannot run with exits at once, non-zero,
/// naming the flag; a database password never reaches its log.
#[tokio::test(flavor = "multi_thread")]
async fn serve_refuses_bad_flags_at_start_naming_the_flag() {
    let env = Env::new();
    let database = format!("sqlite://{}", env.file("unused.db", b"").display());
    let missing = env.file("x", b"").with_file_name("missing.pem");
    let missing = missing.to_string_lossy();
    let not_pem = env.file("not.pem", b"hello");
    let not_pem = not_pem.to_string_lossy();
    let cases: [(&[&str], &str); 9] = [
        (&["--heartbeat-interval", "0s"], "--heartbeat-interval"),
        (
            &["--heartbeat-interval", "5s", "--lease-timeout", "1s"],
            "--lease-timeout",
        ),
        (&["--auth-token", "short"], "--auth-token"),
        (&["--max-connections", "0"], "--max-connections"),
        (
            &["--max-worker-concurrency", "99999999"],
            "--max-worker-concurrency",
        ),
        (&["--request-timeout", "0s"], "--request-timeout"),
        (&["--tokens-file", &missing], "tokens file"),
        (
            &["--tls-cert", &missing, "--tls-key", &missing],
            "--tls-cert",
        ),
        (
            &["--tls-cert", &not_pem, "--tls-key", &not_pem],
            "not a PEM file",
        ),
    ];
    for (args, named) in cases {
        let started = std::time::Instant::now();
        let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_spool"))
            .args(["serve", "--listen", "127.0.0.1:0", "--database", &database])
            .args(args)
            .output()
            .await
            .expect("run spool serve");
        assert_ne!(out.status.code(), Some(0), "{args:?} must not start");
        assert!(out.status.code().is_some(), "{args:?} exits, not killed");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(named), "{args:?}: {stderr}");
        assert!(
            started.elapsed() < std::time::Duration::from_secs(10),
            "{args:?} took {:?}",
            started.elapsed()
        );
    }
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_spool"))
        .args(["serve", "--listen", "not-an-address"])
        .output()
        .await
        .expect("run spool serve");
    assert_eq!(out.status.code(), Some(2), "clap refuses the address");
    assert!(String::from_utf8_lossy(&out.stderr).contains("--listen"));
    // The password of an unreachable PostgreSQL URL is not printed.
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_spool"))
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--database",
            "postgres://spool:hunter2-secret@127.0.0.1:1/spool",
        ])
        .env("RUST_LOG", "debug")
        .output()
        .await
        .expect("run spool serve");
    assert_ne!(out.status.code(), Some(0));
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!all.contains("hunter2-secret"), "{all}");
}

/// The CLI over TLS and mutual TLS, certificates made in the test.
#[tokio::test(flavor = "multi_thread")]
async fn the_cli_speaks_tls_and_mutual_tls() {
    let env = Env::new();
    let pki = spool_testkit::pki::Pki::new(&env.file("x", b"").with_file_name(""));
    let path = |p: &std::path::Path| p.to_string_lossy().into_owned();
    let (cert, key, ca) = (path(&pki.server_cert), path(&pki.server_key), path(&pki.ca));
    let https = env.url().replace("http://", "https://");
    let cli = |args: Vec<String>| async move {
        tokio::process::Command::new(env!("CARGO_BIN_EXE_spool"))
            .args(args)
            .output()
            .await
            .expect("run spool")
    };
    let args = |extra: &[&str]| -> Vec<String> {
        let mut all = vec!["--server".to_owned(), https.clone()];
        all.extend(extra.iter().map(|s| s.to_string()));
        all
    };
    {
        let _server = env.server(&["--tls-cert", &cert, "--tls-key", &key]);
        let ok = eventually("the TLS server to answer", || {
            let args = args(&["--ca-cert", &ca, "stats"]);
            async move {
                let out = cli(args).await;
                out.status.success().then_some(out)
            }
        })
        .await;
        assert!(stdout(&ok).contains("SCHEDULED"), "{}", stdout(&ok));
        let untrusted = cli(args(&["stats"])).await;
        assert_eq!(untrusted.status.code(), Some(6), "{}", stderr(&untrusted));
        // http:// with TLS settings is refused, not sent in clear text.
        let plain = cli(vec![
            "--server".into(),
            env.url(),
            "--ca-cert".into(),
            ca.clone(),
            "stats".into(),
        ])
        .await;
        assert_eq!(plain.status.code(), Some(2));
        assert!(stderr(&plain).contains("https://"), "{}", stderr(&plain));
    }
    let env = Env::new();
    let https = env.url().replace("http://", "https://");
    let args = |extra: &[&str]| -> Vec<String> {
        let mut all = vec!["--server".to_owned(), https.clone()];
        all.extend(extra.iter().map(|s| s.to_string()));
        all
    };
    let _server = env.server(&[
        "--tls-cert",
        &cert,
        "--tls-key",
        &key,
        "--tls-client-ca",
        &ca,
    ]);
    let (client_cert, client_key) = (path(&pki.client_cert), path(&pki.client_key));
    eventually(
        "the mTLS server to answer a client with a certificate",
        || {
            let args = args(&[
                "--ca-cert",
                &ca,
                "--client-cert",
                &client_cert,
                "--client-key",
                &client_key,
                "stats",
            ]);
            async move { cli(args).await.status.success().then_some(()) }
        },
    )
    .await;
    let anonymous = cli(args(&["--ca-cert", &ca, "stats"])).await;
    assert_eq!(
        anonymous.status.code(),
        Some(6),
        "no client certificate: {}",
        stderr(&anonymous)
    );
    assert_says(&anonymous, "--client-cert");
}

/// Runs `spool --json bench` with `args`, which must succeed, and returns its report.
async fn bench(args: &[&str]) -> serde_json::Value {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_spool"))
        .args(["--json", "bench"])
        .args(args)
        .output()
        .await
        .expect("run spool bench");
    assert!(out.status.success(), "{}", stderr(&out));
    serde_json::from_str(&stdout(&out)).expect("JSON report")
}

/// `spool bench --json --nodes 1` runs its phases on a `spool serve` process of
/// its own and reports each phase's rate and what it cost: the server's CPU apart
/// from the workers', per 10,000 activities, and its SQLite writer thread's.
#[tokio::test]
async fn bench_reports_rates_and_the_server_s_and_workers_cpu_per_10k() {
    let report = bench(&[
        "--nodes",
        "1",
        "--activities",
        "4000",
        "--phases",
        "drain,e2e",
    ])
    .await;
    for phase in ["drain", "end_to_end"] {
        let result = &report[phase];
        assert_eq!(result["count"], 4000, "{phase}: {result}");
        assert!(result["per_second"].as_f64().unwrap() > 0.0, "{phase}");
        let cpu = &result["cpu"];
        let per_10k = |part: &str| cpu[part]["seconds_per_10k"].as_f64();
        let (Some(server), Some(workers)) = (per_10k("node-0"), per_10k("bench")) else {
            panic!("{phase}: the server's and the workers' CPU per 10k: {cpu}");
        };
        assert!(server > 0.0 && workers > 0.0, "{phase}: {cpu}");
        let seconds = cpu["node-0"]["seconds"].as_f64().unwrap();
        assert!(
            (seconds * 10_000.0 / 4000.0 - server).abs() < 0.01,
            "{phase}: per 10k is the phase's seconds scaled: {cpu}"
        );
        let writer = cpu["node-0 SQLite writer"]["seconds"].as_f64();
        assert!(
            writer.is_some_and(|w| w <= seconds),
            "{phase}: the writer's CPU, a part of the server's: {cpu}"
        );
    }
    assert!(
        report.get("submit").is_none() && report.get("latency").is_none(),
        "only the phases asked for"
    );
}

/// `spool bench --nodes 2` spreads its workers over two `spool serve` processes
/// on one PostgreSQL and reports each node's rate, which add up to the phase's,
/// and each node's CPU apart.
#[tokio::test]
#[cfg_attr(not(spool_test_postgres), ignore = "needs PostgreSQL: docs/TESTING.md")]
async fn bench_on_two_nodes_reports_each_node_s_rate_and_cpu() {
    let database = postgres_schema().await;
    let report = bench(&[
        "--nodes",
        "2",
        "--workers",
        "2",
        "--activities",
        "2000",
        "--phases",
        "drain",
        "--database",
        &database,
    ])
    .await;
    let drain = &report["drain"];
    assert_eq!(drain["count"], 2000, "{drain}");
    let per_node: Vec<f64> = drain["per_node"]
        .as_array()
        .unwrap_or_else(|| panic!("per_node: {drain}"))
        .iter()
        .map(|rate| rate.as_f64().unwrap())
        .collect();
    assert_eq!(per_node.len(), 2, "{drain}");
    let total = drain["per_second"].as_f64().unwrap();
    let sum: f64 = per_node.iter().sum();
    assert!(
        (sum - total).abs() <= total * 0.01,
        "the nodes' rates add up to the phase's: {drain}"
    );
    // The workers connect as the phase starts, so either node may have had
    // little to do: its CPU is only known to be read, apart from the other's.
    for node in ["node-0", "node-1"] {
        let seconds = drain["cpu"][node]["seconds"].as_f64();
        assert!(seconds.is_some_and(|s| s >= 0.0), "{node}'s CPU: {drain}");
    }
}
