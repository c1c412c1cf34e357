//! Cost of one eviction against the number of candidates, for a full scan
//! (the plain scan in pool order, and the ordered search that
//! `--sampling all` runs, which chooses the same) and for √N sampling. N independent recomputable storages of 1 KiB sit
//! in a budget they fill exactly; each new 1 KiB op then evicts one.
//!
//! A third bench times √N sampling at 10⁶ candidates after a warm-up of
//! evictions, once the per-storage caches of `dtr-eq` (each candidate's
//! evicted neighbours) are filled, as they are in a long replay: the other
//! benches' few evictions mostly score candidates never scored before.
//!
//! A fourth times the choice alone: one √N search over a fixed pool of
//! independent candidates, scored by their bound, without the op, the
//! eviction or the graph around it.
//!
//! `cargo bench --bench search` (any divan flag after `--`, such as a name
//! filter).

use divan::Bencher;

use dtr::graph::{Residency, StorageId, StorageInfo};
use dtr::policy::{CandidatePool, CandidateSearch, Sampling};
use dtr::{Config, Interpreter, Op, SimulatorBackend};
use slotmap::SlotMap;

fn main() {
    divan::main();
}

fn kib_op(cost: u64) -> Op {
    Op::recorded("make", cost, 1024)
}

/// Times one eviction per iteration: each iteration's new 1 KiB op evicts
/// one of `n` candidates, after `warmup` evictions.
fn evictions(bencher: Bencher, n: usize, sampling: Sampling, warmup: usize) {
    evictions_with(bencher, n, sampling, warmup, true);
}

/// As [`evictions`], with the ordered exact search on or off.
fn evictions_with(bencher: Bencher, n: usize, sampling: Sampling, warmup: usize, ordered: bool) {
    let config = Config::default()
        .with_heuristic("dtr-eq")
        .with_sampling(sampling)
        .with_ordered_search(ordered.then_some(0))
        .with_seed(1);
    let mut dtr = Interpreter::new(SimulatorBackend::new(), config).unwrap();
    for i in 0..n {
        dtr.apply_op(kib_op(1 + (i as u64 * 7919) % 1000), &[])
            .unwrap();
    }
    dtr.set_budget_bytes(Some(dtr.memory().in_use_bytes));
    let mut i = 0u64;
    let mut evict_one = || {
        dtr.apply_op(kib_op(1 + (i * 104_729) % 1000), &[]).unwrap();
        i += 1;
    };
    for _ in 0..warmup {
        evict_one();
    }
    bencher.bench_local(evict_one);
    assert_eq!(dtr.stats().evictions, i);
}

const CANDIDATES: [usize; 4] = [1_000, 10_000, 100_000, 1_000_000];

/// `--sampling all` as it was: every candidate read, in pool order.
#[divan::bench(args = CANDIDATES)]
fn full_scan(bencher: Bencher, candidates: usize) {
    evictions_with(bencher, candidates, Sampling::All, 0, false);
}

/// `--sampling all` now: in the order of `c0 / m`, oldest first, stopping
/// where no candidate left can beat the best.
#[divan::bench(args = CANDIDATES)]
fn ordered_scan(bencher: Bencher, candidates: usize) {
    evictions(bencher, candidates, Sampling::All, 0);
}

#[divan::bench(args = CANDIDATES)]
fn sqrt_sampling(bencher: Bencher, candidates: usize) {
    evictions(bencher, candidates, Sampling::Sqrt, 0);
}

/// √N sampling at 10⁶ candidates after `warmup` evictions.
#[divan::bench(args = [0, 20_000, 100_000])]
fn sqrt_sampling_at_a_million_after(bencher: Bencher, warmup: usize) {
    evictions(bencher, 1_000_000, Sampling::Sqrt, warmup);
}

/// One √N search over `candidates` fixed candidates of 1 KiB, each scored
/// by its cost density (what `dtr-eq` scores an isolated storage): the
/// choice of a victim alone.
#[divan::bench(args = CANDIDATES)]
fn sqrt_search_alone(bencher: Bencher, candidates: usize) {
    let mut keys: SlotMap<StorageId, ()> = SlotMap::with_key();
    let mut pool = CandidatePool::new();
    for i in 0..candidates as u64 {
        let info = StorageInfo {
            bytes: 1024,
            tensors: Default::default(),
            residency: Residency::Resident,
            last_access: i,
            cost: 1 + (i * 7919) % 1000,
            recomputable: true,
            lasting: false,
        };
        pool.insert(keys.insert(()), 1024, &info);
    }
    let clock = candidates as u64 + 1;
    let mut search = CandidateSearch::new(Sampling::Sqrt, 1);
    bencher.bench_local(|| {
        search
            .lowest(&pool, Some(clock), |candidate, _| {
                Some(candidate.cost_density_bound(clock))
            })
            .expect("a victim")
    });
}
