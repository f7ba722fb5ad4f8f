//! Compiles `spool/v1/*.proto` (beside this file) into Rust with a pure-Rust
//! protobuf compiler (protox), so building Spool never needs a system `protoc`. The
//! encoded descriptor set is written beside the generated code for gRPC server
//! reflection.

use std::{env, error::Error, fs, path::PathBuf};

use prost::Message;

const PROTOS: &[&str] = &[
    "spool/v1/common.proto",
    "spool/v1/worker.proto",
    "spool/v1/activity.proto",
    "spool/v1/admin.proto",
];

fn main() -> Result<(), Box<dyn Error>> {
    println!("cargo:rerun-if-changed=spool");
    let descriptors = protox::compile(PROTOS, ["."])?;
    let out_dir = PathBuf::from(env::var("OUT_DIR")?);
    fs::write(
        out_dir.join("spool_descriptor.bin"),
        descriptors.encode_to_vec(),
    )?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_fds(descriptors)?;
    Ok(())
}
