//! Deliberate breakages, to prove that `spool soak`'s checker catches the bugs it
//! is there to catch. Compiled in only with the `breakages` cargo feature; without
//! it every switch is a constant `false` and the code behind it is dead.
//!
//! With the feature, `SPOOL_BREAK` (a comma-separated list of the names below) turns
//! breakages on at start. Each one removes one guarantee:
//! - `fencing`: a result ends whatever attempt of its row is running now, not only
//!   the attempt it was for;
//! - `release-counted`: an attempt released by a draining server is ended as a lost
//!   worker's (it spends the attempt budget, and may fail the activity);
//! - `ack-before-commit`: a worker's result is acknowledged as accepted before it is
//!   committed.

use std::sync::Arc;

use crate::store::{Op, Store};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Breakage {
    Fencing,
    ReleaseCounted,
    AckBeforeCommit,
}

/// The environment variable read (with the `breakages` feature only).
pub const ENV: &str = "SPOOL_BREAK";

impl Breakage {
    pub const ALL: [Breakage; 3] = [
        Breakage::Fencing,
        Breakage::ReleaseCounted,
        Breakage::AckBeforeCommit,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Breakage::Fencing => "fencing",
            Breakage::ReleaseCounted => "release-counted",
            Breakage::AckBeforeCommit => "ack-before-commit",
        }
    }

    pub fn parse(name: &str) -> Option<Breakage> {
        Breakage::ALL.into_iter().find(|b| b.name() == name)
    }
}

/// Whether `breakage` is on in this process.
#[cfg(feature = "breakages")]
pub fn active(breakage: Breakage) -> bool {
    static ON: std::sync::OnceLock<Vec<Breakage>> = std::sync::OnceLock::new();
    ON.get_or_init(|| {
        let on: Vec<Breakage> = std::env::var(ENV)
            .unwrap_or_default()
            .split(',')
            .filter_map(|name| Breakage::parse(name.trim()))
            .collect();
        if !on.is_empty() {
            tracing::warn!(breakages = ?on, "DELIBERATELY BROKEN BUILD: guarantees are off");
        }
        on
    })
    .contains(&breakage)
}

/// Whether `breakage` is on in this process: never, without the `breakages` feature.
#[cfg(not(feature = "breakages"))]
#[inline(always)]
pub fn active(_breakage: Breakage) -> bool {
    false
}

/// Whether this binary was built with the switches.
pub const COMPILED_IN: bool = cfg!(feature = "breakages");

/// With `fencing` broken: every ending of an attempt is rewritten to end the
/// attempt its row runs now, so the store's attempt fence never refuses it.
pub async fn unfence(store: &dyn Store, ops: Arc<[Op]>) -> Arc<[Op]> {
    if !active(Breakage::Fencing) {
        return ops;
    }
    let mut out = Vec::with_capacity(ops.len());
    for op in ops.iter() {
        match op {
            Op::Finish {
                attempt,
                transition,
                lease_expired_by,
            } => {
                let mut attempt = attempt.clone();
                if let Ok(Some(row)) = store.get(&attempt.key).await
                    && row.attempt != attempt.attempt
                {
                    let mut now_running = (*attempt).clone();
                    now_running.attempt = row.attempt;
                    attempt = Arc::new(now_running);
                }
                out.push(Op::Finish {
                    attempt,
                    transition: transition.clone(),
                    lease_expired_by: *lease_expired_by,
                });
            }
            other => out.push(other.clone()),
        }
    }
    out.into()
}
