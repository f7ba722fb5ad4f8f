// Shared by the build scripts of the packages whose tests need outside services.
// Each service a test may need becomes a cfg when it can be had here (or when
// CI=true, where it must be, so the tests fail rather than hide). Without it the
// tests compile as `#[ignore]`d, and the summary says so: a test that did not run
// never reports a pass.

/// Emits the `spool_test_*` cfgs for this build.
pub fn emit() {
    let ci = std::env::var("CI").as_deref() == Ok("true");
    println!("cargo::rerun-if-env-changed=CI");
    for (cfg, available) in [
        ("spool_test_postgres", env_set("SPOOL_TEST_POSTGRES_URL")),
        ("spool_test_faketime", file_exists(FAKETIME)),
        ("spool_test_interop", env_set("SPOOL_TEST_INTEROP")),
    ] {
        println!("cargo::rustc-check-cfg=cfg({cfg})");
        if ci || available {
            println!("cargo::rustc-cfg={cfg}");
        }
    }
}

/// libfaketime as Debian's `faketime` package installs it.
const FAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1";

fn env_set(name: &str) -> bool {
    println!("cargo::rerun-if-env-changed={name}");
    std::env::var(name).is_ok_and(|v| !v.is_empty())
}

fn file_exists(path: &str) -> bool {
    let path = std::path::Path::new(path);
    // Watch the file where it is (watching a missing one would rerun every build).
    if path.exists() {
        println!("cargo::rerun-if-changed={}", path.display());
    }
    path.exists()
}
