//! Memory-budget experiments: a grid of replays (trace × heuristic ×
//! memory model × sampling × seed × ratio), run in parallel, written as
//! CSV and JSON, shardable across machines and mergeable again.

pub mod chains;
pub mod checkpoint;
pub mod fit;
pub mod generate;
pub mod plan;
#[cfg(feature = "plot")]
pub mod plot;
pub mod revolve;
pub mod run;
pub mod timeline;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use serde::{Deserialize, Serialize};

use crate::config::Budget;
use crate::error::{Error, Result};
use crate::memory::MemoryModel;
use crate::policy::Sampling;
use crate::trace::replay::ReplayStatus;
pub use run::{Outcome, Policy, RunSpec, Workload, STATIC_CHECKPOINTING};

/// The grid to run.
#[derive(Debug, Clone)]
pub struct SweepSpec {
    pub traces: Vec<PathBuf>,
    pub heuristics: Vec<String>,
    pub memories: Vec<MemoryModel>,
    pub samplings: Vec<Sampling>,
    /// Seeds 0..seeds.
    pub seeds: u64,
    pub ratios: Vec<f64>,
    /// Runs stop as thrashing past this multiple of the unbounded compute.
    pub thrash_limit: f64,
}

/// One run of the grid: indices into the spec's lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cell {
    /// Position in the whole grid (stable across shards).
    pub index: usize,
    pub trace: usize,
    pub heuristic: usize,
    pub memory: usize,
    pub sampling: usize,
    pub seed: u64,
    pub ratio: usize,
}

/// A shard `k` of `n` (1-based), for batch schedulers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shard {
    pub k: usize,
    pub n: usize,
}

impl Shard {
    /// Parses `K/N` with 1 ≤ K ≤ N.
    pub fn parse(text: &str) -> Result<Shard> {
        let bad =
            || Error::InvalidArgument(format!("--shard `{text}` must be K/N with 1 <= K <= N"));
        let (k, n) = text.split_once('/').ok_or_else(bad)?;
        let (k, n) = (
            k.trim().parse().map_err(|_| bad())?,
            n.trim().parse().map_err(|_| bad())?,
        );
        if n == 0 || k == 0 || k > n {
            return Err(bad());
        }
        Ok(Shard { k, n })
    }

    fn owns(&self, index: usize) -> bool {
        index % self.n == self.k - 1
    }
}

/// One finished run, as written to `results.csv` and `results.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Row {
    pub index: usize,
    pub trace: String,
    pub heuristic: String,
    pub memory: MemoryModel,
    pub sampling: Sampling,
    pub seed: u64,
    pub ratio: f64,
    pub budget_bytes: u64,
    pub status: ReplayStatus,
    pub overhead: f64,
    pub remat_compute: u64,
    pub peak_bytes: u64,
    pub evictions: u64,
    pub rematerializations: u64,
    /// At the end of the run, in arena memory.
    pub fragmentation: Option<f64>,
    pub wall_seconds: f64,
}

impl SweepSpec {
    /// Every cell, in a fixed order: trace, heuristic, memory, sampling,
    /// seed, then ratio (fastest). Static checkpointing takes no budget and
    /// no randomness: one cell per trace and memory model.
    pub fn cells(&self) -> Vec<Cell> {
        let mut cells = Vec::new();
        for trace in 0..self.traces.len() {
            for heuristic in 0..self.heuristics.len() {
                let fixed = self.heuristics[heuristic] == STATIC_CHECKPOINTING;
                let (samplings, seeds, ratios) = if fixed {
                    (1, 1, 1)
                } else {
                    (self.samplings.len(), self.seeds.max(1), self.ratios.len())
                };
                for memory in 0..self.memories.len() {
                    for sampling in 0..samplings {
                        for seed in 0..seeds {
                            for ratio in 0..ratios {
                                let index = cells.len();
                                cells.push(Cell {
                                    index,
                                    trace,
                                    heuristic,
                                    memory,
                                    sampling,
                                    seed,
                                    ratio,
                                });
                            }
                        }
                    }
                }
            }
        }
        cells
    }

