//! The dashboard in a real browser: headless Chromium (Debian's `chromium` and
//! `chromium-driver`) driven over WebDriver, against a `spool serve` process with
//! real workers. Each page loads and shows the live state; a dead letter is
//! re-driven from the page and completes; markup in a payload stays text; a
//! read-only token changes nothing.
//!
//! With `SPOOL_UPDATE_SCREENSHOTS=1` the screenshots go to `docs/screenshots/`;
//! otherwise into the test's temporary directory.

use std::{
    os::unix::process::CommandExt,
    path::PathBuf,
    process::{Child, Command, Stdio},
};

use fantoccini::{Client, ClientBuilder, Locator};
use spool_proto::v1;

use crate::support::*;

const ADMIN: &str = "admin-token-0123456789";
const VIEWER: &str = "viewer-token-0123456789";
const CHROMEDRIVER: &str = "/usr/bin/chromedriver";
const CHROMIUM: &str = "/usr/bin/chromium";

/// Chromium under ChromeDriver, both stopped when dropped: ChromeDriver runs in a
/// process group of its own, with the Chromium processes it starts, and the whole
/// group is killed (killing ChromeDriver alone left Chromium running).
struct Browser {
    client: Client,
    driver: Child,
    _profile: tempfile::TempDir,
    shots: PathBuf,
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-KILL", "--", &format!("-{}", self.driver.id())])
            .stderr(Stdio::null())
            .status();
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

impl Browser {
    async fn start(shots: PathBuf) -> Self {
        let port = free_port();
        let driver = Command::new(CHROMEDRIVER)
            .arg(format!("--port={port}"))
            .process_group(0)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot start {CHROMEDRIVER} ({e}): apt-get install chromium chromium-driver"
                )
            });
        let profile = tempfile::tempdir().expect("profile dir");
        let args = [
            "--headless=new".to_owned(),
            "--no-sandbox".to_owned(),
            "--disable-gpu".to_owned(),
            "--disable-dev-shm-usage".to_owned(),
            "--disable-quic".to_owned(),
            "--no-first-run".to_owned(),
            // This machine's network is closed: no calls home.
            "--disable-background-networking".to_owned(),
            "--disable-component-update".to_owned(),
            "--disable-sync".to_owned(),
            "--window-size=1280,900".to_owned(),
            format!("--user-data-dir={}", profile.path().display()),
        ];
        let mut caps = serde_json::Map::new();
        caps.insert(
            "goog:chromeOptions".into(),
            serde_json::json!({ "binary": CHROMIUM, "args": args }),
        );
        let url = format!("http://127.0.0.1:{port}");
        let client = eventually("ChromeDriver to start a session", || {
            let caps = caps.clone();
            let url = url.clone();
            async move {
                ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
                    .capabilities(caps)
                    .connect(&url)
                    .await
                    .ok()
            }
        })
        .await;
        Browser {
            client,
            driver,
            _profile: profile,
            shots,
        }
    }

    async fn goto(&self, url: &str) {
        self.client.goto(url).await.expect("goto");
    }

    /// The first element matching `css`, once there.
    async fn find(&self, css: &str) -> fantoccini::elements::Element {
        self.client
            .wait()
            .at_most(WAIT)
            .for_element(Locator::Css(css))
            .await
            .unwrap_or_else(|e| panic!("{css} never appeared: {e}"))
    }

    async fn text(&self, css: &str) -> String {
        self.find(css).await.text().await.expect("text")
    }

    /// Runs `script` (a function body) in the page and returns what it returns.
    async fn eval(&self, script: &str) -> serde_json::Value {
        self.client
            .execute(script, Vec::new())
            .await
            .unwrap_or_else(|e| panic!("script failed ({e}): {script}"))
    }

    /// Waits until `script` returns true.
    async fn until(&self, what: &str, script: &str) {
        eventually(what, || async {
            (self.eval(script).await == serde_json::Value::Bool(true)).then_some(())
        })
        .await;
    }

    async fn sign_in(&self, base: &str, token: &str) {
        self.goto(&format!("{base}/")).await;
        let field = self.find("#token").await;
        field.send_keys(token).await.expect("type the token");
        self.find("#sign-in").await.click().await.expect("sign in");
        self.find("#app-view:not([hidden])").await;
    }

    async fn shot(&self, name: &str) {
        let png = self.client.screenshot().await.expect("screenshot");
        std::fs::create_dir_all(&self.shots).expect("screenshots dir");
        std::fs::write(self.shots.join(format!("{name}.png")), png).expect("write screenshot");
    }
}

