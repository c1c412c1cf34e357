//! Agreement with the DTR authors' simulator on their 8 logs.
//!
//! Needs `../shared/traces/dtr-prototype` beside the project (or the path in
//! `DTR_PROTOTYPE_TRACES`); without it each test says it skipped and passes,
//! except under CI (`CI=true`), where it fails.
//! For every heuristic and ratio of each `reference/*.txt` (counter memory,
//! full scan): the same baseline, the same status, and overhead within 1%
//! (relative) on the cells that completed.

mod common;

use std::path::Path;

use dtr::trace::replay::{baseline, replay, Kernels, ReplayStatus};
use dtr::trace::{simrd, Trace};
use dtr::{Config, Interpreter, SimulatorBackend};

/// The authors' heuristic names and ours.
fn heuristic(reference_name: &str) -> &'static str {
    match reference_name {
        "DTR" => "dtr",
        "DTREqClass" => "dtr-eq",
        "DTRLocal" => "dtr-local",
        "MSPS" => "msps",
        "LRU" => "lru",
        "LargestStorage" => "size",
        other => panic!("reference names an unknown heuristic `{other}`"),
    }
}

fn status(reference: &str) -> ReplayStatus {
    match reference {
        "ok" => ReplayStatus::Ok,
        "OOM" => ReplayStatus::OutOfMemory,
        "thrash" => ReplayStatus::Thrash,
        other => panic!("reference has an unknown status `{other}`"),
    }
}

fn check_log(prefix: &str) {
    let Some(dir) = common::prototype_traces() else {
        return;
    };
    let log = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| {
            p.file_name().unwrap().to_string_lossy().starts_with(prefix)
                && p.extension().is_some_and(|e| e == "log")
        })
        .unwrap_or_else(|| panic!("no log starting with {prefix} in {}", dir.display()));
    let stem = log.file_stem().unwrap().to_string_lossy().to_string();
    let reference =
        std::fs::read_to_string(dir.join("reference").join(format!("{stem}.txt"))).unwrap();
    let trace: Trace = simrd::parse(&stem, &std::fs::read_to_string(&log).unwrap()).unwrap();
    let base = baseline(&trace);

    let mut lines = reference.lines();
    let header: serde_json::Value = serde_json::from_str(lines.next().unwrap()).unwrap();
    assert_eq!(
        header["baseline_memory"].as_u64(),
        Some(base.peak_bytes),
        "{stem}: baseline peak"
    );
    assert_eq!(
        header["baseline_compute"].as_u64(),
        Some(base.compute),
        "{stem}: baseline compute"
    );
    assert_eq!(
        header["const_mem"].as_u64(),
        Some(base.constant_bytes),
        "{stem}: constant bytes"
    );

    let mut mismatches = Vec::new();
    let mut cells = 0;
    for line in lines.filter(|l| !l.trim().is_empty()) {
        let mut fields = line.split_whitespace();
        let name = heuristic(fields.next().unwrap());
        for cell in fields {
            let parts: Vec<&str> = cell.split(':').collect();
            let (ratio, expected_status, expected_overhead): (f64, _, f64) = (
                parts[0].parse().unwrap(),
                status(parts[1]),
                parts[2].parse().unwrap(),
            );
            let budget = (ratio * base.peak_bytes as f64).floor() as u64;
            let config = Config::default()
                .with_budget_bytes(budget)
                .with_heuristic(name)
                .with_simulator_conventions(true)
                .with_remat_limit(base.compute);
            let mut dtr = Interpreter::new(SimulatorBackend::new(), config).unwrap();
            let report = replay(&trace, &mut dtr, Kernels::Recorded).unwrap();
            let overhead = report.stats.compute as f64 / base.compute as f64;
            cells += 1;
            let agrees = report.status == expected_status
                && (expected_status != ReplayStatus::Ok
                    || (overhead - expected_overhead).abs() <= 0.01 * expected_overhead);
            if !agrees {
                mismatches.push(format!(
                    "{name} at {ratio}: ours {}:{overhead:.3}, reference {}:{expected_overhead:.3}",
                    report.status.as_str(),
                    parts[1]
                ));
            }
        }
    }
    assert!(cells > 0, "{stem}: the reference has no cells");
    assert!(
        mismatches.is_empty(),
        "{stem}: {} of {cells} cells differ:\n{}",
        mismatches.len(),
        mismatches.join("\n")
    );
}

macro_rules! agreement_tests {
    ($($name:ident => $prefix:literal),* $(,)?) => {
        $(#[test] fn $name() { check_log($prefix); })*
    };
}

agreement_tests! {
    densenet121 => "tv_densenet121",
    inceptionv4 => "inceptionv4",
    lstm => "lstm",
    resnet32 => "resnet32",
    transformer => "transformer",
    treelstm => "treelstm",
    unet => "unet",
    unroll_gan => "unroll_gan",
}

/// The sweep of the issue that reshaped the run path, pinned: every cell of
/// `dtr sweep LOGS --heuristics dtr,dtr-eq,dtr-local,msps,lru,size --ratios
/// 1,0.9,…,0.2 --memory counter` as it was before (wall times aside).
#[test]
fn the_counter_sweep_over_the_authors_logs_is_unchanged() {
    let Some(traces) = common::prototype_logs() else {
        return;
    };
    let spec = dtr::experiments::SweepSpec {
        traces,
        heuristics: ["dtr", "dtr-eq", "dtr-local", "msps", "lru", "size"]
            .map(String::from)
            .to_vec(),
        memories: vec![dtr::memory::MemoryModel::Counter.into()],
        samplings: vec![dtr::policy::Sampling::All],
        restores: vec![dtr::RestoreMode::Drop],
        swap: dtr::SwapConfig::default(),
        move_bandwidth: dtr::config::MOVE_BANDWIDTH,
        seeds: 1,
        ratios: vec![1.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2],
        thrash_limit: 2.0,
        keep_needed_history: None,
        remat_memory_guard: None,
        pin_resident_first: None,
    };
    let jobs = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut rows = spec.run(None, jobs, &|_, _| {}).unwrap();
    for row in &mut rows {
        let name = Path::new(&row.trace).file_name().unwrap();
        row.trace = name.to_string_lossy().into_owned();
    }
    let csv = dtr::experiments::to_csv(&rows);
    let without_wall_time: String = csv
        .lines()
        .map(|line| &line[..line.rfind(',').unwrap()])
        .flat_map(|line| [line, "\n"])
        .collect();
    let pinned = include_str!("data/sweep-dtr-prototype-counter.csv");
    for (now, before) in without_wall_time.lines().zip(pinned.lines()) {
        assert_eq!(now, before);
    }
    assert_eq!(without_wall_time.lines().count(), pinned.lines().count());
}
