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
#[cfg(feature = "plot")]
mod raster;
pub mod revolve;
pub mod run;
pub mod timeline;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use serde::{Deserialize, Serialize};

use crate::config::{Budget, RestoreMode, SwapConfig};
use crate::error::{Error, Result};
use crate::memory::MemoryModel;
use crate::policy::Sampling;
use crate::trace::replay::ReplayStatus;
pub use plan::Placement;
use plan::Plan;
pub use run::{Outcome, Policy, RunSpec, Workload, STATIC_CHECKPOINTING};

/// The grid to run.
#[derive(Debug, Clone)]
pub struct SweepSpec {
    /// Trace files (format detected).
    pub traces: Vec<PathBuf>,
    /// Heuristic names, or [`STATIC_CHECKPOINTING`].
    pub heuristics: Vec<String>,
    /// Memory models to run each heuristic in, or static plans to follow.
    pub memories: Vec<Placement>,
    /// How each heuristic samples its eviction candidates.
    pub samplings: Vec<Sampling>,
    /// How evicted storages come back.
    pub restores: Vec<RestoreMode>,
    /// The copy queue for restore modes that swap.
    pub swap: SwapConfig,
    /// See [`crate::Config::move_bandwidth`] (for `arena-compact` memory).
    pub move_bandwidth: f64,
    /// Seeds 0..seeds.
    pub seeds: u64,
    /// Budgets, as ratios of each trace's unbounded peak.
    pub ratios: Vec<f64>,
    /// Runs stop as thrashing past this multiple of the unbounded compute.
    pub thrash_limit: f64,
    /// See [`RunSpec::keep_needed_history`].
    pub keep_needed_history: Option<bool>,
    /// See [`RunSpec::remat_memory_guard`].
    pub remat_memory_guard: Option<bool>,
    /// See [`RunSpec::pin_resident_first`].
    pub pin_resident_first: Option<bool>,
}

/// One run of the grid: indices into the spec's lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Cell {
    /// Position in the whole grid (stable across shards).
    index: usize,
    trace: usize,
    heuristic: usize,
    memory: usize,
    restore: usize,
    sampling: usize,
    seed: u64,
    ratio: usize,
}

/// A shard `k` of `n` (1-based), for batch schedulers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shard {
    /// Which shard, from 1.
    pub k: usize,
    /// How many shards; shard `k` runs the cells whose index is `k - 1` modulo `n`.
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
    /// The cell's position in the whole grid (stable across shards).
    pub index: usize,
    /// The trace file, as given.
    pub trace: String,
    /// The heuristic, or [`STATIC_CHECKPOINTING`].
    pub heuristic: String,
    /// The memory model it ran in, or the static plan it followed.
    pub memory: Placement,
    /// How evicted storages came back (results from before swap: `drop`).
    #[serde(default)]
    pub restore: RestoreMode,
    /// How candidates were sampled.
    pub sampling: Sampling,
    /// The heuristic's seed.
    pub seed: u64,
    /// The budget over the unbounded peak; for static checkpointing, the
    /// peak it reached over the unbounded one.
    pub ratio: f64,
    /// The budget in bytes; for static checkpointing, the peak it reached.
    pub budget_bytes: u64,
    /// Whether the run completed, ran out of memory or thrashed.
    pub status: ReplayStatus,
    /// Total compute over the unbounded run's, for a run that completed;
    /// `None` (JSON `null`, CSV empty) for one that stopped.
    #[serde(default)]
    pub overhead: Option<f64>,
    /// For a run that stopped (out of memory, thrashing), the same ratio at
    /// the point where it stopped: how far it got, not what the run costs.
    #[serde(default)]
    pub overhead_at_stop: Option<f64>,
    /// Cost units spent recomputing.
    pub remat_compute: u64,
    /// The most bytes in use at once.
    pub peak_bytes: u64,
    /// Evictions, eager ones included.
    pub evictions: u64,
    /// Ops rerun to rematerialise evicted tensors.
    pub rematerializations: u64,
    /// At the end of the run, in arena memory (`None` in counter memory).
    pub fragmentation: Option<f64>,
    /// Wall-clock time of the replay, in seconds.
    pub wall_seconds: f64,
}

