//! End to end: the real server, real SDK workers, over real gRPC on loopback.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod harness;

mod edges;
mod hostile;
mod http2;

mod api;
mod concurrency;
mod interop;
mod invariants;
mod lifecycle;
mod limits;
mod liveness;
mod multinode;
mod protocol;
mod rate_limits;
mod resume;
mod sdk;
mod supervision;
mod tls;
