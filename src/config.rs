//! Interpreter configuration: a plain value with defaults and a builder,
//! and the memory budget it names.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::memory::MemoryModel;
use crate::policy::Sampling;

/// How much memory a run may use.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Budget {
    /// Exactly this many bytes.
    Bytes(u64),
    /// This fraction of a reference, floored to bytes: of the backend's
    /// device memory for an [`crate::Interpreter`] (in (0, 1]), of the
    /// unbounded run's peak for a trace replay (any positive ratio).
    Ratio(f64),
    /// No limit: memory is only counted.
    #[default]
    Unbounded,
}

impl Budget {
    /// The budget in bytes: a ratio is taken of `reference()`, which is
    /// only asked for then. Errors on a ratio that is not positive and finite.
    pub fn resolve(self, reference: impl FnOnce() -> Result<u64>) -> Result<Option<u64>> {
        match self {
            Budget::Bytes(bytes) => Ok(Some(bytes)),
            Budget::Unbounded => Ok(None),
            Budget::Ratio(ratio) if ratio.is_finite() && ratio > 0.0 => {
                Ok(Some((ratio * reference()? as f64).floor() as u64))
            }
            Budget::Ratio(ratio) => Err(Error::InvalidArgument(format!(
                "a budget ratio must be positive and finite, got {ratio}"
            ))),
        }
    }
}

/// Some bytes, or unbounded.
impl From<Option<u64>> for Budget {
    fn from(bytes: Option<u64>) -> Budget {
        bytes.map_or(Budget::Unbounded, Budget::Bytes)
    }
}

impl std::fmt::Display for Budget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Budget::Bytes(bytes) => write!(f, "{}", bytesize::ByteSize::b(*bytes)),
            Budget::Ratio(ratio) => write!(f, "{ratio}×"),
            Budget::Unbounded => f.write_str("unbounded"),
        }
    }
}

/// Parses a size in bytes: `4096`, `64MiB`, `1.5 GB` (SI and binary units,
/// case-insensitive).
pub fn parse_bytes(text: &str) -> Result<u64> {
    let text = text.trim();
    let number_end = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let bad = |why: &str| Error::InvalidArgument(format!("`{text}` is not a size: {why}"));
    let number = &text[..number_end];
    if number_end == 0 || number.parse::<f64>().is_err() {
        return Err(bad("expected a number and a unit, like 1.5GiB"));
    }
    if number_end == text.len() && !number.contains('.') && number.parse::<u64>().is_err() {
        return Err(bad("more bytes than 64 bits count"));
    }
    text.parse::<bytesize::ByteSize>()
        .map(|size| size.as_u64())
        .map_err(|_| bad("the units are B, KB, MB, GB, TB, PB, EB, KiB, MiB, GiB, TiB, PiB, EiB"))
}

/// How an evicted storage comes back when it is needed again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
pub enum RestoreMode {
    /// Its bytes are freed and it is recomputed from its history (DTR).
    /// Storages that cannot be recomputed (puts, detached tensors) stay.
    #[default]
    Drop,
    /// It is copied to host memory and copied back; recomputed only when
    /// host memory is full or the backend cannot swap. Storages that cannot
    /// be recomputed are swapped too.
    Swap,
    /// Per storage, whichever the estimates make cheaper: the transfer
    /// (bytes over the swap bandwidth, less what overlapped with compute)
    /// or the recomputation. Storages that cannot be recomputed are
    /// swapped.
    Hybrid,
}

impl std::fmt::Display for RestoreMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            RestoreMode::Drop => "drop",
            RestoreMode::Swap => "swap",
            RestoreMode::Hybrid => "hybrid",
        })
    }
}

impl std::str::FromStr for RestoreMode {
    type Err = Error;

    fn from_str(text: &str) -> Result<RestoreMode> {
        match text {
            "drop" => Ok(RestoreMode::Drop),
            "swap" => Ok(RestoreMode::Swap),
            "hybrid" => Ok(RestoreMode::Hybrid),
            _ => Err(Error::InvalidArgument(format!(
                "unknown restore mode `{text}` (expected drop, swap or hybrid)"
            ))),
        }
    }
}

