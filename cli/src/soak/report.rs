//! What a run did, and its verdict: as JSON, and as a summary for a person.

use super::check;

/// The result of a run: what was done, and the verdict.
#[derive(Debug, serde::Serialize)]
pub struct Report {
    pub seed: u64,
    pub store: String,
    pub nodes: usize,
    pub workers: usize,
    pub rate: u32,
    pub duration_s: u64,
    pub faults_enabled: Vec<&'static str>,
    pub breakages: Vec<String>,
    pub dir: String,
    pub settled: bool,
    /// Worker sessions still holding slots once nothing runs: `node/identity: n`.
    pub held: Vec<String>,
    /// Concurrency keys still counted waiting or running once nothing is: the
    /// keys' counts went wrong in a fault.
    pub keys_left: Vec<String>,
    pub verdict: check::Verdict,
    pub passed: bool,
}

impl Report {
    pub fn summary(&self) -> String {
        let v = &self.verdict;
        let mut s = format!(
            "soak seed={} store={} nodes={} workers={} rate={}/s {}s{}\n",
            self.seed,
            self.store,
            self.nodes,
            self.workers,
            self.rate,
            self.duration_s,
            if self.breakages.is_empty() {
                String::new()
            } else {
                format!(" BROKEN: {}", self.breakages.join(","))
            }
        );
        s += &format!(
            "acknowledged {}  completed {}  failed as asked (max_attempts=1) {}  unknown submits {}\n",
            v.acknowledged, v.completed, v.failed_as_asked, v.unknown_submits
        );
        s += &format!(
            "lost {}  accepted twice {}  attempt started twice {}  wrong attempt stored {}  unexplained failures {}  left unfinished {}\n",
            v.lost.len(),
            v.twice.len(),
            v.ran_twice.len(),
            v.wrong_attempt.len(),
            v.unexplained_failures.len(),
            v.left_unfinished.len()
        );
        s += &format!(
            "deliveries {}  completed with the ack unseen {}\n",
            v.deliveries, v.ack_unseen
        );
        s += "fault         injected  extra deliveries\n";
        for (kind, (n, extra)) in &v.faults {
            s += &format!("{kind:<13} {n:>8}  {extra:>16}\n");
        }
        for line in v.failures() {
            s += &format!("FAILED: {line}\n");
        }
        if !self.settled {
            s +=
                "FAILED: activities were still scheduled or running when the settle time ran out\n";
        }
        for h in &self.held {
            s += &format!("FAILED: a slot is still held with nothing running: {h}\n");
        }
        for k in &self.keys_left {
            s += &format!(
                "FAILED: concurrency keys still counted with nothing waiting or running: {k}\n"
            );
        }
        s += &format!(
            "{} (history and logs in {})\n",
            if self.passed { "PASSED" } else { "FAILED" },
            self.dir
        );
        s
    }
}