    /// Runs the cells of `shard` (all without one) on `jobs` threads,
    /// calling `progress(done, total)` as runs finish. Rows come back in
    /// grid order whatever the scheduling, so outputs are reproducible.
    pub fn run(
        &self,
        shard: Option<Shard>,
        jobs: usize,
        progress: &(dyn Fn(usize, usize) + Sync),
    ) -> Result<Vec<Row>> {
        self.validate()?;
        let loaded: Vec<Workload> = self
            .traces
            .iter()
            .map(|path| Workload::load(path, None))
            .collect::<Result<_>>()?;
        let cells: Vec<Cell> = self
            .cells()
            .into_iter()
            .filter(|c| shard.is_none_or(|s| s.owns(c.index)))
            .collect();
        parallel_map(&cells, jobs, progress, |cell| {
            let outcome = self.spec(cell).run(&loaded[cell.trace])?;
            Ok(self.row(cell, outcome))
        })
        .into_iter()
        .collect()
    }

    /// Checks every cell's options, so a bad one fails before the first run.
    pub fn validate(&self) -> Result<()> {
        self.cells()
            .iter()
            .try_for_each(|cell| self.spec(cell).validate())
    }

    /// What one cell runs.
    fn spec(&self, cell: &Cell) -> RunSpec {
        let policy = Policy::from(self.heuristics[cell.heuristic].as_str());
        let budget = match policy {
            Policy::StaticSqrt => Budget::Unbounded,
            Policy::Heuristic(_) => Budget::Ratio(self.ratios[cell.ratio]),
        };
        RunSpec {
            policy,
            budget,
            memory: self.memories[cell.memory],
            sampling: self.samplings[cell.sampling],
            seed: cell.seed,
            thrash_limit: self.thrash_limit,
            ..RunSpec::default()
        }
    }

    fn row(&self, cell: &Cell, outcome: Outcome) -> Row {
        let Outcome {
            budget_bytes,
            ratio,
            overhead,
            report,
            arena,
            ..
        } = outcome;
        Row {
            index: cell.index,
            trace: self.traces[cell.trace].display().to_string(),
            heuristic: self.heuristics[cell.heuristic].clone(),
            memory: self.memories[cell.memory],
            sampling: self.samplings[cell.sampling],
            seed: cell.seed,
            ratio,
            // A static plan's budget is the peak it reached.
            budget_bytes: budget_bytes.unwrap_or(report.peak_bytes),
            status: report.status,
            overhead,
            remat_compute: report.stats.remat_compute,
            peak_bytes: report.peak_bytes,
            evictions: report.stats.evictions,
            rematerializations: report.stats.rematerializations,
            fragmentation: arena.map(|a| a.fragmentation),
            wall_seconds: report.wall_seconds,
        }
    }
}

/// `f` over `items` on a pool of `jobs` threads, results in `items`'
/// order whatever the scheduling; `progress(done, total)` is called as each
/// finishes.
pub fn parallel_map<T: Sync, R: Send>(
    items: &[T],
    jobs: usize,
    progress: &(dyn Fn(usize, usize) + Sync),
    f: impl Fn(&T) -> R + Sync,
) -> Vec<R> {
    use rayon::prelude::*;
    let done = AtomicUsize::new(0);
    let run = || {
        items
            .par_iter()
            .map(|item| {
                let result = f(item);
                progress(done.fetch_add(1, Ordering::Relaxed) + 1, items.len());
                result
            })
            .collect()
    };
    match rayon::ThreadPoolBuilder::new()
        .num_threads(jobs.max(1))
        .build()
    {
        Ok(pool) => pool.install(run),
        // No threads to spare: the global pool does the same work.
        Err(_) => run(),
    }
}

/// The CSV header, in [`Row`]'s field order.
pub const CSV_HEADER: &str =
    "index,trace,heuristic,memory,sampling,seed,ratio,budget_bytes,status,overhead,\
remat_compute,peak_bytes,evictions,rematerializations,fragmentation,wall_seconds";