/// The host side of swapping: a copy queue of `bandwidth` bytes per second
/// that runs beside compute, and a limit on the host memory holding copies.
///
/// Costs are taken as nanoseconds (what recorded traces measure), so a
/// transfer of `b` bytes takes `b / bandwidth · 10⁹` cost units.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct SwapConfig {
    /// Bytes per second each way. The default, 16 GB/s, is about what
    /// PCIe 4.0 ×16 gives in practice.
    pub bandwidth: f64,
    /// The most bytes host copies may hold at once; `None` is no limit.
    pub host_memory: Option<u64>,
}

impl Default for SwapConfig {
    fn default() -> SwapConfig {
        SwapConfig {
            bandwidth: 16e9,
            host_memory: None,
        }
    }
}

impl SwapConfig {
    /// Cost units (nanoseconds) to move `bytes` one way.
    pub fn transfer_cost(&self, bytes: u64) -> u64 {
        (bytes as f64 * 1e9 / self.bandwidth).ceil() as u64
    }

    /// Checks that the bandwidth is a positive, finite number.
    pub fn validate(&self) -> Result<()> {
        if self.bandwidth.is_finite() && self.bandwidth > 0.0 {
            Ok(())
        } else {
            Err(Error::InvalidArgument(format!(
                "the swap bandwidth must be positive and finite, got {} B/s",
                self.bandwidth
            )))
        }
    }
}

/// The default [`Config::ordered_search`]: from about this many candidates
/// a plain scan takes tens of µs per eviction (`cargo bench --bench
/// search`), more than keeping the order costs; below it, the tree updates
/// cost a replay more than the scans they save (on the authors' logs, whose
/// pools stay smaller, the Transformer's replay took 40% more instructions).
pub const ORDERED_SEARCH_FROM: usize = 4096;

