//! `dtr sweep`: reproducible, shardable, mergeable.

use std::path::PathBuf;
use std::process::Command;

use dtr::experiments::{merge, to_csv, Row, Shard, SweepSpec};
use dtr::memory::MemoryModel;
use dtr::policy::Sampling;

fn shipped_trace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("traces/mlp-small.jsonl")
}

fn spec() -> SweepSpec {
    SweepSpec {
        traces: vec![shipped_trace()],
        heuristics: vec!["dtr".into(), "lru".into(), "random".into()],
        memories: vec![MemoryModel::Counter, MemoryModel::arena()],
        samplings: vec![Sampling::All, Sampling::Sqrt],
        seeds: 2,
        ratios: vec![1.0, 0.8, 0.6, 0.4],
        thrash_limit: 2.0,
    }
}

/// The CSV without its last column (wall time, which varies run to run).
fn without_wall_time(rows: &[Row]) -> String {
    to_csv(rows)
        .lines()
        .map(|l| l.rsplit_once(',').map_or(l, |(rest, _)| rest).to_string() + "\n")
        .collect()
}

#[test]
fn the_same_sweep_twice_gives_the_same_csv() {
    let spec = spec();
    let first = spec.run(None, 2, &|_, _| {}).unwrap();
    let second = spec.run(None, 1, &|_, _| {}).unwrap();
    assert_eq!(first.len(), 3 * 2 * 2 * 2 * 4);
    assert!(
        first.iter().enumerate().all(|(i, r)| r.index == i),
        "rows come back in grid order"
    );
    assert!(first.iter().any(|r| r.status == "ok") && first.iter().any(|r| r.status != "ok"));
    assert_eq!(without_wall_time(&first), without_wall_time(&second));
}

