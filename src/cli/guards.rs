//! `--keep-needed-history`, `--remat-guard` and `--pin-resident-first`:
//! dtr's guards against rematerialisation cascades, beyond the DTR
//! authors' runtime. Shared by the commands that replay.

/// Each is on by default for the heuristics in
/// `dtr::policy::GUARDED_BY_DEFAULT` (the replays' default, `dtr-next`) and
/// off for the others.
/// `--FLAG` or `--FLAG=true` turns one on, `--FLAG=false` off.
#[derive(clap::Args, Debug, Clone, Copy)]
pub struct GuardArgs {
    /// Keep a released tensor resident while an evicted tensor still held
    /// needs it to be recomputed, instead of evicting it at once (see
    /// `Config::keep_needed_history`). Default: on for `dtr-next`, off for
    /// the others (the DTR authors' convention).
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub keep_needed_history: Option<bool>,
    /// Evict last a tensor whose rematerialisation (its ops run depth
    /// first, restored inputs locked) would hold more than the budget
    /// leaves beside the constants (see `Config::remat_memory_guard`).
    /// Default: on for `dtr-next`, off for the others.
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub remat_guard: Option<bool>,
    /// Pin a run of pins (a log's outputs, at its end) resident tensors
    /// first, so that rematerialising the evicted ones cannot evict them
    /// (see `Config::pin_resident_first`). Default: on for `dtr-next`, off
    /// for the others (the DTR authors' order).
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub pin_resident_first: Option<bool>,
}
