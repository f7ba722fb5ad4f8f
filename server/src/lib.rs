//! The Spool server: activities submitted over gRPC are stored durably and pushed
//! to workers holding a bidirectional stream open. See ARCHITECTURE.md for the map.

pub mod api;
pub mod breakage;
pub mod config;
pub mod dispatch;
pub mod drain;
pub mod lifecycle;
pub mod limits;
pub mod metrics;
pub mod server;
pub mod store;
#[cfg(feature = "testing")]
pub mod testing;
pub mod transport;
pub mod ui;
pub mod wire;

pub use config::Config;
pub use server::run;