#[test]
fn shards_merge_to_the_unsharded_sweep() {
    let spec = spec();
    let whole = spec.run(None, 2, &|_, _| {}).unwrap();
    let dir = std::env::temp_dir().join(format!("dtr-sweep-test-{}", std::process::id()));
    let mut shard_dirs = Vec::new();
    for k in 1..=3 {
        let rows = spec.run(Some(Shard { k, n: 3 }), 2, &|_, _| {}).unwrap();
        assert!(rows.iter().all(|r| r.index % 3 == k - 1));
        let shard_dir = dir.join(format!("shard{k}"));
        dtr::experiments::write_results(&shard_dir, &rows).unwrap();
        shard_dirs.push(shard_dir);
    }
    let merged = merge(&shard_dirs).unwrap();
    assert_eq!(without_wall_time(&merged), without_wall_time(&whole));
    // A shard given twice is an error, not a silently duplicated row.
    shard_dirs.push(shard_dirs[0].clone());
    assert!(merge(&shard_dirs).is_err());
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn bad_shards_are_errors() {
    for bad in ["0/3", "4/3", "1/0", "x/2", "3"] {
        assert!(Shard::parse(bad).is_err(), "{bad}");
    }
    assert_eq!(Shard::parse("2/5").unwrap(), Shard { k: 2, n: 5 });
}

#[test]
fn the_command_line_writes_both_files_and_merges() {
    let dir = std::env::temp_dir().join(format!("dtr-sweep-cli-{}", std::process::id()));
    let dtr = env!("CARGO_BIN_EXE_dtr");
    let trace = shipped_trace();
    for k in 1..=2 {
        let status = Command::new(dtr)
            .args([
                "sweep",
                trace.to_str().unwrap(),
                "--ratios",
                "1,0.7",
                "--heuristics",
                "dtr,size",
                "--jobs",
                "2",
            ])
            .args([
                "--shard",
                &format!("{k}/2"),
                "--out",
                dir.join(format!("s{k}")).to_str().unwrap(),
            ])
            .status()
            .unwrap();
        assert!(status.success());
    }
    let output = Command::new(dtr)
        .args([
            "merge",
            dir.join("s1").to_str().unwrap(),
            dir.join("s2").to_str().unwrap(),
        ])
        .args(["--out", dir.join("all").to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let csv = std::fs::read_to_string(dir.join("all/results.csv")).unwrap();
    assert_eq!(csv.lines().count(), 1 + 2 * 2);
    assert!(String::from_utf8_lossy(&output.stdout).contains("| smallest ratio that completes |"));
    let json: Vec<serde_json::Value> =
        serde_json::from_str(&std::fs::read_to_string(dir.join("all/results.json")).unwrap())
            .unwrap();
    assert_eq!(json.len(), 4);
    std::fs::remove_dir_all(dir).ok();
}

mod workloads {
    use dtr::experiments::generate::{generate, Workload};
    use dtr::experiments::revolve;
    use dtr::trace::replay::{baseline, replay, Kernels, ReplayStatus};
    use dtr::{Config, Interpreter, SimulatorBackend};

    fn run(
        workload: Workload,
        budget_units: Option<u64>,
        heuristic: &str,
    ) -> (dtr::trace::replay::ReplayReport, u64) {
        let trace = generate(workload, "generated").unwrap();
        let base = baseline(&trace);
        let mut config = Config::default().with_heuristic(heuristic);
        config.budget_bytes = budget_units.map(|u| u << 20);
        let mut dtr = Interpreter::new(SimulatorBackend::new(), config).unwrap();
        (
            replay(&trace, &mut dtr, Kernels::Recorded).unwrap(),
            base.peak_bytes,
        )
    }

    #[test]
    fn every_workload_replays_unbounded_and_frees_everything() {
        for workload in [
            Workload::Chain { length: 50 },
            Workload::Resnet {
                length: 50,
                skip: 3,
            },
            Workload::Unet { depth: 5 },
            Workload::Random {
                nodes: 300,
                seed: 7,
            },
        ] {
            let trace = generate(workload, "generated").unwrap();
            let mut dtr = Interpreter::new(SimulatorBackend::new(), Config::default()).unwrap();
            let report = replay(&trace, &mut dtr, Kernels::Recorded).unwrap();
            assert_eq!(report.status, ReplayStatus::Ok, "{workload:?}");
            // A put that history still reads stays resident after its release
            // (it cannot be recomputed), so the peak may exceed the program's
            // own by at most the constants.
            let base = baseline(&trace);
            assert!(report.peak_bytes >= base.peak_bytes, "{workload:?}");
            assert!(
                report.peak_bytes <= base.peak_bytes + base.constant_bytes,
                "{workload:?}"
            );
            assert_eq!(
                (dtr.tracked_tensors(), dtr.memory().in_use_bytes),
                (0, 0),
                "{workload:?}: all released"
            );
        }
    }

    /// A chain's unbounded peak grows with its length; under a budget of
    /// about 2√N activations DTR completes with bounded overhead, and never
    /// does less recomputation than Revolve's optimum for that many slots
    /// (which would mean our accounting is wrong).
    #[test]
    fn dtr_on_a_chain_against_the_revolve_optimum() {
        for length in [64u64, 256] {
            let units = 2 * (length as f64).sqrt().ceil() as u64 + 3;
            let (report, peak) = run(
                Workload::Chain {
                    length: length as usize,
                },
                Some(units),
                "dtr",
            );
            assert!(
                peak >= (length << 20),
                "the unbounded run keeps every activation"
            );
            assert_eq!(report.status, ReplayStatus::Ok, "length {length}");
            // One recomputed layer = one extra forward step.
            let optimum = revolve::extra_steps(length, units).unwrap();
            assert!(
                report.stats.rematerializations >= optimum,
                "DTR beat the optimum: {report:?}"
            );
            assert!(
                report.stats.overhead() < 3.0,
                "length {length}: overhead {}",
                report.stats.overhead()
            );
        }
    }
}

#[test]
fn sweeps_draw_one_chart_per_trace_and_a_comparison() {
    let spec = SweepSpec {
        seeds: 1,
        samplings: vec![Sampling::All],
        ..spec()
    };
    let rows = spec.run(None, 2, &|_, _| {}).unwrap();
    let dir = std::env::temp_dir().join(format!("dtr-plot-test-{}", std::process::id()));
    let written = dtr::experiments::plot::plot_all(&rows, &dir).unwrap();
    assert_eq!(written.len(), 2, "one trace: its chart and the comparison");
    for path in &written {
        let svg = std::fs::read_to_string(path).unwrap();
        assert!(svg.starts_with("<svg"), "{}", path.display());
        for heuristic in &spec.heuristics {
            assert!(
                svg.contains(heuristic.as_str()),
                "{} lacks a legend entry for {heuristic}",
                path.display()
            );
        }
    }
    std::fs::remove_dir_all(dir).ok();
}

/// A timeline has one sample per trace event; its evictions and
/// rematerialisations add up to the run's; memory never passes the budget
/// at an event's end; arena mode reports fragmentation; the chart draws.
#[test]
fn a_replay_timeline_accounts_for_every_event() {
    use dtr::experiments::generate::{generate, Workload};
    use dtr::experiments::timeline::Timeline;
    use dtr::trace::replay::{replay_observed, Kernels, ReplayStatus};
    use dtr::{Config, Interpreter, SimulatorBackend};

    let trace = generate(
        Workload::Resnet {
            length: 60,
            skip: 3,
        },
        "resnet",
    )
    .unwrap();
    let budget = 20u64 << 20;
    for memory in [MemoryModel::Counter, MemoryModel::arena()] {
        let arena = memory != MemoryModel::Counter;
        let config = Config::default()
            .with_budget_bytes(budget)
            .with_memory(memory);
        let mut dtr = Interpreter::new(SimulatorBackend::new(), config).unwrap();
        let mut timeline = Timeline::new();
        let report = replay_observed(&trace, &mut dtr, Kernels::Recorded, |clock, dtr| {
            timeline.observe(clock, dtr);
            Ok(())
        })
        .unwrap();
        assert_eq!(report.status, ReplayStatus::Ok);
        assert!(report.stats.evictions > 0 && report.stats.rematerializations > 0);
        assert_eq!(timeline.samples.len(), trace.events.len());
        assert_eq!(timeline.budget_bytes, Some(budget));
        let sum = |count: fn(&dtr::experiments::timeline::Sample) -> u64| {
            timeline.samples.iter().map(count).sum::<u64>()
        };
        assert_eq!(sum(|s| s.evictions), report.stats.evictions);
        assert_eq!(
            sum(|s| s.rematerializations),
            report.stats.rematerializations
        );
        assert!(timeline.samples.iter().all(|s| s.in_use_bytes <= budget));
        assert_eq!(
            timeline.samples.iter().map(|s| s.in_use_bytes).max(),
            Some(report.peak_bytes),
            "this trace peaks at an event's end"
        );
        assert_eq!(
            timeline.samples.iter().all(|s| s.fragmentation.is_some()),
            arena
        );
        let coarse = timeline.downsampled(10);
        assert!(coarse.len() <= 10);
        assert_eq!(
            coarse.iter().map(|s| s.evictions).sum::<u64>(),
            report.stats.evictions
        );
        let path = std::env::temp_dir().join(format!(
            "dtr-timeline-test-{}-{arena}.svg",
            std::process::id()
        ));
        dtr::experiments::plot::timeline_chart(&timeline, "resnet", &path).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        for label in ["budget", "evictions", "rematerialisations"] {
            assert!(svg.contains(label), "the chart lacks {label}");
        }
        assert_eq!(svg.contains("fragmentation"), arena);
        std::fs::remove_file(path).ok();
        assert!(timeline.to_csv().lines().count() == trace.events.len() + 1);
    }
}