/// The rows as CSV (header first). Numbers print in full precision, so
/// the same runs give the same bytes (wall time aside).
pub fn to_csv(rows: &[Row]) -> String {
    let mut out = csv::Writer::from_writer(Vec::new());
    let mut write = |record: &[String]| out.write_record(record).expect("writing to memory");
    write(&CSV_HEADER.split(',').map(String::from).collect::<Vec<_>>());
    for r in rows {
        write(&[
            r.index.to_string(),
            r.trace.clone(),
            r.heuristic.clone(),
            r.memory.to_string(),
            r.sampling.to_string(),
            r.seed.to_string(),
            r.ratio.to_string(),
            r.budget_bytes.to_string(),
            r.status.to_string(),
            r.overhead.to_string(),
            r.remat_compute.to_string(),
            r.peak_bytes.to_string(),
            r.evictions.to_string(),
            r.rematerializations.to_string(),
            r.fragmentation.map_or(String::new(), |f| f.to_string()),
            r.wall_seconds.to_string(),
        ]);
    }
    let bytes = out.into_inner().expect("writing to memory");
    String::from_utf8(bytes).expect("CSV of UTF-8 fields")
}

/// Writes `results.csv` and `results.json` into `dir` (created if needed).
pub fn write_results(dir: &Path, rows: &[Row]) -> Result<()> {
    prepare_out(dir)?;
    let json =
        serde_json::to_string_pretty(rows).map_err(|e| Error::InvalidArgument(e.to_string()))?;
    // Both files or neither: each is written aside and renamed into place.
    let files = [("results.json", json + "\n"), ("results.csv", to_csv(rows))];
    for (name, text) in &files {
        let aside = dir.join(format!(".{name}.tmp"));
        std::fs::write(&aside, text).map_err(|e| Error::file(&aside, e))?;
    }
    for (name, _) in &files {
        let (aside, path) = (dir.join(format!(".{name}.tmp")), dir.join(name));
        std::fs::rename(&aside, &path).map_err(|e| Error::file(&path, e))?;
    }
    Ok(())
}

/// Makes the output directory of a sweep, before any run: a path that is a
/// file, or cannot be made, is an error now rather than after the grid.
pub fn prepare_out(dir: &Path) -> Result<()> {
    if dir.exists() && !dir.is_dir() {
        return Err(Error::file(dir, "exists and is not a directory"));
    }
    std::fs::create_dir_all(dir).map_err(|e| Error::file(dir, e))
}

/// Reads the rows of shard directories and joins them in grid order;
/// an index present twice is an error (overlapping shards).
pub fn merge(dirs: &[PathBuf]) -> Result<Vec<Row>> {
    let mut rows: Vec<Row> = Vec::new();
    for dir in dirs {
        rows.extend(read_results(dir)?);
    }
    rows.sort_by_key(|r| r.index);
    if let Some(pair) = rows.windows(2).find(|w| w[0].index == w[1].index) {
        return Err(Error::InvalidArgument(format!(
            "grid cell {} appears in two shards",
            pair[0].index
        )));
    }
    Ok(rows)
}

/// The rows of a sweep: `path` is its `results.json` (or another file in
/// that format), or the directory holding one.
pub fn read_results(path: &Path) -> Result<Vec<Row>> {
    let path = if path.is_dir() {
        path.join("results.json")
    } else {
        path.to_path_buf()
    };
    let text = std::fs::read_to_string(&path).map_err(|e| Error::file(&path, e))?;
    serde_json::from_str(&text).map_err(|e| Error::file(&path, e))
}

/// Per trace and policy (heuristic, memory, sampling, seed), the smallest
/// ratio whose run completed within the thrash limit, as a markdown table.
pub fn summary(rows: &[Row]) -> String {
    let mut keys: Vec<(String, String)> = Vec::new();
    let mut best: Vec<Option<f64>> = Vec::new();
    for r in rows {
        let key = (
            r.trace.clone(),
            format!(
                "{} / {} / {} / seed {}",
                r.heuristic, r.memory, r.sampling, r.seed
            ),
        );
        let slot = match keys.iter().position(|k| *k == key) {
            Some(slot) => slot,
            None => {
                keys.push(key);
                best.push(None);
                keys.len() - 1
            }
        };
        if r.status == ReplayStatus::Ok {
            best[slot] = Some(best[slot].map_or(r.ratio, |b: f64| b.min(r.ratio)));
        }
    }
    let mut out =
        String::from("| trace | policy | smallest ratio that completes |\n|---|---|---:|\n");
    for ((trace, policy), ratio) in keys.iter().zip(&best) {
        let ratio = ratio.map_or("—".to_string(), |r| format!("{r:.2}"));
        out.push_str(&format!("| {trace} | {policy} | {ratio} |\n"));
    }
    out
}
