//! Spool's wire contract, `spool.v1`, as generated Rust, plus the few small types the
//! server, the worker SDK and the CLI share: duration parsing, protobuf time
//! conversions, attempt keys looked up without allocating, and the typed
//! [`activity::Activity`] contract. The `.proto` files under `proto/` are the source of truth; nothing
//! here may rename what they define.

pub mod activity;
pub mod attempt;
pub mod duration;
pub mod endpoint;
#[cfg(feature = "otel")]
pub mod otel;
pub mod time;
pub mod trace;

/// The generated `spool.v1` messages, clients and servers.
pub mod v1 {
    #![allow(clippy::all, missing_docs)]
    tonic::include_proto!("spool.v1");
}

/// The encoded descriptor set of `spool.v1`, for gRPC server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("spool_descriptor");

/// The protocol versions this crate speaks, oldest first.
pub const PROTOCOL_VERSIONS: &[u32] = &[1];

/// The namespace used when a request leaves it empty.
pub const DEFAULT_NAMESPACE: &str = "default";
