//! Getting work to workers: who is connected and what they hold ([`Registry`]), the
//! single writer that commits and claims ([`Committer`]), waiters on outcomes
//! ([`Pending`]), the timer of delayed rows, the liveness sweep ([`heartbeat`]),
//! a worker's session once its stream is open ([`session`]), and what workers are
//! told ([`outbound`]); the api layer decodes and encodes them on the wire.

pub mod committer;
mod due;
pub mod heartbeat;
pub mod outbound;
mod peers;
pub mod pending;
pub mod registry;
pub mod session;
pub mod timeouts;
pub mod timer;

pub use committer::{CommitError, Committer};
pub use pending::Pending;
pub use registry::Registry;

use std::sync::Arc;

use crate::{config::Config, store::Store};

/// What the services, the drain and the sweep share: the store, its single writer,
/// the connected workers and the parked waiters.
pub struct Core {
    pub store: Arc<dyn Store>,
    pub committer: Committer,
    pub registry: Arc<Registry>,
    pub pending: Arc<Pending>,
    pub config: Config,
}