fn screenshots(env: &Env) -> PathBuf {
    if std::env::var("SPOOL_UPDATE_SCREENSHOTS").as_deref() == Ok("1") {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/screenshots")
    } else {
        env.path("screenshots")
    }
}

/// A server with an admin and a viewer token, its dashboard's URL, and an admin
/// client.
async fn dashboard(env: &Env, extra: &[&str]) -> (ServerProcess, String, spool_client::Client) {
    let tokens = serde_json::json!({ "tokens": [
        { "token": ADMIN, "role": "admin" },
        { "token": VIEWER, "role": "viewer" },
    ]});
    let file = env.file("tokens.json", tokens.to_string().as_bytes());
    let ui = format!("127.0.0.1:{}", free_port());
    let mut args = vec![
        "--tokens-file",
        file.to_str().expect("utf-8 path"),
        "--ui-listen",
        &ui,
        "--node-name",
        "node-ui",
    ];
    args.extend_from_slice(extra);
    let server = env.server(&args);
    let client = eventually("the server to answer", || async {
        let client = spool_client::Client::builder(server.url.clone())
            .token(ADMIN)
            .connect()
            .await
            .ok()?;
        client.stats("default").await.ok()?;
        Some(client)
    })
    .await;
    (server, format!("http://{ui}"), client)
}

fn key(activity_id: &str) -> v1::ActivityKey {
    v1::ActivityKey {
        namespace: "default".into(),
        workflow_id: "p".into(),
        activity_id: activity_id.into(),
    }
}

async fn submit(client: &spool_client::Client, request: v1::SubmitRequest) {
    let mut request = request;
    request.namespace = "default".into();
    client
        .submit(request)
        .await
        .unwrap_or_else(|e| panic!("submit: {e}"));
}

