//! Replay speed on the DTR authors' logs: each log at ratio 0.5 with `dtr`,
//! and the whole grid of 8 logs × 6 heuristics × 9 ratios spread over all
//! cores. Needs `../shared/traces/dtr-prototype` (or `DTR_PROTOTYPE_TRACES`);
//! says so and benches nothing when it is absent.
//!
//! `cargo bench --bench replay` (any divan flag after `--`, such as a name
//! filter).

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use divan::Bencher;
use dtr::experiments::parallel_map;
use dtr::trace::replay::{baseline, replay, Kernels};
use dtr::trace::{simrd, Trace};
use dtr::{Config, Interpreter, SimulatorBackend};

fn main() {
    divan::main();
}

const HEURISTICS: [&str; 6] = ["dtr", "dtr-eq", "dtr-local", "msps", "lru", "size"];
const RATIOS: [f64; 9] = [0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1];

/// The authors' logs, by their model's name, parsed once.
fn traces() -> &'static [(String, Trace)] {
    static TRACES: OnceLock<Vec<(String, Trace)>> = OnceLock::new();
    TRACES.get_or_init(|| {
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
            return Vec::new();
        };
        let mut logs: Vec<PathBuf> = entries
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "log"))
            .collect();
        logs.sort();
        logs.iter()
            .map(|path| {
                let file = path.file_name().unwrap().to_string_lossy();
                let name = file.split('-').next().unwrap().to_string();
                let text = std::fs::read_to_string(path).unwrap();
                let trace = simrd::parse(&name, &text).unwrap();
                (name, trace)
            })
            .collect()
    })
}

fn log_names() -> Vec<&'static str> {
    traces().iter().map(|(name, _)| name.as_str()).collect()
}

/// An interpreter set up as the authors' simulator runs `heuristic` at
/// `ratio` of `trace`'s peak.
fn interpreter(trace: &Trace, heuristic: &str, ratio: f64) -> Interpreter<SimulatorBackend> {
    let base = baseline(trace);
    let config = Config::default()
        .with_budget_bytes((ratio * base.peak_bytes as f64).floor() as u64)
        .with_heuristic(heuristic)
        .with_simulator_conventions(true)
        .with_remat_limit(base.compute);
    Interpreter::new(SimulatorBackend::new(), config).expect("known heuristic")
}

fn run(trace: &Trace, mut dtr: Interpreter<SimulatorBackend>) {
    replay(trace, &mut dtr, Kernels::Recorded).expect("the authors' logs replay");
}

/// One log replayed at ratio 0.5 with `dtr` (the interpreter's setup is
/// not timed).
#[divan::bench(args = log_names(), sample_count = 10, sample_size = 1)]
fn at_half_with_dtr(bencher: Bencher, log: &str) {
    let (_, trace) = traces().iter().find(|(name, _)| name == log).unwrap();
    bencher
        .with_inputs(|| interpreter(trace, "dtr", 0.5))
        .bench_local_values(|dtr| run(trace, dtr));
}

/// Every log × heuristic × ratio, spread over all cores.
#[divan::bench(sample_count = 1, sample_size = 1)]
fn whole_grid_on_all_cores(bencher: Bencher) {
    let traces = traces();
    let cells: Vec<(usize, &str, f64)> = (0..traces.len())
        .flat_map(|t| {
            HEURISTICS
                .iter()
                .flat_map(move |&h| RATIOS.iter().map(move |&r| (t, h, r)))
        })
        .collect();
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    bencher.bench(|| {
        parallel_map(&cells, threads, &|_, _| {}, |&(t, h, r)| {
            let trace = &traces[t].1;
            run(trace, interpreter(trace, h, r))
        })
    });
}
