//! Cost of one eviction against the number of candidates, for a full scan
//! and for √N sampling. N independent recomputable storages of 1 KiB sit
//! in a budget they fill exactly; each new 1 KiB op then evicts one.
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

/// Seconds per eviction with `n` candidates.
fn per_eviction(n: usize, sampling: Sampling, evictions: usize) -> f64 {
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
    let started = Instant::now();
    for i in 0..evictions {
        dtr.apply_op(kib_op(1 + (i as u64 * 104_729) % 1000), &[])
            .unwrap();
    }
    assert_eq!(dtr.stats().evictions as usize, evictions);
    started.elapsed().as_secs_f64() / evictions as f64
}

fn main() {
    println!("| candidates | full scan | √N sampling | speedup |");
    println!("|---:|---:|---:|---:|");
    for n in [1_000, 10_000, 100_000, 1_000_000] {
        let evictions = (20_000_000 / n).clamp(200, 5_000);
        let full = per_eviction(n, Sampling::All, evictions);
        let sqrt = per_eviction(n, Sampling::Sqrt, evictions);
        println!(
            "| {n} | {:.1} µs | {:.2} µs | {:.0}× |",
            full * 1e6,
            sqrt * 1e6,
            full / sqrt
        );
    }
}
