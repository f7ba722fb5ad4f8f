//! End to end: the real server, real SDK workers, over real gRPC on loopback.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod harness;

mod api;
mod interop;
mod lifecycle;
mod liveness;
mod multinode;
mod protocol;
