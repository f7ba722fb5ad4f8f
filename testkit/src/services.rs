//! Which outside services the tests can reach (PostgreSQL, libfaketime, the Python
//! interop's network, headless Chromium), and the tests' PostgreSQL server: the
//! package spool-testkit-services, std only, which the build scripts depend on
//! directly (see its Cargo.toml for why).

pub use spool_testkit_services::*;
