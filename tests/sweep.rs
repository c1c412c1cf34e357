//! `dtr sweep`: reproducible, shardable, mergeable.

use std::path::PathBuf;
use std::process::Command;

use dtr::experiments::{merge, to_csv, Row, Shard, SweepSpec};
use dtr::memory::MemoryModel;
use dtr::policy::Sampling;
use dtr::trace::replay::ReplayStatus;
use dtr::{RestoreMode, SwapConfig};

fn shipped_trace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("traces/mlp-small.jsonl")
}

fn spec() -> SweepSpec {
    SweepSpec {
        traces: vec![shipped_trace()],
        heuristics: vec!["dtr".into(), "lru".into(), "random".into()],
        memories: vec![MemoryModel::Counter.into(), MemoryModel::arena().into()],
        samplings: vec![Sampling::All, Sampling::Sqrt],
        restores: vec![RestoreMode::Drop, RestoreMode::Swap],
        swap: SwapConfig::default(),
        move_bandwidth: dtr::config::MOVE_BANDWIDTH,
        seeds: 2,
        ratios: vec![1.0, 0.8, 0.6, 0.4],
        thrash_limit: 2.0,
        keep_needed_history: None,
        remat_memory_guard: None,
        pin_resident_first: None,
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
    assert_eq!(first.len(), 3 * 2 * 2 * 2 * 2 * 4);
    // Both restore modes ran, and evicted.
    for restore in [RestoreMode::Drop, RestoreMode::Swap] {
        assert!(first
            .iter()
            .any(|r| r.restore == restore && r.evictions > 0));
    }
    assert!(
        first.iter().enumerate().all(|(i, r)| r.index == i),
        "rows come back in grid order"
    );
    assert!(
        first.iter().any(|r| r.status == ReplayStatus::Ok)
            && first.iter().any(|r| r.status != ReplayStatus::Ok)
    );
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

/// A plan cell makes the cell's run into a static plan and follows it:
/// where a plan fits, it completes with the followed run's overhead, never
/// over the budget; `plan` reads and writes as the other memory models do.
#[test]
fn plan_cells_follow_a_plan_made_at_their_budget() {
    use dtr::experiments::plan::Plan;
    use dtr::experiments::{Placement, RunSpec, Workload};
    let plan_cells: Placement = "plan".parse().unwrap();
    assert_eq!(plan_cells, Placement::Plan { alignment: 256 });
    assert_eq!(
        "plan:16".parse::<Placement>().unwrap().to_string(),
        "plan:16"
    );
    assert_eq!(
        "arena-compact".parse::<Placement>().unwrap(),
        Placement::Dynamic(MemoryModel::CompactingArena { alignment: 256 })
    );
    assert!("plan:3"
        .parse::<Placement>()
        .unwrap_err()
        .contains("power of two"));
    assert!("pla".parse::<Placement>().unwrap_err().contains("plan"));

    let sweep = SweepSpec {
        heuristics: vec!["dtr".into(), "static-sqrt".into()],
        memories: vec![MemoryModel::Counter.into(), plan_cells],
        samplings: vec![Sampling::All],
        restores: vec![RestoreMode::Drop],
        seeds: 1,
        ratios: vec![0.8, 0.6, 0.05],
        ..spec()
    };
    let rows = sweep.run(None, 2, &|_, _| {}).unwrap();
    let workload = Workload::load(&shipped_trace(), None).unwrap();
    let planned: Vec<&Row> = (rows.iter())
        .filter(|r| r.memory == plan_cells && r.heuristic == "dtr")
        .collect();
    assert_eq!(planned.len(), 3);
    for row in &planned {
        let spec = RunSpec {
            policy: "dtr".into(),
            budget: dtr::Budget::Ratio(row.ratio),
            ..RunSpec::default()
        };
        match Plan::make(&workload, &spec, 256) {
            Ok(plan) if plan.fits() => {
                assert_eq!(row.status, ReplayStatus::Ok, "at {}", row.ratio);
                assert_eq!(row.overhead, Some(plan.follow(&workload).unwrap().overhead));
                assert!(row.peak_bytes <= row.budget_bytes);
            }
            _ => assert_ne!(row.status, ReplayStatus::Ok, "at {}", row.ratio),
        }
    }
    assert!(planned.iter().any(|r| r.status == ReplayStatus::Ok));
    assert!(planned.iter().any(|r| r.status != ReplayStatus::Ok));
    // Results files keep the cell's placement.
    let json = serde_json::to_string(&planned[0]).unwrap();
    assert!(json.contains("\"memory\":\"plan\""), "{json}");
    assert_eq!(&serde_json::from_str::<Row>(&json).unwrap(), planned[0]);

    // Plans record runs that drop: not with swapping.
    let swapping = SweepSpec {
        restores: vec![RestoreMode::Drop, RestoreMode::Hybrid],
        ..sweep
    };
    let error = swapping.run(None, 1, &|_, _| {}).unwrap_err().to_string();
    assert!(error.contains("restore by `drop`"), "{error}");
}

#[test]
fn bad_shards_are_errors() {
    for bad in ["0/3", "4/3", "1/0", "x/2", "3"] {
        assert!(Shard::parse(bad).is_err(), "{bad}");
    }
    assert_eq!(Shard::parse("2/5").unwrap(), Shard { k: 2, n: 5 });
}

#[test]
#[cfg(feature = "cli")]
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
        let budget = budget_units.map_or(dtr::Budget::Unbounded, |u| dtr::Budget::Bytes(u << 20));
        let config = Config::default()
            .with_heuristic(heuristic)
            .with_budget(budget);
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
#[cfg(feature = "plot")]
fn sweeps_draw_one_chart_per_trace_and_a_comparison() {
    let spec = SweepSpec {
        seeds: 1,
        samplings: vec![Sampling::All],
        ..spec()
    };
    let rows = spec.run(None, 2, &|_, _| {}).unwrap();
    let dir = std::env::temp_dir().join(format!("dtr-plot-test-{}", std::process::id()));
    let written = dtr::experiments::plot::plot_all(&rows, &dir).unwrap();
    assert_eq!(
        written.len(),
        4,
        "one trace: its chart and the comparison, each as SVG and PNG"
    );
    for pair in written.chunks(2) {
        let (path, png) = (&pair[0], &pair[1]);
        assert_eq!(
            png,
            &path.with_extension("png"),
            "the PNG sits beside its SVG"
        );
        let bytes = std::fs::read(png).unwrap();
        assert!(bytes.starts_with(b"\x89PNG\r\n\x1a\n") && bytes.len() > 1000);
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
        let report = replay_observed(&trace, &mut dtr, Kernels::Recorded, |clock, dtr, _| {
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
        #[cfg(feature = "plot")]
        {
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
        }
        assert!(timeline.to_csv().lines().count() == trace.events.len() + 1);
    }
}

mod baselines {
    use dtr::experiments::chains;
    use dtr::experiments::checkpoint::CheckpointPlan;
    use dtr::experiments::generate::{generate, Workload, UNIT};
    use dtr::experiments::STATIC_CHECKPOINTING;
    use dtr::trace::replay::{replay, Kernels, ReplayStatus};
    use dtr::{Config, CpuBackend, Interpreter, SimulatorBackend};

    /// On a uniform chain, Chen et al.'s plan keeps about √N checkpoints,
    /// needs about 2√N activations and recomputes one forward pass.
    #[test]
    fn static_checkpointing_on_a_chain_keeps_sqrt_n_and_recomputes_once() {
        for length in [100usize, 400, 2500] {
            let trace = generate(Workload::Chain { length }, "chain").unwrap();
            let plan = CheckpointPlan::new(&trace).unwrap();
            let root = (length as f64).sqrt();
            assert!(
                (plan.checkpoints as f64) > root / 2.0 && (plan.checkpoints as f64) < root * 2.0,
                "{length}: {} checkpoints",
                plan.checkpoints
            );
            let mut dtr =
                Interpreter::new(SimulatorBackend::new(), Config::default().with_events(true))
                    .unwrap();
            let report = plan.run(&trace, &mut dtr, Kernels::Recorded).unwrap();
            assert_eq!(report.status, ReplayStatus::Ok);
            let peak_units = report.peak_bytes / UNIT;
            assert!(
                peak_units as f64 <= 2.0 * root + 6.0,
                "{length}: peak {peak_units} activations"
            );
            // N forward + 1 + N backward, plus one recomputed forward at most.
            let overhead = report.stats.overhead();
            assert!(overhead > 1.3 && overhead <= 1.5, "{length}: {overhead}");
            assert_eq!(dtr.memory().in_use_bytes, 0, "everything released");
        }
    }

    /// On real kernels the plan's recomputation reproduces every value.
    #[test]
    fn static_checkpointing_reproduces_the_values_on_the_cpu() {
        let path = super::shipped_trace();
        let (trace, _) = dtr::trace::load(&path, None).unwrap();
        let mut unbounded = Interpreter::new(CpuBackend::new(), Config::default()).unwrap();
        let expected = replay(&trace, &mut unbounded, Kernels::Execute).unwrap();
        let plan = CheckpointPlan::new(&trace).unwrap();
        assert!(plan.saved > plan.checkpoints && plan.checkpoints > 0);
        let mut dtr =
            Interpreter::new(CpuBackend::new(), Config::default().with_events(true)).unwrap();
        let report = plan.run(&trace, &mut dtr, Kernels::Execute).unwrap();
        assert_eq!(report.status, ReplayStatus::Ok);
        assert!(report.stats.rematerializations > 0);
        assert!(!expected.reads.is_empty());
        assert_eq!(report.reads, expected.reads, "bitwise equal reads");
    }

    #[test]
    fn static_checkpointing_needs_recorded_events() {
        let trace = generate(Workload::Chain { length: 10 }, "chain").unwrap();
        let plan = CheckpointPlan::new(&trace).unwrap();
        let mut dtr = Interpreter::new(SimulatorBackend::new(), Config::default()).unwrap();
        assert!(plan.run(&trace, &mut dtr, Kernels::Recorded).is_err());
    }

    /// A sweep runs static checkpointing once per trace and memory model.
    #[test]
    fn a_sweep_runs_static_checkpointing_once_per_trace() {
        // One training step (the plan covers the step holding the peak).
        let path = std::env::temp_dir().join(format!("dtr-resnet-{}.jsonl", std::process::id()));
        let trace = generate(
            Workload::Resnet {
                length: 40,
                skip: 2,
            },
            "resnet",
        )
        .unwrap();
        std::fs::write(&path, dtr::trace::native::to_string(&trace)).unwrap();
        let spec = dtr::experiments::SweepSpec {
            traces: vec![path.clone()],
            heuristics: vec!["dtr".into(), STATIC_CHECKPOINTING.into()],
            ..super::spec()
        };
        let rows = spec.run(None, 2, &|_, _| {}).unwrap();
        let fixed: Vec<_> = rows
            .iter()
            .filter(|r| r.heuristic == STATIC_CHECKPOINTING)
            .collect();
        assert_eq!(fixed.len(), spec.memories.len());
        assert!(fixed.iter().all(|r| r.status == ReplayStatus::Ok
            && r.ratio < 1.0
            && r.budget_bytes == r.peak_bytes));
        assert!(rows.iter().enumerate().all(|(i, r)| r.index == i));
        std::fs::remove_file(path).ok();
    }

    /// Theorem 3.1: under ⌈2√N⌉ activations DTR's overhead stays bounded
    /// as N grows, and never beats the Revolve optimum for that memory.
    #[test]
    fn chains_under_two_sqrt_n_stay_within_a_constant_of_revolve() {
        let lengths = [100, 1000, 10_000];
        let rows = chains::run(&lengths, &["dtr-eq".into()], 2, &|_, _| {}).unwrap();
        assert_eq!(rows.len(), lengths.len() * 3);
        for &length in &lengths {
            let get = |policy: &str| {
                rows.iter()
                    .find(|r| r.length == length && r.policy == policy)
                    .unwrap()
            };
            let (dtr, optimum) = (get("dtr-eq"), get(chains::REVOLVE));
            assert_eq!(dtr.status, ReplayStatus::Ok);
            assert!(dtr.peak_units <= dtr.budget_units as f64);
            assert!(
                dtr.overhead >= optimum.overhead,
                "{length}: beat the optimum"
            );
            assert!(dtr.overhead < 1.7, "{length}: {}", dtr.overhead);
        }
        #[cfg(feature = "plot")]
        {
            let path = std::env::temp_dir().join(format!("dtr-chains-{}.svg", std::process::id()));
            dtr::experiments::plot::chains_chart(&rows, &path).unwrap();
            let svg = std::fs::read_to_string(&path).unwrap();
            assert!(svg.contains("revolve") && svg.contains("dtr-eq"));
            std::fs::remove_file(path).ok();
        }
    }
}
