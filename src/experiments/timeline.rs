//! Memory over the logical clock of one replay: bytes in use after each
//! trace event, the evictions and rematerialisations each event caused, and
//! the arena's fragmentation in arena mode.

use crate::backend::Backend;
use crate::interp::Interpreter;

/// The state after one trace event.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample {
    /// The trace event's index (the logical clock).
    pub clock: usize,
    pub in_use_bytes: u64,
    /// Evictions (eager ones included) made while running this event.
    pub evictions: u64,
    /// Rematerialisations made while running this event.
    pub rematerializations: u64,
    /// `1 − largest free block / free bytes`, in arena mode.
    pub fragmentation: Option<f64>,
}

/// One replay's samples, in clock order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Timeline {
    pub budget_bytes: Option<u64>,
    pub samples: Vec<Sample>,
    evictions_so_far: u64,
    rematerializations_so_far: u64,
}

impl Timeline {
    pub fn new() -> Timeline {
        Timeline::default()
    }

    /// Records the state after trace event `clock` (pass it as
    /// [`crate::trace::replay::replay_observed`]'s callback).
    pub fn observe<B: Backend>(&mut self, clock: usize, dtr: &Interpreter<B>) {
        let memory = dtr.memory();
        let stats = dtr.stats();
        self.budget_bytes = memory.budget_bytes;
        self.samples.push(Sample {
            clock,
            in_use_bytes: memory.in_use_bytes,
            evictions: stats.evictions - self.evictions_so_far,
            rematerializations: stats.rematerializations - self.rematerializations_so_far,
            fragmentation: memory.arena.map(|arena| arena.fragmentation),
        });
        self.evictions_so_far = stats.evictions;
        self.rematerializations_so_far = stats.rematerializations;
    }

    /// At most `buckets` samples, each covering a run of clocks: the
    /// highest bytes in use and fragmentation of its run, and the sums of
    /// its evictions and rematerialisations (for drawing long replays).
    pub fn downsampled(&self, buckets: usize) -> Vec<Sample> {
        let per_bucket = self.samples.len().div_ceil(buckets.max(1)).max(1);
        self.samples
            .chunks(per_bucket)
            .map(|run| Sample {
                clock: run[0].clock,
                in_use_bytes: run.iter().map(|s| s.in_use_bytes).max().unwrap_or(0),
                evictions: run.iter().map(|s| s.evictions).sum(),
                rematerializations: run.iter().map(|s| s.rematerializations).sum(),
                fragmentation: run
                    .iter()
                    .filter_map(|s| s.fragmentation)
                    .max_by(f64::total_cmp),
            })
            .collect()
    }

    /// `clock,in_use_bytes,evictions,rematerializations,fragmentation`, one
    /// line per sample (fragmentation empty in counter mode).
    pub fn to_csv(&self) -> String {
        let mut csv =
            String::from("clock,in_use_bytes,evictions,rematerializations,fragmentation\n");
        for s in &self.samples {
            let fragmentation = s.fragmentation.map_or(String::new(), |f| f.to_string());
            csv += &format!(
                "{},{},{},{},{fragmentation}\n",
                s.clock, s.in_use_bytes, s.evictions, s.rematerializations
            );
        }
        csv
    }
}
