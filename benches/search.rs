//! Cost of one eviction against the number of candidates, for a full scan
//! and for √N sampling. N independent recomputable storages of 1 KiB sit
//! in a budget they fill exactly; each new 1 KiB op then evicts one.
//!
//! A second table times √N sampling at 10⁶ candidates after a warm-up of
//! evictions, once the per-storage caches of `dtr-eq` (each candidate's
//! evicted neighbours) are filled, as they are in a long replay: the first
//! table's few evictions mostly score candidates never scored before.
//!
//! `cargo bench --bench search`

use std::time::Instant;

use dtr::ops::{RecordedOp, RecordedOutput};
use dtr::policy::Sampling;
use dtr::{Config, Interpreter, Op, SimulatorBackend};

fn kib_op(cost: u64) -> Op {
    Op::Recorded(RecordedOp {
        call: 0,
        module: None,
        name: "make".into(),
        cost,
        outputs: [RecordedOutput {
            bytes: 1024,
            alias_of: None,
        }]
        .into_iter()
        .collect(),
    })
}

/// Seconds per eviction with `n` candidates, timed after `warmup` evictions.
fn per_eviction(n: usize, sampling: Sampling, warmup: usize, evictions: usize) -> f64 {
    let config = Config::default()
        .with_heuristic("dtr-eq")
        .with_sampling(sampling)
        .with_seed(1);
    let mut dtr = Interpreter::new(SimulatorBackend::new(), config).unwrap();
    for i in 0..n {
        dtr.apply_op(kib_op(1 + (i as u64 * 7919) % 1000), &[])
            .unwrap();
    }
    dtr.set_budget_bytes(Some(dtr.memory().in_use_bytes));
    for i in evictions..evictions + warmup {
        dtr.apply_op(kib_op(1 + (i as u64 * 104_729) % 1000), &[])
            .unwrap();
    }
    let started = Instant::now();
    for i in 0..evictions {
        dtr.apply_op(kib_op(1 + (i as u64 * 104_729) % 1000), &[])
            .unwrap();
    }
    assert_eq!(dtr.stats().evictions as usize, warmup + evictions);
    started.elapsed().as_secs_f64() / evictions as f64
}

fn main() {
    println!("| candidates | full scan | √N sampling | speedup |");
    println!("|---:|---:|---:|---:|");
    for n in [1_000, 10_000, 100_000, 1_000_000] {
        let evictions = (20_000_000 / n).clamp(200, 5_000);
        let full = per_eviction(n, Sampling::All, 0, evictions);
        let sqrt = per_eviction(n, Sampling::Sqrt, 0, evictions);
        println!(
            "| {n} | {:.1} µs | {:.2} µs | {:.0}× |",
            full * 1e6,
            sqrt * 1e6,
            full / sqrt
        );
    }
    println!();
    println!("| candidates | warm-up evictions | √N sampling, per eviction |");
    println!("|---:|---:|---:|");
    let n = 1_000_000;
    for warmup in [0, 20_000, 100_000] {
        let sqrt = per_eviction(n, Sampling::Sqrt, warmup, 5_000);
        println!("| {n} | {warmup} | {:.2} µs |", sqrt * 1e6);
    }
}