/// How the interpreter manages memory.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// The memory budget; a ratio is of the backend's device memory,
    /// resolved to bytes when the interpreter starts.
    pub budget: Budget,
    /// The eviction heuristic, by registry name (see [`crate::policy::heuristic_names`]).
    pub heuristic: String,
    /// Evict a storage as soon as no user handle refers to it, keeping its
    /// history for recomputation (the DTR authors' "eager eviction").
    pub eager_eviction: bool,
    /// Keep a log of evictions and rematerialisations (see [`crate::Event`]).
    pub record_events: bool,
    /// Never free a tensor's history, even when nothing can need it again:
    /// released tensors stay as evicted graph nodes and released puts stay
    /// resident. This is the DTR authors' simulator's convention, which
    /// replays of their logs follow to reproduce their numbers.
    pub retain_history: bool,
    /// Stop with [`crate::Error::Thrash`] once rematerialisation has cost more
    /// than this (the authors stop at 1× the unbounded run's compute).
    pub remat_limit: Option<u64>,
    /// Under a budget, stop with [`crate::Error::Thrash`] once
    /// rematerialisation has cost more than this many times the compute of
    /// every op's first run so far. Where the program's length is not known
    /// (the eager and PyTorch APIs), this is what turns a budget too small
    /// to make progress (recomputing the same history over and over) into
    /// an error instead of a hang.
    pub remat_ratio_limit: Option<f64>,
    /// Counting bytes, or placing them in an arena of exactly the budget.
    pub memory: MemoryModel,
    /// Which candidates the victim search scores.
    pub sampling: Sampling,
    /// With [`Sampling::All`], once this many candidates can be evicted,
    /// let the search visit them in the order of a lower bound of the
    /// heuristic's scores and stop where no remaining one can beat the best
    /// (for heuristics that have such a bound: `dtr`, `dtr-eq`,
    /// `dtr-local`, `msps`, `lru`, `size`). The choices are exactly those
    /// of the plain scan in pool order. Keeping the order costs every
    /// change of candidacy a tree update, which smaller pools, scanned in
    /// a few µs, do not repay: the default is [`ORDERED_SEARCH_FROM`].
    /// `None` keeps the plain scan (to compare with it), `Some(0)` the
    /// order always.
    pub ordered_search: Option<usize>,
    /// Seeds every random choice (sampling, `random`); same seed, same run.
    pub seed: u64,
    /// When an op cannot get room during a deep rematerialisation, let the
    /// heuristic also evict inputs that the pending rematerialisations below
    /// it hold locked, instead of failing. Each storage is surrendered at
    /// most once per rematerialisation, so it always terminates. The DTR
    /// authors' simulator does not do this; replays of their logs turn it
    /// off to reproduce their numbers.
    pub lock_relaxation: bool,
    /// Evict only as a last resort a storage whose rematerialisation could
    /// not fit: run depth first as the interpreter runs it, each restored
    /// input locked until its op has run, it would hold more recomputable
    /// bytes at once (inputs and outputs) than the budget leaves beside the
    /// most memory constants (puts, detached tensors) have held. Such a
    /// storage, once evicted, can only come back if the constants shrink;
    /// typically a tensor held for later whose history is large and gone (a
    /// tied weight's first gradient, waiting for the second; a skip
    /// connection's gradient, waiting for the encoder's backward pass). Off
    /// by default: the DTR authors' runtime does not do this, and replays of
    /// their logs must reproduce their numbers. The `dtr` Python package
    /// and replays under `dtr-next` turn it on.
    pub remat_memory_guard: bool,
    /// Apply [`Config::remat_memory_guard`] inside the candidate search
    /// (where the search scores every candidate it could choose): one
    /// search per eviction, rather than one more per candidate held back.
    /// The same decisions either way; on by default, off only to check that.
    pub guard_in_search: bool,
    /// Storages smaller than this are never the policy's victims: they stay
    /// resident while held (released ones still go at once, and
    /// [`Interpreter::evict_now`](crate::Interpreter::evict_now) still
    /// takes them). Evicting one frees next to nothing, and on
    /// PyTorch's CPU some kernels read small index tensors (a packed
    /// sequence's `batch_sizes`, `tensor_split`'s indices) directly from
    /// memory, outside any op the session sees, so they must stay. MegEngine's
    /// DTR has the same floor. 0 (every storage may go) by default; the `dtr`
    /// Python package sets it (see `dtr.torch`).
    pub min_evictable_bytes: u64,
    /// Under eager eviction, keep a released storage resident (an ordinary
    /// eviction candidate, scored by the heuristic) while an evicted tensor
    /// that the user still holds needs it to be recomputed, directly or
    /// through other evicted storages. Evicting it at once would lengthen
    /// that tensor's rematerialisation by its whole evicted history, which
    /// the heuristic priced when it chose the victim but cannot foresee:
    /// the cascades that make a larger budget thrash where a smaller one
    /// completes (issue 15). Off by default: the DTR authors' simulator
    /// evicts every released tensor at once, and replays of their logs
    /// must reproduce their numbers. Replays under `dtr-next` turn it on.
    pub keep_needed_history: bool,
    /// A replay pins a run of consecutive pins (a log's outputs, pinned at
    /// its end) resident tensors first, then the evicted ones, each
    /// rematerialised as it is pinned. In log order, rematerialising an
    /// evicted output could evict outputs still to be pinned, which must
    /// then come back through their whole history: at the end of a
    /// backward pass, a cascade. Pins commute, so the values are the
    /// same. Off by default: the DTR authors' simulator pins in log order.
    /// Replays under `dtr-next` turn it on.
    pub pin_resident_first: bool,
    /// When nothing else can make room, free a constant that no handle
    /// holds but the history of held tensors still reads (a batch the
    /// program has let go of, an index tensor an op made) by detaching
    /// those tensors: the nearest held one on each path, when all are
    /// resident and those not in use by a running op take fewer bytes
    /// than the constant. They are then never evicted, but the budget
    /// holds. Stock PyTorch frees such a
    /// constant once the backward pass is done with it, so without this a
    /// budget at stock PyTorch's peak can run out of memory. Off by
    /// default (replays keep the DTR authors' numbers); the `dtr` Python
    /// package turns it on.
    pub free_constants_by_detaching: bool,
    /// How evicted storages come back: recomputed (DTR's drop), copied
    /// back from host memory, or whichever is cheaper.
    pub restore: RestoreMode,
    /// The copy queue and host memory that swapping uses.
    pub swap: SwapConfig,
    /// Bytes per second a compacting arena
    /// ([`MemoryModel::CompactingArena`]) moves blocks at, on the compute
    /// stream (costs are taken as nanoseconds). The default, 300 GB/s, is
    /// about what a device-to-device copy moves on a V100-class GPU, which
    /// reads and writes every byte.
    pub move_bandwidth: f64,
}

