//! The Spool server: activities submitted over gRPC are stored durably and pushed
//! to workers holding a bidirectional stream open. See ARCHITECTURE.md for the map.

pub(crate) mod api;
pub mod breakage;
pub mod config;
pub(crate) mod dispatch;
pub(crate) mod drain;
pub(crate) mod lifecycle;
pub mod limits;
pub mod metrics;
pub mod server;
pub mod store;
#[cfg(feature = "testing")]
pub mod testing;
pub(crate) mod transport;
pub(crate) mod ui;
pub(crate) mod wire;

pub use config::Config;
pub use server::run;
