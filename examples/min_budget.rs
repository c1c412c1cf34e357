//! For each trace and policy, the smallest budget ratio (in steps of 0.05,
//! going down from 1.0 until the first failure) at which a replay
//! completes with compute overhead ≤ 1.5, in counter and arena memory.
//! Prints a markdown table.
//!
//! ```text
//! cargo run --release --example min_budget -- ../shared/traces/dtr-prototype/*.log
//! ```

use dtr::experiments::parallel_map;
use dtr::memory::MemoryModel;
use dtr::trace::replay::{baseline, replay, Kernels, ReplayStatus};
use dtr::trace::{self, Trace, TraceFormat};
use dtr::{Config, Interpreter, SimulatorBackend};

const POLICIES: [&str; 10] = [
    "dtr",
    "dtr-eq",
    "dtr-local",
    "msps",
    "lru",
    "size",
    "random",
    "dte",
    "coop",
    "coop-dtr",
];
const LIMIT: f64 = 1.5;

/// The smallest ratio that still completes within the limit, or `None` if even 1.0 fails.
fn smallest_ratio(
    trace: &Trace,
    authors_log: bool,
    policy: &str,
    memory: MemoryModel,
) -> Option<f64> {
    let base = baseline(trace);
    let mut best = None;
    for step in (1..=20).rev() {
        let ratio = step as f64 * 0.05;
        let config = Config::default()
            .with_budget_bytes((ratio * base.peak_bytes as f64).floor() as u64)
            .with_heuristic(policy)
            .with_memory(memory)
            .with_simulator_conventions(authors_log)
            .with_remat_limit(((LIMIT - 1.0) * base.compute as f64).floor() as u64);
        let mut dtr = Interpreter::new(SimulatorBackend::new(), config).expect("known policy");
        let report = replay(trace, &mut dtr, Kernels::Recorded).expect("trace replays");
        if report.status != ReplayStatus::Ok {
            break;
        }
        best = Some(ratio);
    }
    best
}

fn main() {
    let paths: Vec<String> = std::env::args().skip(1).collect();
    if paths.is_empty() {
        eprintln!("usage: min_budget TRACE...");
        std::process::exit(2);
    }
    let traces: Vec<(String, Trace, bool)> = paths
        .iter()
        .map(|path| {
            let (trace, format) =
                trace::load(path.as_ref(), None).unwrap_or_else(|e| panic!("{e}"));
            let name = std::path::Path::new(path)
                .file_name()
                .unwrap()
                .to_string_lossy();
            let name = name
                .split('-')
                .next()
                .unwrap()
                .trim_end_matches(".jsonl")
                .to_string();
            (name, trace, format == TraceFormat::Simrd)
        })
        .collect();
    let memories = [MemoryModel::Counter, MemoryModel::arena()];
    let cells: Vec<(usize, usize, usize)> = (0..traces.len())
        .flat_map(|t| {
            (0..memories.len()).flat_map(move |m| (0..POLICIES.len()).map(move |p| (t, m, p)))
        })
        .collect();
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let results = parallel_map(&cells, threads, &|_, _| eprint!("."), |&(t, m, p)| {
        let (_, trace, authors_log) = &traces[t];
        smallest_ratio(trace, *authors_log, POLICIES[p], memories[m])
    });
    eprintln!();
    for (m, memory) in ["counter", "arena"].iter().enumerate() {
        println!("\n{memory} memory: smallest ratio with overhead ≤ {LIMIT}\n");
        println!("| trace | {} |", POLICIES.join(" | "));
        println!("|---|{}", "---:|".repeat(POLICIES.len()));
        for (t, (name, _, _)) in traces.iter().enumerate() {
            let row: Vec<String> = (0..POLICIES.len())
                .map(|p| {
                    let i = cells.iter().position(|&c| c == (t, m, p)).unwrap();
                    results[i].map_or("—".to_string(), |r| format!("{r:.2}"))
                })
                .collect();
            println!("| {name} | {} |", row.join(" | "));
        }
    }
}