async fn finished(client: &spool_client::Client, id: &str) -> v1::Activity {
    client
        .wait(key(id), Some(WAIT))
        .await
        .unwrap_or_else(|e| panic!("wait {id}: {e}"))
}

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(not(spool_test_browser), ignore = "needs Chromium: docs/TESTING.md")]
async fn every_page_works_in_a_real_browser_and_a_dead_letter_is_redriven() {
    let env = Env::new();
    let (server, base, client) = dashboard(&env, &[]).await;
    let _worker = observed_worker_with_token(&server, Some(ADMIN));
    let mut hostile = quick_retry_request("echo", "hostile", 3);
    hostile.input = spool_worker::json(&serde_json::json!({
        "name": "<script>window.pwned = true</script><img src=x onerror=\"window.pwned = true\">"
    }))
    .ok();
    submit(&client, hostile).await;
    submit(&client, quick_retry_request("flaky", "flaky", 5)).await;
    for id in ["poison", "poison-2"] {
        submit(&client, quick_retry_request("poison", id, 5)).await;
    }
    for id in ["idle-1", "idle-2"] {
        submit(&client, quick_retry_request("idle", id, 3)).await;
    }
    for id in ["hostile", "flaky", "poison", "poison-2"] {
        finished(&client, id).await;
    }

    let browser = Browser::start(screenshots(&env)).await;
    browser.sign_in(&base, ADMIN).await;
    assert_eq!(
        browser.text("#whoami").await.split(' ').next(),
        Some("admin")
    );

    // Overview: the backlog of a type nobody serves, and what completed.
    browser.find("[data-page=overview]").await;
    let idle = browser.text("#types tr[data-type=idle]").await;
    assert!(idle.contains('2'), "two due idle activities: {idle}");
    browser.find("#types tr[data-type=echo]").await;
    browser.shot("overview").await;

    // Activities: every submitted one is listed, newest first.
    browser
        .find("#nav-activities")
        .await
        .click()
        .await
        .expect("nav");
    browser.find("[data-page=activities]").await;
    for k in ["p/hostile", "p/flaky", "p/poison", "p/idle-1"] {
        browser
            .find(&format!("#activities tr[data-key=\"{k}\"]"))
            .await;
    }
    browser.shot("activities").await;
    // Search by status narrows it.
    browser
        .goto(&format!("{base}/#/activities?status=FAILED"))
        .await;
    browser.find("#activities tr[data-key=\"p/poison\"]").await;
    browser
        .until(
            "only the failed ones to be listed",
            "return document.querySelectorAll('#activities tbody tr[data-key]').length === 2",
        )
        .await;

    // The three-attempt history, as the API has it.
    browser
        .goto(&format!("{base}/#/activity?ns=default&wf=p&id=flaky"))
        .await;
    browser.find("#history tr[data-attempt=\"3\"]").await;
    let rows = browser
        .eval(
            "return [...document.querySelectorAll('#history tr[data-attempt]')].map(r => r.textContent)",
        )
        .await;
    let rows: Vec<String> = serde_json::from_value(rows).expect("rows");
    assert_rows_say(
        &rows,
        &[
            &["retried", "attempt 1 fails", "observed"],
            &["retried", "attempt 2 fails", "observed"],
            &["completed", "node-ui", "observed"],
        ],
    );
    browser
        .eval("document.getElementById('history').scrollIntoView(); return true")
        .await;
    browser.shot("activity-history").await;

    // Markup in a payload is shown as text and never runs.
    browser
        .goto(&format!("{base}/#/activity?ns=default&wf=p&id=hostile"))
        .await;
    let input = browser.text("#input pre").await;
    assert!(
        input.contains("<script>window.pwned = true</script>"),
        "{input}"
    );
    let output = browser.text("#output pre").await;
    assert!(output.contains("<img src=x"), "{output}");
    let injected = browser
        .eval(
            "return [window.pwned === undefined, \
                     document.querySelectorAll('#page script, #page img').length]",
        )
        .await;
    assert_eq!(injected, serde_json::json!([true, 0]));
    browser.shot("activity-payload").await;

    // An activity's keys are among its facts.
    let mut keyed = quick_retry_request("unserved", "keyed", 3);
    keyed.concurrency_key = "customer-7".into();
    keyed.fairness_key = "tenant-a".into();
    submit(&client, keyed).await;
    browser
        .goto(&format!("{base}/#/activity?ns=default&wf=p&id=keyed"))
        .await;
    browser
        .until(
            "the activity's keys to be shown",
            "return (document.querySelector('dl.facts')?.textContent || '').includes('tenant-a')",
        )
        .await;
    let facts = browser.text("dl.facts").await;
    for shown in ["Concurrency key", "customer-7", "Fairness key", "tenant-a"] {
        assert!(facts.contains(shown), "{shown} in {facts}");
    }

    // Dead letters: re-drive one from the page; it runs again and completes.
    browser
        .find("#nav-dead-letters")
        .await
        .click()
        .await
        .expect("nav");
    let row = browser
        .find("#dead-letters tr[data-key=\"p/poison\"]")
        .await;
    assert!(row.text().await.expect("text").contains("Poison"));
    browser.shot("dead-letters").await;
    row.find(Locator::Css(".retry-one"))
        .await
        .expect("a re-drive button")
        .click()
        .await
        .expect("re-drive");
    // The click's request is on its way: the activity is FAILED until it lands.
    eventually("the re-driven dead letter to complete", || async {
        let a = client.get(key("poison")).await.ok()?;
        (v1::ActivityStatus::try_from(a.status) == Ok(v1::ActivityStatus::Completed)).then_some(())
    })
    .await;
    browser
        .until(
            "the re-driven row to leave the dead letters",
            "return !document.querySelector('#dead-letters tr[data-key=\"p/poison\"]')",
        )
        .await;

    // Workers: the SDK worker, its types, its slots and its node.
    browser
        .find("#nav-workers")
        .await
        .click()
        .await
        .expect("nav");
    let worker = browser.text("#workers tr[data-worker]").await;
    assert!(
        worker.contains("observed") && worker.contains("flaky"),
        "{worker}"
    );
    browser.shot("workers").await;

    // Limits: each with its use now.
    client
        .set_rate_limit(v1::RateLimit {
            activity_type: "emails".into(),
            limit: 100,
            period: Some(spool_proto::duration::to_proto(
                std::time::Duration::from_secs(1),
            )),
            ..Default::default()
        })
        .await
        .unwrap_or_else(|e| panic!("set a rate limit: {e}"));
    client
        .set_concurrency_limit(v1::ConcurrencyLimit {
            activity_type: "charge".into(),
            max_running: 2,
            strategy: v1::ConcurrencyStrategy::CancelNewest as i32,
            ..Default::default()
        })
        .await
        .unwrap_or_else(|e| panic!("set a concurrency limit: {e}"));
    client
        .set_concurrency_limit(v1::ConcurrencyLimit {
            activity_type: "charge".into(),
            concurrency_key: "acme".into(),
            max_running: 5,
            weight: 3,
            ..Default::default()
        })
        .await
        .unwrap_or_else(|e| panic!("set a key's limit: {e}"));
    client
        .set_rate_limit(v1::RateLimit {
            activity_type: "emails".into(),
            concurrency_key: "bulk".into(),
            limit: 7,
            period: Some(spool_proto::duration::to_proto(
                std::time::Duration::from_secs(60),
            )),
            ..Default::default()
        })
        .await
        .unwrap_or_else(|e| panic!("set a key's rate limit: {e}"));
    client
        .set_fairness_weight(v1::FairnessWeight {
            activity_type: "charge".into(),
            fairness_key: "tenant-a".into(),
            weight: 4,
            ..Default::default()
        })
        .await
        .unwrap_or_else(|e| panic!("set a fairness weight: {e}"));
    // A weight whose key has an activity waiting (`keyed`, above).
    client
        .set_fairness_weight(v1::FairnessWeight {
            activity_type: "unserved".into(),
            fairness_key: "tenant-a".into(),
            weight: 2,
            ..Default::default()
        })
        .await
        .unwrap_or_else(|e| panic!("set a fairness weight: {e}"));
    browser
        .find("#nav-limits")
        .await
        .click()
        .await
        .expect("nav");
    let rate = browser
        .text("#rate-limits tr[data-type=\"emails\"][data-key=\"\"]")
        .await;
    assert!(
        rate.contains("100 / 1s") && rate.contains("the whole type"),
        "{rate}"
    );
    let bulk = browser.text("#rate-limits tr[data-key=\"bulk\"]").await;
    assert!(bulk.contains("bulk") && bulk.contains("7 / 1m"), "{bulk}");
    let keyed = browser
        .text("#concurrency-limits tr[data-type=\"charge\"][data-key=\"\"]")
        .await;
    assert!(
        keyed.contains("cancel newest") && keyed.contains("every key"),
        "{keyed}"
    );
    let acme = browser
        .text("#concurrency-limits tr[data-key=\"acme\"]")
        .await;
    assert!(
        acme.contains("acme") && acme.contains('5') && acme.contains('3'),
        "{acme}"
    );
    let tenant = browser
        .text("#fairness-weights tr[data-type=\"charge\"][data-key=\"tenant-a\"]")
        .await;
    assert!(
        tenant.contains("tenant-a") && tenant.contains('4'),
        "{tenant}"
    );
    let waiting = browser
        .text("#fairness-weights tr[data-type=\"unserved\"][data-key=\"tenant-a\"] td:last-child")
        .await;
    assert_eq!(waiting.trim(), "1");
    browser.shot("limits").await;

    // Drain (admin only): drain, see it, resume.
    browser.find("#nav-drain").await.click().await.expect("nav");
    browser.find("[data-page=drain]").await;
    browser.shot("drain").await;
    browser
        .find("#drain-timeout")
        .await
        .clear()
        .await
        .expect("clear");
    browser
        .find("#drain-timeout")
        .await
        .send_keys("1")
        .await
        .expect("type");
    browser.find("#drain").await.click().await.expect("drain");
    browser
        .client
        .accept_alert()
        .await
        .expect("confirm the drain");
    eventually("the node to report draining", || async {
        client.stats("default").await.ok()?.draining.then_some(())
    })
    .await;
    browser.find("#resume").await.click().await.expect("resume");
    eventually("the node to resume", || async {
        (!client.stats("default").await.ok()?.draining).then_some(())
    })
    .await;

    // A phone-sized screen: the page fits its width; tables scroll inside it.
    browser
        .client
        .set_window_size(390, 844)
        .await
        .expect("resize");
    browser.goto(&format!("{base}/#/overview")).await;
    browser.find("#types tr[data-type=idle]").await;
    let width = browser
        .eval("return document.documentElement.scrollWidth")
        .await;
    assert!(
        width.as_u64().is_some_and(|w| w <= 390),
        "the page is {width} px wide on a 390 px screen"
    );
    browser.shot("overview-phone").await;
    browser.goto(&format!("{base}/#/dead-letters")).await;
    browser
        .find("#dead-letters tr[data-key=\"p/poison-2\"]")
        .await;
    browser.shot("dead-letters-phone").await;
}

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(not(spool_test_browser), ignore = "needs Chromium: docs/TESTING.md")]
async fn a_read_only_token_cannot_redrive_from_the_dashboard() {
    let env = Env::new();
    let (server, base, client) = dashboard(&env, &[]).await;
    let worker = observed_worker_with_token(&server, Some(ADMIN));
    submit(&client, quick_retry_request("poison", "poison", 5)).await;
    finished(&client, "poison").await;
    drop(worker);

    let browser = Browser::start(screenshots(&env)).await;
    browser.sign_in(&base, VIEWER).await;
    assert!(browser.text("#whoami").await.starts_with("viewer"));
    browser.goto(&format!("{base}/#/dead-letters")).await;
    browser
        .find("#dead-letters tr[data-key=\"p/poison\"]")
        .await;
    let controls = browser
        .eval(
            "const b = document.querySelector('#dead-letters .retry-one'); \
             return [!b || b.hidden || b.disabled, \
                     document.getElementById('nav-drain').hidden]",
        )
        .await;
    assert_eq!(
        controls,
        serde_json::json!([true, true]),
        "no way to re-drive or drain"
    );
    // Nor by calling the API with the same token from the page.
    let refused = browser
        .client
        .execute_async(
            "const done = arguments[arguments.length - 1]; \
             fetch('/api/retry', {method: 'POST', headers: {'Authorization': 'Bearer ' + sessionStorage.getItem('spool.token'), \
               'Content-Type': 'application/json'}, \
               body: JSON.stringify({namespace: 'default', keys: [{workflow_id: 'p', activity_id: 'poison'}]})}) \
               .then(r => r.json().then(j => done([r.status, j.error]))) \
               .catch(e => done(String(e)));",
            Vec::new(),
        )
        .await
        .expect("fetch");
    assert_eq!(refused[0], 403, "{refused}");
    assert!(
        refused[1].as_str().is_some_and(|e| e.contains("viewer")),
        "{refused}"
    );
    let still = client.get(key("poison")).await.expect("get");
    assert_eq!(
        v1::ActivityStatus::try_from(still.status),
        Ok(v1::ActivityStatus::Failed)
    );

    // A read-only dashboard refuses even an admin token.
    drop(browser);
    drop(server);
    let env = Env::new();
    let (server, base, _client) = dashboard(&env, &["--ui-read-only"]).await;
    let browser = Browser::start(screenshots(&env)).await;
    browser.sign_in(&base, ADMIN).await;
    assert!(browser.text("#whoami").await.contains("read-only"));
    let refused = browser
        .client
        .execute_async(
            "const done = arguments[arguments.length - 1]; \
             fetch('/api/resume', {method: 'POST', headers: {'Authorization': 'Bearer ' + sessionStorage.getItem('spool.token')}}) \
               .then(r => r.json().then(j => done([r.status, j.error]))) \
               .catch(e => done(String(e)));",
            Vec::new(),
        )
        .await
        .expect("fetch");
    assert_eq!(refused[0], 403, "{refused}");
    assert!(
        refused[1]
            .as_str()
            .is_some_and(|e| e.contains("--ui-read-only"))
    );
    drop(server);
}