/// The default [`Config::move_bandwidth`].
pub const MOVE_BANDWIDTH: f64 = 300e9;

impl Default for Config {
    fn default() -> Config {
        Config {
            budget: Budget::Unbounded,
            heuristic: crate::policy::DEFAULT_HEURISTIC.into(),
            ordered_search: Some(ORDERED_SEARCH_FROM),
            eager_eviction: true,
            record_events: false,
            retain_history: false,
            remat_limit: None,
            remat_ratio_limit: None,
            memory: MemoryModel::Counter,
            sampling: Sampling::All,
            seed: 0,
            lock_relaxation: true,
            remat_memory_guard: false,
            guard_in_search: true,
            min_evictable_bytes: 0,
            keep_needed_history: false,
            pin_resident_first: false,
            free_constants_by_detaching: false,
            restore: RestoreMode::Drop,
            swap: SwapConfig::default(),
            move_bandwidth: MOVE_BANDWIDTH,
        }
    }
}

impl Config {
    /// The memory budget.
    pub fn with_budget(mut self, budget: Budget) -> Config {
        self.budget = budget;
        self
    }

    /// A budget of `budget_bytes` bytes.
    pub fn with_budget_bytes(self, budget_bytes: u64) -> Config {
        self.with_budget(Budget::Bytes(budget_bytes))
    }

    /// A budget of `fraction` of the device's memory (see
    /// [`crate::Backend::device_memory_bytes`]).
    pub fn with_device_memory_fraction(self, fraction: f64) -> Config {
        self.with_budget(Budget::Ratio(fraction))
    }

    /// No budget: nothing is evicted but what eager eviction drops.
    pub fn unbounded(self) -> Config {
        self.with_budget(Budget::Unbounded)
    }

    /// The eviction heuristic, by name (`dtr heuristics` lists them).
    pub fn with_heuristic(mut self, name: impl Into<String>) -> Config {
        self.heuristic = name.into();
        self
    }

    /// See [`Config::eager_eviction`].
    pub fn with_eager_eviction(mut self, eager: bool) -> Config {
        self.eager_eviction = eager;
        self
    }

    /// See [`Config::retain_history`].
    pub fn with_retained_history(mut self, retain: bool) -> Config {
        self.retain_history = retain;
        self
    }

    /// See [`Config::remat_ratio_limit`].
    pub fn with_remat_ratio_limit(mut self, ratio: f64) -> Config {
        self.remat_ratio_limit = Some(ratio);
        self
    }

    /// See [`Config::remat_limit`].
    pub fn with_remat_limit(mut self, limit: u64) -> Config {
        self.remat_limit = Some(limit);
        self
    }

    /// See [`Config::memory`].
    pub fn with_memory(mut self, memory: MemoryModel) -> Config {
        self.memory = memory;
        self
    }

    /// See [`Config::sampling`].
    pub fn with_sampling(mut self, sampling: Sampling) -> Config {
        self.sampling = sampling;
        self
    }

    /// See [`Config::ordered_search`].
    pub fn with_ordered_search(mut self, from: Option<usize>) -> Config {
        self.ordered_search = from;
        self
    }

    /// See [`Config::seed`].
    pub fn with_seed(mut self, seed: u64) -> Config {
        self.seed = seed;
        self
    }

    /// The DTR authors' simulator's conventions, to reproduce its numbers:
    /// history is retained and pending rematerialisations keep their locks.
    pub fn with_simulator_conventions(self, follow: bool) -> Config {
        self.with_retained_history(follow)
            .with_lock_relaxation(!follow)
    }