impl SweepSpec {
    /// Every cell, in a fixed order: trace, heuristic, memory, restore,
    /// sampling, seed, then ratio (fastest). Static checkpointing takes no
    /// budget, no randomness and no eviction: one cell per trace and memory
    /// model.
    fn cells(&self) -> Vec<Cell> {
        let mut cells = Vec::new();
        for trace in 0..self.traces.len() {
            for heuristic in 0..self.heuristics.len() {
                let fixed = self.heuristics[heuristic] == STATIC_CHECKPOINTING;
                let (restores, samplings, seeds, ratios) = if fixed {
                    (1, 1, 1, 1)
                } else {
                    (
                        self.restores.len(),
                        self.samplings.len(),
                        self.seeds.max(1),
                        self.ratios.len(),
                    )
                };
                // Memory model, restore mode, sampling, seed and ratio, as
                // the digits of one counter: the ratio varies fastest.
                let radices = [
                    self.memories.len(),
                    restores,
                    samplings,
                    seeds as usize,
                    ratios,
                ];
                for count in 0..radices.iter().product() {
                    let mut digits = [0usize; 5];
                    let mut rest = count;
                    for (digit, &radix) in digits.iter_mut().zip(&radices).rev() {
                        *digit = rest % radix;
                        rest /= radix;
                    }
                    let [memory, restore, sampling, seed, ratio] = digits;
                    cells.push(Cell {
                        index: cells.len(),
                        trace,
                        heuristic,
                        memory,
                        restore,
                        sampling,
                        seed: seed as u64,
                        ratio,
                    });
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
        self.run_resuming(shard, jobs, progress, Vec::new(), &|_| Ok(()))
    }

    /// [`SweepSpec::run`], given the rows of an earlier, interrupted run of
    /// the same grid (their cells are not run again), calling `finished`
    /// with each new row as its run ends (to save it at once). A row that
    /// is not of this grid is an error.
    pub fn run_resuming(
        &self,
        shard: Option<Shard>,
        jobs: usize,
        progress: &(dyn Fn(usize, usize) + Sync),
        done: Vec<Row>,
        finished: &(dyn Fn(&Row) -> Result<()> + Sync),
    ) -> Result<Vec<Row>> {
        self.validate()?;
        let cells: Vec<Cell> = self
            .cells()
            .into_iter()
            .filter(|c| shard.is_none_or(|s| s.owns(c.index)))
            .collect();
        let mut rows: Vec<Option<Row>> = vec![None; cells.len()];
        for row in done {
            let slot = cells
                .binary_search_by_key(&row.index, |c| c.index)
                .ok()
                .filter(|&slot| self.is_row_of(&cells[slot], &row))
                .ok_or_else(|| {
                    Error::InvalidArgument(format!(
                        "the saved run {} ({} / {} at {}) is not a cell of this sweep",
                        row.index, row.trace, row.heuristic, row.ratio
                    ))
                })?;
            rows[slot] = Some(row);
        }
        let todo: Vec<&Cell> = cells
            .iter()
            .zip(&rows)
            .filter(|(_, row)| row.is_none())
            .map(|(cell, _)| cell)
            .collect();
        let needed = |t: usize| todo.iter().any(|c| c.trace == t);
        let loaded: Vec<Option<Workload>> = (0..self.traces.len())
            .map(|t| {
                needed(t)
                    .then(|| Workload::load(&self.traces[t], None))
                    .transpose()
            })
            .collect::<Result<_>>()?;
        let new = parallel_map(&todo, jobs, progress, |cell| {
            let workload = loaded[cell.trace].as_ref().expect("loaded for its cells");
            let row = self.row(cell, self.run_cell(cell, workload)?);
            finished(&row)?;
            Ok(row)
        });
        let mut new = new.into_iter();
        rows.into_iter()
            .map(|row| match row {
                Some(row) => Ok(row),
                None => new.next().expect("a new row for each cell to do"),
            })
            .collect()
    }

    /// Whether `row` is what `cell` of this grid ran (as saved by an
    /// interrupted run).
    fn is_row_of(&self, cell: &Cell, row: &Row) -> bool {
        let spec = self.spec(cell);
        row.index == cell.index
            && row.trace == self.traces[cell.trace].display().to_string()
            && row.heuristic == self.heuristics[cell.heuristic]
            && row.memory == self.memories[cell.memory]
            && row.restore == spec.restore
            && row.sampling == spec.sampling
            && row.seed == spec.seed
            && match spec.budget {
                Budget::Ratio(ratio) => row.ratio == ratio,
                _ => true,
            }
    }

    /// Checks every cell's options, so a bad one fails before the first run.
    pub fn validate(&self) -> Result<()> {
        let plans = (self.memories.iter()).any(|m| matches!(m, Placement::Plan { .. }));
        if plans && self.restores.iter().any(|&r| r != RestoreMode::Drop) {
            return Err(Error::InvalidArgument(
                "static plans (`--memory plan`) record runs that restore by `drop`; \
                 sweep `--restore` without them"
                    .into(),
            ));
        }
        self.cells()
            .iter()
            .try_for_each(|cell| self.spec(cell).validate())
    }

    /// Runs one cell: its spec, or (a plan cell of a heuristic) the plan
    /// made from it, followed. Static checkpointing's schedule is static
    /// already: its plan cells run it counting bytes.
    fn run_cell(&self, cell: &Cell, workload: &Workload) -> Result<Outcome> {
        let spec = self.spec(cell);
        match (self.memories[cell.memory], &spec.policy) {
            (Placement::Plan { alignment }, Policy::Heuristic(_)) => {
                Plan::run(workload, &spec, alignment)
            }
            _ => spec.run(workload),
        }
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
            // A plan is made from a run that counts bytes (see `Plan::make`).
            memory: match self.memories[cell.memory] {
                Placement::Dynamic(memory) => memory,
                Placement::Plan { .. } => MemoryModel::Counter,
            },
            sampling: self.samplings[cell.sampling],
            seed: cell.seed,
            thrash_limit: self.thrash_limit,
            restore: self.restores[cell.restore],
            swap: self.swap,
            move_bandwidth: self.move_bandwidth,
            keep_needed_history: self.keep_needed_history,
            remat_memory_guard: self.remat_memory_guard,
            pin_resident_first: self.pin_resident_first,
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
            restore: self.restores[cell.restore],
            sampling: self.samplings[cell.sampling],
            seed: cell.seed,
            ratio,
            // A static plan's budget is the peak it reached.
            budget_bytes: budget_bytes.unwrap_or(report.peak_bytes),
            status: report.status,
            overhead: (report.status == ReplayStatus::Ok).then_some(overhead),
            overhead_at_stop: (report.status != ReplayStatus::Ok).then_some(overhead),
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
const CSV_HEADER: &str =
    "index,trace,heuristic,memory,restore,sampling,seed,ratio,budget_bytes,status,overhead,\
overhead_at_stop,remat_compute,peak_bytes,evictions,rematerializations,fragmentation,wall_seconds";

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
            r.restore.to_string(),
            r.sampling.to_string(),
            r.seed.to_string(),
            r.ratio.to_string(),
            r.budget_bytes.to_string(),
            r.status.to_string(),
            r.overhead.map_or(String::new(), |o| o.to_string()),
            r.overhead_at_stop.map_or(String::new(), |o| o.to_string()),
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
    let mut written = Vec::new();
    for (name, text) in &files {
        let path = dir.join(name);
        written.push((write_aside(&path, text.as_bytes())?, path));
    }
    for (aside, path) in written {
        aside.persist(&path).map_err(|e| Error::file(&path, e))?;
    }
    Ok(())
}

/// Writes `contents` to `path` whole or not at all: into a temporary file
/// beside it, renamed over `path` once complete, so a failed or
/// interrupted write leaves no half file.
pub fn write_atomic(path: &Path, contents: &[u8]) -> Result<()> {
    write_aside(path, contents)?
        .persist(path)
        .map(|_| ())
        .map_err(|e| Error::file(path, e))
}

/// `contents` in a temporary file in `path`'s directory, not yet renamed.
fn write_aside(path: &Path, contents: &[u8]) -> Result<tempfile::NamedTempFile> {
    use std::io::Write;
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    let mut builder = tempfile::Builder::new();
    builder.prefix(".dtr-").suffix(".tmp");
    // A temporary file is private (0600) by default; what it becomes is an
    // ordinary output, readable as the user's umask allows.
    #[cfg(unix)]
    builder.permissions(std::os::unix::fs::PermissionsExt::from_mode(0o666));
    let mut aside = builder.tempfile_in(dir).map_err(|e| Error::file(path, e))?;
    aside
        .write_all(contents)
        .and_then(|()| aside.as_file().sync_all())
        .map_err(|e| Error::file(path, e))?;
    Ok(aside)
}

/// Where a sweep saves each run as it finishes (a JSON row per line), until
/// it writes `results.json` and `results.csv` and removes it; an
/// interrupted sweep leaves it, and `dtr sweep --resume` continues from it.
pub const PARTIAL: &str = "results.partial.jsonl";

/// The rows an interrupted sweep saved in `dir` (none if it saved none).
/// A last line cut short (the process stopped while writing it) is
/// dropped; any other unreadable line is an error.
pub fn read_partial(dir: &Path) -> Result<Vec<Row>> {
    let path = dir.join(PARTIAL);
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(Error::file(&path, e)),
    };
    let lines: Vec<&str> = text.lines().collect();
    let mut rows = Vec::with_capacity(lines.len());
    for (i, line) in lines.iter().enumerate() {
        match serde_json::from_str::<Row>(line) {
            Ok(row) => rows.push(row),
            Err(_) if i + 1 == lines.len() && !text.ends_with('\n') => {}
            Err(e) => {
                return Err(Error::file(
                    &path,
                    format!("line {}: {e}; remove the file to start over", i + 1),
                ))
            }
        }
    }
    Ok(rows)
}

/// Appends finished rows to a sweep's [`PARTIAL`] file, one line each,
/// written through at once.
pub struct PartialWriter {
    path: PathBuf,
    file: std::sync::Mutex<std::fs::File>,
}

impl PartialWriter {
    /// Opens `dir`'s partial file for appending; with `rows`, rewrites it
    /// to hold exactly those (the complete rows of a resumed sweep).
    pub fn create(dir: &Path, rows: &[Row]) -> Result<PartialWriter> {
        let path = dir.join(PARTIAL);
        let mut text = String::new();
        for row in rows {
            text += &serde_json::to_string(row).map_err(|e| Error::file(&path, e))?;
            text.push('\n');
        }
        write_atomic(&path, text.as_bytes())?;
        let file = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .map_err(|e| Error::file(&path, e))?;
        Ok(PartialWriter {
            path,
            file: std::sync::Mutex::new(file),
        })
    }

    /// Saves one finished row.
    pub fn append(&self, row: &Row) -> Result<()> {
        use std::io::Write;
        let mut line = serde_json::to_string(row).map_err(|e| Error::file(&self.path, e))?;
        line.push('\n');
        let mut file = self
            .file
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        file.write_all(line.as_bytes())
            .map_err(|e| Error::file(&self.path, e))
    }

    /// The sweep is written in full: the partial file goes.
    pub fn remove(self) -> Result<()> {
        std::fs::remove_file(&self.path).map_err(|e| Error::file(&self.path, e))
    }
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
    let mut rows: Vec<Row> = serde_json::from_str(&text).map_err(|e| Error::file(&path, e))?;
    // Files written before `overhead_at_stop` gave stopped runs an overhead.
    for row in &mut rows {
        if row.status != ReplayStatus::Ok && row.overhead_at_stop.is_none() {
            row.overhead_at_stop = row.overhead.take();
        }
    }
    Ok(rows)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(unix)]
    #[test]
    fn atomic_outputs_get_an_ordinary_files_permissions() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let (atomic, plain) = (dir.path().join("a.json"), dir.path().join("b.json"));
        write_atomic(&atomic, b"{}").unwrap();
        std::fs::write(&plain, b"{}").unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&atomic), mode(&plain));
        assert_eq!(std::fs::read(&atomic).unwrap(), b"{}");
    }
}
