//! The server from another gRPC implementation: Python stubs generated from our
//! .proto by grpcio-tools play client and worker (`interop.py`, beside this file).
//!
//! The Python packages are installed into a virtualenv under the target directory
//! on first use, which needs network access: the test runs under `CI=true` or with
//! `SPOOL_TEST_INTEROP=1`, and is reported as ignored otherwise.

use std::{path::PathBuf, process::Command};

use crate::harness::*;

const PACKAGES: &[&str] = &[
    "grpcio>=1.60",
    "grpcio-tools>=1.60",
    "grpcio-health-checking>=1.60",
];

fn venv_python() -> Result<PathBuf, String> {
    let venv = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("interop-venv");
    let python = venv.join("bin").join("python");
    let ready = |python: &PathBuf| {
        Command::new(python)
            .args(["-c", "import grpc_tools, grpc_health"])
            .status()
            .is_ok_and(|s| s.success())
    };
    if ready(&python) {
        return Ok(python);
    }
    let run = |cmd: &mut Command| -> Result<(), String> {
        let out = cmd.output().map_err(|e| format!("{cmd:?}: {e}"))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "{cmd:?} failed: {}",
                String::from_utf8_lossy(&out.stderr)
            ))
        }
    };
    run(Command::new("python3").args(["-m", "venv"]).arg(&venv))?;
    run(Command::new(venv.join("bin").join("pip"))
        .args(["install", "--quiet", "--disable-pip-version-check"])
        .args(PACKAGES))?;
    if ready(&python) {
        Ok(python)
    } else {
        Err("the packages installed but do not import".to_owned())
    }
}

#[tokio::test]
#[cfg_attr(
    not(spool_test_interop),
    ignore = "needs Python and network once for grpcio: set SPOOL_TEST_INTEROP=1"
)]
async fn a_python_client_generated_from_the_proto_can_do_it_all() {
    let python = match tokio::task::spawn_blocking(venv_python).await.unwrap() {
        Ok(p) => p,
        Err(why) => panic!("interop needs Python with grpcio: {why}"),
    };
    let server = TestServer::start().await;
    let here = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let out = tempfile::tempdir().unwrap();
    let output = tokio::process::Command::new(python)
        .arg(here.join("interop.py"))
        .arg("--proto")
        .arg(here.join("../proto"))
        .arg("--endpoint")
        .arg(server.endpoint.trim_start_matches("http://"))
        .arg("--out")
        .arg(out.path())
        .output()
        .await
        .unwrap();
    assert!(
        output.status.success(),
        "python client failed:\nstdout: {}\nstderr: {}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}
