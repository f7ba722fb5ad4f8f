//! A phase's progress on stderr.

use std::{
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use tokio_util::sync::CancellationToken;

/// A progress line on stderr, redrawn a few times a second when stderr is a
/// terminal; elsewhere (a log file, a pipe) one line when the phase ends.
pub(super) struct Progress {
    stop: CancellationToken,
}

impl Progress {
    pub(super) fn start(label: &str, total: usize, done: Arc<AtomicUsize>) -> Self {
        use std::io::IsTerminal;
        let stop = CancellationToken::new();
        let label = label.to_owned();
        let token = stop.clone();
        if !std::io::stderr().is_terminal() {
            tokio::spawn(async move {
                let started = Instant::now();
                token.cancelled().await;
                eprintln!(
                    "{label:<18} done in {:.2}s",
                    started.elapsed().as_secs_f64()
                );
            });
            return Self { stop };
        }
        tokio::spawn(async move {
            let started = Instant::now();
            loop {
                let n = done.load(Ordering::Relaxed).min(total);
                let width = 30;
                let filled = (n * width).checked_div(total).unwrap_or(width);
                eprint!(
                    "\r{label:<18} [{}{}] {n}/{total} {:.1}s ",
                    "#".repeat(filled),
                    ".".repeat(width - filled),
                    started.elapsed().as_secs_f64()
                );
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(200)) => {}
                    _ = token.cancelled() => {
                        eprintln!("\r{label:<18} done in {:.2}s{}", started.elapsed().as_secs_f64(), " ".repeat(40));
                        return;
                    }
                }
            }
        });
        Self { stop }
    }

    pub(super) fn finish(self) {
        self.stop.cancel();
    }
}
