//! The outside services tests may need (PostgreSQL, libfaketime, the Python
//! interop's network, headless Chromium, strace): which of them can be had here, and where
//! PostgreSQL is. Nothing but std, for build scripts; spool-testkit re-exports it
//! as `spool_testkit::services`.
//!
//! The build scripts of the packages whose tests need them call [`emit`]: each
//! service that can be had becomes a cfg (always under CI=true, where it must be,
//! so the tests fail rather than hide). Without it the tests compile as
//! `#[ignore]`d, with the reason, and the summary counts them: a test that did not
//! run never reports a pass.
//!
//! PostgreSQL can be had when `SPOOL_TEST_POSTGRES_URL` names a server, or when its
//! binaries are installed: then [`postgres_url`] starts a throwaway cluster
//! (`initdb` into a temporary directory, `postgres` on a free port of 127.0.0.1),
//! once per test process, which a watchdog stops and deletes when that process
//! exits.

use std::path::{Path, PathBuf};

/// The environment variable naming a PostgreSQL server for the tests.
pub const POSTGRES_URL: &str = "SPOOL_TEST_POSTGRES_URL";

/// Emits the `spool_test_*` cfgs for this build.
pub fn emit() {
    let ci = under_ci();
    println!("cargo::rerun-if-env-changed=CI");
    for (cfg, available) in [
        (
            "spool_test_postgres",
            env_set(POSTGRES_URL) || postgres_installed(),
        ),
        ("spool_test_faketime", file_exists(FAKETIME)),
        ("spool_test_interop", env_set("SPOOL_TEST_INTEROP")),
        ("spool_test_browser", file_exists(CHROMEDRIVER)),
        ("spool_test_strace", file_exists(STRACE)),
    ] {
        println!("cargo::rustc-check-cfg=cfg({cfg})");
        if ci || available {
            println!("cargo::rustc-cfg={cfg}");
        }
    }
}

/// Whether `CI` is set as CI services set it: `true`, `1`, or any value but
/// empty, `0` and `false`. Under CI every service must be had.
pub fn under_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| !matches!(v.trim(), "" | "0" | "false"))
}

/// ChromeDriver as Debian's `chromium-driver` package installs it (with Chromium).
pub const CHROMEDRIVER: &str = "/usr/bin/chromedriver";

/// strace as Debian's `strace` package installs it.
const STRACE: &str = "/usr/bin/strace";

/// libfaketime as Debian's `faketime` package installs it.
const FAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1";

fn env_set(name: &str) -> bool {
    println!("cargo::rerun-if-env-changed={name}");
    std::env::var(name).is_ok_and(|v| !v.is_empty())
}

fn file_exists(path: &str) -> bool {
    let path = Path::new(path);
    // Watch the file where it is (watching a missing one would rerun every build).
    if path.exists() {
        println!("cargo::rerun-if-changed={}", path.display());
    }
    path.exists()
}

/// The directory holding `initdb` and `postgres`: Debian's newest
/// `/usr/lib/postgresql/N/bin`, or wherever `initdb` on the PATH points.
pub fn postgres_binaries() -> Option<PathBuf> {
    let complete = |dir: &Path| dir.join("initdb").is_file() && dir.join("postgres").is_file();
    let mut debian: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path().join("bin"))
        .filter(|d| complete(d))
        .collect();
    debian.sort_by_key(|d| {
        d.parent()
            .and_then(|v| v.file_name())
            .and_then(|v| v.to_str())
            .and_then(|v| v.parse::<u32>().ok())
            .unwrap_or(0)
    });
    if let Some(dir) = debian.pop() {
        return Some(dir);
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join("initdb"))
        .find(|p| p.is_file())
        .and_then(|p| std::fs::canonicalize(p).ok())
        .and_then(|p| p.parent().map(Path::to_path_buf))
        .filter(|d| complete(d))
}

/// [`postgres_binaries`], and a rerun of the build script when PostgreSQL is
/// installed or removed.
fn postgres_installed() -> bool {
    if Path::new("/usr/lib/postgresql").exists() {
        println!("cargo::rerun-if-changed=/usr/lib/postgresql");
    }
    postgres_binaries().is_some()
}

/// The self-signed certificate and key Debian's `ssl-cert` package makes.
const SNAKEOIL: (&str, &str) = (
    "/etc/ssl/certs/ssl-cert-snakeoil.pem",
    "/etc/ssl/private/ssl-cert-snakeoil.key",
);