    /// See [`Config::min_evictable_bytes`].
    pub fn with_min_evictable_bytes(mut self, bytes: u64) -> Config {
        self.min_evictable_bytes = bytes;
        self
    }

    /// See [`Config::lock_relaxation`].
    pub fn with_lock_relaxation(mut self, relax: bool) -> Config {
        self.lock_relaxation = relax;
        self
    }

    /// See [`Config::remat_memory_guard`].
    pub fn with_remat_memory_guard(mut self, guard: bool) -> Config {
        self.remat_memory_guard = guard;
        self
    }

    /// See [`Config::guard_in_search`].
    pub fn with_guard_in_search(mut self, in_search: bool) -> Config {
        self.guard_in_search = in_search;
        self
    }

    /// See [`Config::keep_needed_history`].
    pub fn with_kept_needed_history(mut self, keep: bool) -> Config {
        self.keep_needed_history = keep;
        self
    }

    /// See [`Config::pin_resident_first`].
    pub fn with_resident_pinned_first(mut self, first: bool) -> Config {
        self.pin_resident_first = first;
        self
    }

    /// See [`Config::free_constants_by_detaching`].
    pub fn with_constants_freed_by_detaching(mut self, free: bool) -> Config {
        self.free_constants_by_detaching = free;
        self
    }

    /// How evicted storages come back: recomputed, or from host copies.
    pub fn with_restore(mut self, restore: RestoreMode) -> Config {
        self.restore = restore;
        self
    }

    /// The copy queue and host memory used when swapping.
    pub fn with_swap(mut self, swap: SwapConfig) -> Config {
        self.swap = swap;
        self
    }

    /// See [`Config::move_bandwidth`].
    pub fn with_move_bandwidth(mut self, bytes_per_second: f64) -> Config {
        self.move_bandwidth = bytes_per_second;
        self
    }

    /// Cost units (nanoseconds) to move `bytes` within device memory.
    pub fn move_cost(&self, bytes: u64) -> u64 {
        (bytes as f64 * 1e9 / self.move_bandwidth).ceil() as u64
    }

    /// The bytes moved within device memory in `cost` units (nanoseconds).
    pub fn bytes_moved_in(&self, cost: u64) -> u64 {
        (cost as f64 * self.move_bandwidth / 1e9) as u64
    }

    /// Checks that the move bandwidth is a positive, finite number.
    pub fn validate_move_bandwidth(bandwidth: f64) -> Result<()> {
        if bandwidth.is_finite() && bandwidth > 0.0 {
            Ok(())
        } else {
            Err(Error::InvalidArgument(format!(
                "the move bandwidth must be positive and finite, got {bandwidth} B/s"
            )))
        }
    }

    /// See [`Config::record_events`].
    pub fn with_events(mut self, record: bool) -> Config {
        self.record_events = record;
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_in_si_and_binary_units() {
        for (text, bytes) in [
            ("4096", 4096),
            ("4096B", 4096),
            ("1.5KiB", 1536),
            ("64MiB", 64 << 20),
            ("1 GiB", 1 << 30),
            ("800MB", 800_000_000),
            ("2gb", 2_000_000_000),
        ] {
            assert_eq!(parse_bytes(text).unwrap(), bytes, "{text}");
        }
        for bad in ["", "MiB", "-1", "1.5XB", "GiB1", "nan"] {
            let error = parse_bytes(bad).unwrap_err().to_string();
            assert!(error.contains("is not a size"), "{bad}: {error}");
        }
        let error = parse_bytes("99999999999999999999999").unwrap_err();
        assert!(error.to_string().contains("64 bits"), "{error}");
    }

    #[test]
    fn a_ratio_is_resolved_against_its_reference_only_when_asked() {
        let never = || -> Result<u64> { panic!("no reference needed") };
        assert_eq!(Budget::Bytes(7).resolve(never).unwrap(), Some(7));
        assert_eq!(Budget::Unbounded.resolve(never).unwrap(), None);
        assert_eq!(Budget::Ratio(0.5).resolve(|| Ok(1001)).unwrap(), Some(500));
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            assert!(Budget::Ratio(bad).resolve(|| Ok(1)).is_err(), "{bad}");
        }
    }
}
