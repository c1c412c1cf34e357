//! Replay speed on the DTR authors' logs: each log at ratio 0.5 with `dtr`
//! (median of 5), and the whole grid of 8 logs × 6 heuristics × 9 ratios
//! spread over all cores. Needs `../shared/traces/dtr-prototype` (or
//! `DTR_PROTOTYPE_TRACES`); says so and exits when it is absent.
//!
//! `cargo bench --bench replay`

use std::path::{Path, PathBuf};
use std::time::Instant;

use dtr::experiments::parallel_map;
use dtr::trace::replay::{baseline, replay, Kernels};
use dtr::trace::{simrd, Trace};
use dtr::{Config, Interpreter, SimulatorBackend};

const HEURISTICS: [&str; 6] = ["dtr", "dtr-eq", "dtr-local", "msps", "lru", "size"];
const RATIOS: [f64; 9] = [0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1];

fn run(trace: &Trace, heuristic: &str, ratio: f64) -> f64 {
    let base = baseline(trace);
    let config = Config::default()
        .with_budget_bytes((ratio * base.peak_bytes as f64).floor() as u64)
        .with_heuristic(heuristic)
        .with_simulator_conventions(true)
        .with_remat_limit(base.compute);
    let mut dtr = Interpreter::new(SimulatorBackend::new(), config).expect("known heuristic");
    let started = Instant::now();
    replay(trace, &mut dtr, Kernels::Recorded).expect("the authors' logs replay");
    started.elapsed().as_secs_f64()
}

fn main() {
    let dir = std::env::var_os("DTR_PROTOTYPE_TRACES")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/traces/dtr-prototype")
        });
    let Ok(entries) = std::fs::read_dir(&dir) else {
        eprintln!(
            "skipped: {} not found (set DTR_PROTOTYPE_TRACES)",
            dir.display()
        );
        return;
    };
    let mut logs: Vec<PathBuf> = entries
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "log"))
        .collect();
    logs.sort();
    let traces: Vec<(String, Trace)> = logs
        .iter()
        .map(|path| {
            let name = path
                .file_name()
                .unwrap()
                .to_string_lossy()
                .split('-')
                .next()
                .unwrap()
                .to_string();
            let started = Instant::now();
            let trace = simrd::parse(&name, &std::fs::read_to_string(path).unwrap()).unwrap();
            println!(
                "parsed {name:<16} {:>7} events in {:>6.1} ms",
                trace.events.len(),
                started.elapsed().as_secs_f64() * 1e3
            );
            (name, trace)
        })
        .collect();

    println!("\nreplay at ratio 0.5 with dtr (median of 5):");
    for (name, trace) in &traces {
        let mut times: Vec<f64> = (0..5).map(|_| run(trace, "dtr", 0.5)).collect();
        times.sort_by(f64::total_cmp);
        println!("  {name:<16} {:>8.2} ms", times[2] * 1e3);
    }

    let cells: Vec<(usize, &str, f64)> = (0..traces.len())
        .flat_map(|t| {
            HEURISTICS
                .iter()
                .flat_map(move |&h| RATIOS.iter().map(move |&r| (t, h, r)))
        })
        .collect();
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let started = Instant::now();
    parallel_map(&cells, threads, &|_, _| {}, |&(t, h, r)| {
        run(&traces[t].1, h, r)
    });
    println!(
        "\nwhole grid: {} replays ({} logs x {} heuristics x {} ratios) in {:.1} s on {threads} threads",
        cells.len(),
        traces.len(),
        HEURISTICS.len(),
        RATIOS.len(),
        started.elapsed().as_secs_f64()
    );
}