/// The PostgreSQL server the tests use: `SPOOL_TEST_POSTGRES_URL`, or a throwaway
/// cluster started on first use. Panics, saying why, when neither can be had: a
/// test that needs PostgreSQL fails rather than passes without it.
pub fn postgres_url() -> String {
    static URL: std::sync::OnceLock<Result<String, String>> = std::sync::OnceLock::new();
    let url = URL.get_or_init(|| match std::env::var(POSTGRES_URL) {
        Ok(url) if !url.is_empty() => Ok(url),
        _ => start_throwaway_cluster(),
    });
    match url {
        Ok(url) => url.clone(),
        Err(why) => panic!(
            "no PostgreSQL for this test: {why}. Set {POSTGRES_URL} to a server's URL, or \
             install PostgreSQL's binaries (initdb, postgres)"
        ),
    }
}

/// `initdb` into a fresh temporary directory and `postgres` on a free port, under a
/// watchdog shell that stops the server and deletes the directory once this process
/// is gone. As root (which `initdb` refuses) both run as the `postgres` user.
fn start_throwaway_cluster() -> Result<String, String> {
    use std::process::{Command, Stdio};
    let bin = postgres_binaries().ok_or("PostgreSQL's binaries are not installed")?;
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let dir = std::env::temp_dir().join(format!("spool-test-pg-{}-{nanos:x}", std::process::id()));
    let data = dir.join("data");
    std::fs::create_dir_all(&dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
    let root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.trim_ascii() == b"0");
    // The command line that runs `program` as the right user.
    let as_user = |program: &str| -> Vec<String> {
        let program = bin.join(program).display().to_string();
        if root {
            vec![
                "setpriv".into(),
                "--reuid=postgres".into(),
                "--regid=postgres".into(),
                "--init-groups".into(),
                program,
            ]
        } else {
            vec![program]
        }
    };
    if root {
        let chowned = Command::new("chown")
            .args(["postgres:", &dir.display().to_string()])
            .status()
            .map_err(|e| format!("chown: {e}"))?;
        if !chowned.success() {
            return Err("as root, the cluster runs as user postgres, which is missing".into());
        }
    }
    let initdb = as_user("initdb");
    let out = Command::new(&initdb[0])
        .args(&initdb[1..])
        .args(["-D", &data.display().to_string()])
        .args(["-A", "trust", "-U", "postgres", "-E", "UTF8", "--no-locale"])
        .arg("--no-sync")
        .output()
        .map_err(|e| format!("run initdb: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "initdb failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| format!("find a free port: {e}"))?
        .port();
    let mut server = as_user("postgres");
    server.extend(
        [
            "-D",
            &data.display().to_string(),
            "-p",
            &port.to_string(),
            "-k",
            &dir.display().to_string(),
            "-c",
            "listen_addresses=127.0.0.1",
            "-c",
            "max_connections=500",
            // Nothing here needs to survive a crash of the machine.
            "-c",
            "fsync=off",
            "-c",
            "full_page_writes=off",
        ]
        .map(str::to_owned),
    );
    // TLS as Debian's clusters have it (the `ssl-cert` package's self-signed pair),
    // for the tests of `sslmode`.
    if Path::new(SNAKEOIL.0).exists() && Path::new(SNAKEOIL.1).exists() {
        for setting in [
            "ssl=on".to_owned(),
            format!("ssl_cert_file={}", SNAKEOIL.0),
            format!("ssl_key_file={}", SNAKEOIL.1),
        ] {
            server.extend(["-c".to_owned(), setting]);
        }
    }
    // The watchdog: polls for this process every half second; once it is gone,
    // stops the server (fast shutdown) and deletes the directory.
    let script = r#"parent=$1; dir=$2; shift 2
        "$@" >"$dir/server.log" 2>&1 &
        pg=$!
        while kill -0 "$parent" 2>/dev/null && kill -0 "$pg" 2>/dev/null; do sleep 0.5; done
        kill -INT "$pg" 2>/dev/null; wait "$pg"; rm -rf "$dir""#;
    Command::new("sh")
        .arg("-c")
        .arg(script)
        .arg("spool-test-pg")
        .arg(std::process::id().to_string())
        .arg(&dir)
        .args(&server)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("start postgres: {e}"))?;
    let ready = bin.join("pg_isready");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let up = Command::new(&ready)
            .args(["-q", "-h", "127.0.0.1", "-p", &port.to_string()])
            .status()
            .is_ok_and(|s| s.success());
        if up {
            return Ok(format!("postgres://postgres@127.0.0.1:{port}/postgres"));
        }
        if std::time::Instant::now() > deadline {
            let log = std::fs::read_to_string(dir.join("server.log")).unwrap_or_default();
            return Err(format!("the throwaway cluster did not start: {log}"));
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}