/// A server without tokens opens its dashboard straight onto the app: no
/// sign-in form, no sign-out button, the activities view reachable at once. A
/// server with tokens still asks for one.
#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(not(spool_test_browser), ignore = "needs Chromium: docs/TESTING.md")]
async fn a_server_without_tokens_needs_no_sign_in() {
    let env = Env::new();
    let ui = format!("127.0.0.1:{}", free_port());
    let (_server, mut client) = env.serving(&["--ui-listen", &ui]).await;
    crate::support::submit(&mut client, sleep_request("open", 0, None)).await;
    let browser = Browser::start(screenshots(&env)).await;
    browser.goto(&format!("http://{ui}/#/activities")).await;
    browser.find("#app-view:not([hidden])").await;
    browser
        .until(
            "the activities view to list the activity",
            "return document.body.innerText.includes('open')",
        )
        .await;
    assert_eq!(
        browser
            .eval(
                "return [document.getElementById('sign-in-view').hidden, \
                 document.getElementById('sign-out').hidden]"
            )
            .await,
        serde_json::json!([true, true]),
        "no sign-in form, no sign-out"
    );
    drop(browser);

    let env = Env::new();
    let (_server, base, _client) = dashboard(&env, &[]).await;
    let browser = Browser::start(screenshots(&env)).await;
    browser.goto(&format!("{base}/")).await;
    browser.find("#sign-in-view:not([hidden])").await;
    assert_eq!(
        browser
            .eval("return document.getElementById('sign-in-error').hidden")
            .await,
        serde_json::json!(true),
        "asked for a token without an error"
    );
}
