#![cfg(feature = "cli")]
//! The `dtr` command line's stable interface.

use std::process::Command;

/// Whether `path` holds a PNG: its signature and an image header with a
/// nonzero size.
fn assert_png(path: &std::path::Path) {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert!(
        bytes.starts_with(b"\x89PNG\r\n\x1a\n") && &bytes[12..16] == b"IHDR",
        "{} is not a PNG",
        path.display()
    );
    let width = u32::from_be_bytes(bytes[16..20].try_into().unwrap());
    let height = u32::from_be_bytes(bytes[20..24].try_into().unwrap());
    assert!(
        width > 0 && height > 0 && bytes.len() > 1000,
        "{}",
        path.display()
    );
}

fn dtr(args: &[&str]) -> (bool, String, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_dtr"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into(),
        String::from_utf8_lossy(&output.stderr).into(),
    )
}

#[test]
fn replay_json_has_the_documented_fields() {
    let (ok, stdout, stderr) = dtr(&[
        "replay",
        "traces/mlp-small.jsonl",
        "--ratio",
        "0.6",
        "--heuristic",
        "dtr-eq",
        "--json",
    ]);
    assert!(ok, "{stderr}");
    let report: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    for field in [
        "status",
        "heuristic",
        "budget_bytes",
        "baseline_peak_bytes",
        "baseline_compute",
        "compute",
        "overhead",
        "remat_compute",
        "peak_bytes",
        "evictions",
        "rematerializations",
        "wall_seconds",
    ] {
        assert!(report.get(field).is_some(), "missing `{field}` in {stdout}");
    }
    assert_eq!(report["status"], "ok");
    assert_eq!(report["heuristic"], "dtr-eq");
    let budget = report["budget_bytes"].as_u64().unwrap();
    assert_eq!(
        budget,
        (0.6 * report["baseline_peak_bytes"].as_u64().unwrap() as f64) as u64
    );
    assert!(report["peak_bytes"].as_u64().unwrap() <= budget);
}

#[test]
fn budgets_take_byte_suffixes_and_bad_input_is_an_error() {
    let (ok, stdout, _) = dtr(&[
        "replay",
        "traces/mlp-small.jsonl",
        "--budget",
        "200KiB",
        "--json",
    ]);
    assert!(ok);
    assert!(stdout.contains("\"budget_bytes\":204800"), "{stdout}");
    let (ok, _, stderr) = dtr(&["replay", "traces/mlp-small.jsonl", "--budget", "12 parsecs"]);
    assert!(!ok && stderr.contains("the units are B, KB"), "{stderr}");
    let (ok, _, stderr) = dtr(&["replay", "no/such/trace.jsonl", "--ratio", "0.5"]);
    assert!(
        !ok && stderr.contains("no/such/trace.jsonl: cannot read"),
        "{stderr}"
    );
    let (ok, _, stderr) = dtr(&[
        "replay",
        "traces/mlp-small.jsonl",
        "--ratio",
        "0.5",
        "--heuristic",
        "nope",
    ]);
    assert!(
        !ok && stderr.contains("unknown heuristic `nope`"),
        "{stderr}"
    );
}

#[test]
fn arena_memory_and_sampling_are_reported() {
    let args = [
        "replay",
        "traces/mlp-small.jsonl",
        "--ratio",
        "0.7",
        "--memory",
        "arena",
        "--sampling",
        "sqrt",
        "--seed",
        "3",
        "--json",
    ];
    let (ok, stdout, stderr) = dtr(&args);
    assert!(ok, "{stderr}");
    let report: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(
        (report["memory"].as_str(), report["sampling"].as_str()),
        (Some("arena"), Some("sqrt"))
    );
    let fragmentation = report["fragmentation"].as_f64().unwrap();
    assert!((0.0..=1.0).contains(&fragmentation));
    assert!(report["largest_free_bytes"].as_u64().is_some());
    // Same seed, same decisions.
    let (_, again, _) = dtr(&args);
    let again: serde_json::Value = serde_json::from_str(again.trim()).unwrap();
    assert_eq!(report["compute"], again["compute"]);
    assert_eq!(report["evictions"], again["evictions"]);
}

#[test]
fn info_reports_the_baseline() {
    let (ok, stdout, stderr) = dtr(&["info", "traces/mlp-small.jsonl", "--json"]);
    assert!(ok, "{stderr}");
    let info: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(info["format"], "dtr");
    assert!(
        info["baseline_peak_bytes"].as_u64().unwrap()
            >= info["lower_bound_bytes"].as_u64().unwrap()
    );
    assert!(info["ops"].as_u64().unwrap() > 0);
}

#[test]
fn replay_draws_a_timeline_or_writes_its_samples() {
    let dir = std::env::temp_dir().join(format!("dtr-cli-timeline-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let svg = dir.join("t.svg");
    let csv = dir.join("t.csv");
    for (path, memory) in [(&svg, "arena"), (&csv, "counter")] {
        let (ok, _, stderr) = dtr(&[
            "replay",
            "traces/mlp-small.jsonl",
            "--ratio",
            "0.6",
            "--memory",
            memory,
            "--timeline",
            path.to_str().unwrap(),
        ]);
        assert!(ok, "{stderr}");
    }
    let drawn = std::fs::read_to_string(&svg).unwrap();
    assert!(drawn.starts_with("<svg") && drawn.contains("fragmentation"));
    assert_png(&dir.join("t.png"));
    let samples = std::fs::read_to_string(&csv).unwrap();
    assert!(samples.starts_with("clock,in_use_bytes,evictions,rematerializations,fragmentation"));
    let evictions: u64 = samples
        .lines()
        .skip(1)
        .map(|l| l.split(',').nth(2).unwrap().parse::<u64>().unwrap())
        .sum();
    assert!(evictions > 0, "a 0.6 budget evicts");
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn chains_writes_its_table_and_chart() {
    let dir = std::env::temp_dir().join(format!("dtr-cli-chains-{}", std::process::id()));
    let (ok, stdout, stderr) = dtr(&[
        "chains",
        "--lengths",
        "100,400",
        "--out",
        dir.to_str().unwrap(),
    ]);
    assert!(ok, "{stderr}");
    for policy in ["dtr-eq", "revolve", "static-sqrt"] {
        assert!(
            stdout.contains(&format!("| 400 | 40 | {policy} | ok |")),
            "{stdout}"
        );
    }
    assert!(std::fs::read_to_string(dir.join("chains.svg"))
        .unwrap()
        .starts_with("<svg"));
    assert_png(&dir.join("chains.png"));
    assert_eq!(
        std::fs::read_to_string(dir.join("chains.csv"))
            .unwrap()
            .lines()
            .count(),
        1 + 2 * 3
    );
    let (ok, _, stderr) = dtr(&["chains", "--lengths", "0", "--out", dir.to_str().unwrap()]);
    assert!(!ok && stderr.contains("--lengths"));
    std::fs::remove_dir_all(dir).ok();
}

/// No output destroys data: a timeline never overwrites the input trace or
/// guesses a format, and the replay's result is printed even when the
/// timeline cannot be written.
#[test]
fn replay_timelines_are_checked_before_running_and_never_lose_the_result() {
    let dir = std::env::temp_dir().join(format!("dtr-cli-safe-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let trace = dir.join("t.jsonl");
    std::fs::copy("traces/mlp-small.jsonl", &trace).unwrap();
    let original = std::fs::read(&trace).unwrap();
    let replay = |timeline: &str| {
        dtr(&[
            "replay",
            trace.to_str().unwrap(),
            "--ratio",
            "0.6",
            "--timeline",
            timeline,
        ])
    };
    let (ok, stdout, stderr) = replay(trace.to_str().unwrap());
    assert!(
        !ok && stderr.contains("names the input") && stdout.is_empty(),
        "{stderr}"
    );
    // Another name for the same file is the same file.
    let link = dir.join("link.svg");
    std::fs::hard_link(&trace, &link).unwrap();
    let (ok, stdout, stderr) = replay(link.to_str().unwrap());
    assert!(
        !ok && stderr.contains("names the input") && stdout.is_empty(),
        "{stderr}"
    );
    let dotted = format!(
        "{}/../{}/t.jsonl",
        dir.display(),
        dir.file_name().unwrap().to_str().unwrap()
    );
    let (ok, _, stderr) = replay(&dotted);
    assert!(!ok && stderr.contains("names the input"), "{stderr}");
    let (ok, stdout, stderr) = replay(dir.join("t.png").to_str().unwrap());
    assert!(
        !ok && stderr.contains(".svg") && stdout.is_empty(),
        "{stderr}"
    );
    // The PNG drawn beside an SVG is an output too: a trace of that name
    // is refused before the replay, not overwritten after it.
    let png_trace = dir.join("p.png");
    std::fs::copy("traces/mlp-small.jsonl", &png_trace).unwrap();
    let (ok, stdout, stderr) = dtr(&[
        "replay",
        png_trace.to_str().unwrap(),
        "--ratio",
        "0.6",
        "--timeline",
        dir.join("p.svg").to_str().unwrap(),
    ]);
    assert!(
        !ok && stderr.contains("names the input") && stdout.is_empty(),
        "{stderr}"
    );
    assert_eq!(std::fs::read(&png_trace).unwrap(), original);
    assert!(!dir.join("p.svg").exists());
    assert_eq!(
        std::fs::read(&trace).unwrap(),
        original,
        "the trace is intact"
    );
    // A directory that is not there is found before the replay too.
    let unwritable = dir.join("missing").join("t.svg");
    let (ok, stdout, stderr) = replay(unwritable.to_str().unwrap());
    assert!(
        !ok && stderr.contains("missing") && stderr.contains("does not exist"),
        "{stderr}"
    );
    assert!(stdout.is_empty(), "nothing ran: {stdout}");
    std::fs::remove_dir_all(dir).ok();
}

/// A sweep whose `--out` cannot be a directory fails before running; `plot`
/// reads the results file it is given.
#[test]
fn sweep_checks_out_first_and_plot_reads_the_file_named() {
    let dir = std::env::temp_dir().join(format!("dtr-cli-sweep-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("a-file");
    std::fs::write(&file, "keep me").unwrap();
    let (ok, _, stderr) = dtr(&[
        "sweep",
        "traces/mlp-small.jsonl",
        "--ratios",
        "1,0.5",
        "--out",
        file.to_str().unwrap(),
    ]);
    assert!(!ok && stderr.contains("not a directory"), "{stderr}");
    assert!(!stderr.contains("sweep:"), "no run started: {stderr}");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "keep me");

    let out = dir.join("sweep");
    let (ok, _, stderr) = dtr(&[
        "sweep",
        "traces/mlp-small.jsonl",
        "--ratios",
        "1,0.5",
        "--heuristics",
        "dtr-eq",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(ok, "{stderr}");
    let renamed = dir.join("renamed.json");
    std::fs::copy(out.join("results.json"), &renamed).unwrap();
    std::fs::write(out.join("results.json"), "not json").unwrap();
    let plots = dir.join("plots");
    let (ok, stdout, stderr) = dtr(&[
        "plot",
        renamed.to_str().unwrap(),
        "--out",
        plots.to_str().unwrap(),
    ]);
    assert!(ok, "plot read {}: {stderr}", renamed.display());
    assert!(stdout.contains(".svg"), "{stdout}");
    for name in ["overhead-mlp", "policies"] {
        assert!(plots.join(format!("{name}.svg")).exists(), "{stdout}");
        assert_png(&plots.join(format!("{name}.png")));
        assert!(stdout.contains(&format!("{name}.png")), "{stdout}");
    }
    // A sweep would draw policies.png into --out: a trace there of that
    // name is refused before any run.
    sweep_refuses_to_overwrite(&out.join("policies.png"), &out);
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn replay_runs_static_checkpointing_and_checks_its_options_first() {
    let (ok, stdout, stderr) = dtr(&[
        "replay",
        "traces/resnet-small.jsonl",
        "--heuristic",
        "static-sqrt",
        "--json",
    ]);
    assert!(ok, "{stderr}");
    let report: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(report["status"], "ok");
    assert!(
        report["budget_bytes"].is_null(),
        "a static plan has no budget"
    );
    let (peak, baseline) = (
        report["peak_bytes"].as_u64().unwrap(),
        report["baseline_peak_bytes"].as_u64().unwrap(),
    );
    // Its ratio is the peak it reached (on this small trace, above the
    // unbounded run's: the recomputed segments add their own activations).
    assert!(peak > 0 && baseline > 0);

    for (args, expected) in [
        (vec!["--heuristic", "dtr"], "give --ratio or --budget"),
        (
            vec!["--ratio", "0.5", "--thrash-limit", "0.5"],
            "must be at least 1",
        ),
        (vec!["--ratio=-1"], "must be positive"),
        (vec!["--ratio", "0.5", "--heuristic", "nope"], "nope"),
        (
            vec!["--heuristic", "static-sqrt", "--timeline", "/tmp/never.svg"],
            "static plan",
        ),
    ] {
        let mut all = vec!["replay", "traces/resnet-small.jsonl"];
        all.extend(args);
        let (ok, _, stderr) = dtr(&all);
        assert!(!ok && stderr.contains(expected), "{all:?}: {stderr}");
    }
}

#[test]
fn a_sweep_with_a_bad_option_fails_before_making_its_output() {
    let out = std::env::temp_dir().join(format!("dtr-sweep-bad-{}", std::process::id()));
    let (ok, _, stderr) = dtr(&[
        "sweep",
        "traces/mlp-small.jsonl",
        "--thrash-limit",
        "NaN",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(!ok && stderr.contains("--thrash-limit"), "{stderr}");
    assert!(
        !out.exists(),
        "nothing is written for a sweep that cannot run"
    );
}

#[test]
fn fit_finds_the_smallest_ratio_that_completes() {
    let (ok, stdout, stderr) = dtr(&[
        "fit",
        "traces/resnet-small.jsonl",
        "--heuristics",
        "dtr-eq,msps",
        "--memory",
        "counter,arena",
        "--precision",
        "0.02",
        "--json",
    ]);
    assert!(ok, "{stderr}");
    let fits: Vec<serde_json::Value> = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(fits.len(), 4);
    for fit in &fits {
        let ratio = fit["ratio"].as_f64().expect("the unbounded run completes");
        assert!(ratio > 0.0 && ratio <= 1.0, "{fit}");
        // The ratio found completes; the one below it that failed, within
        // the precision, does not. (Not every ratio between 0 and it fails:
        // success is not always monotone in the budget.)
        let fails_at = fit["fails_at"].as_f64().unwrap();
        assert!(fails_at < ratio && ratio - fails_at <= 0.02, "{fit}");
        for (probe, completes) in [(ratio, true), (fails_at, false)] {
            let (ok, stdout, stderr) = dtr(&[
                "replay",
                "traces/resnet-small.jsonl",
                "--ratio",
                &probe.to_string(),
                "--heuristic",
                fit["heuristic"].as_str().unwrap(),
                "--memory",
                fit["memory"].as_str().unwrap(),
                "--json",
            ]);
            assert!(ok, "{stderr}");
            let status =
                serde_json::from_str::<serde_json::Value>(stdout.trim()).unwrap()["status"].clone();
            assert_eq!(status == "ok", completes, "{fit} at {probe}: {status}");
        }
    }
    let (ok, stdout, _) = dtr(&["fit", "traces/resnet-small.jsonl"]);
    assert!(
        ok && stdout.contains("| traces/resnet-small.jsonl | "),
        "{stdout}"
    );
    let (ok, _, stderr) = dtr(&["fit", "traces/resnet-small.jsonl", "--precision", "2"]);
    assert!(!ok && stderr.contains("precision"), "{stderr}");
}

fn temp_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("dtr-cli-{name}-{}", std::process::id()));
    std::fs::remove_dir_all(&dir).ok();
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// `--timeline-out` writes the Chrome trace event format: op slices,
/// rematerialisation slices, memory counters and eviction instants with
/// the victim's size and score; it is checked before the replay like `--timeline`.
#[test]
fn replay_writes_a_chrome_trace_for_perfetto() {
    let dir = temp_dir("chrome");
    let out = dir.join("run.json");
    let (ok, stdout, stderr) = dtr(&[
        "replay",
        "traces/mlp-small.jsonl",
        "--ratio",
        "0.6",
        "--timeline-out",
        out.to_str().unwrap(),
    ]);
    assert!(ok, "{stderr}");
    assert!(stdout.contains("peak"), "{stdout}");
    let trace: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    let events = trace["traceEvents"].as_array().unwrap();
    let of = |ph: &str, cat: &str| {
        events
            .iter()
            .filter(|e| e["ph"] == ph && (cat.is_empty() || e["cat"] == cat))
            .collect::<Vec<_>>()
    };
    let ops = of("X", "op");
    assert!(ops
        .iter()
        .any(|e| e["name"] == "matmul" || e["args"]["cost"].as_u64() > Some(0)));
    assert!(ops.iter().all(
        |e| e["dur"].as_f64().unwrap() >= 0.0 && e["args"]["trace_line"].as_u64().unwrap() > 1
    ));
    let remats = of("X", "remat");
    assert!(!remats.is_empty(), "a 0.6 budget rematerialises");
    assert!(remats.iter().all(|e| e["dur"].as_f64().unwrap() > 0.0));
    let evictions = of("i", "evict");
    assert!(!evictions.is_empty());
    assert!(evictions
        .iter()
        .all(|e| e["args"]["bytes"].as_u64().is_some()));
    // The policy's evictions carry the victim's score (null only when
    // infinite: chosen for want of any other); eager ones have none.
    let scored = |e: &&serde_json::Value| e["args"]["score"].as_f64().is_some_and(|s| s >= 0.0);
    assert!(evictions
        .iter()
        .any(|e| e["args"]["eager"] == false && scored(e)));
    assert!(evictions
        .iter()
        .all(|e| e["args"]["score"].is_null() || (e["args"]["eager"] == false && scored(e))));
    let counters = of("C", "");
    assert!(counters
        .iter()
        .any(|e| e["args"]["in_use_bytes"].as_u64().is_some()));
    // Time never runs backwards along the slices.
    let starts: Vec<f64> = ops.iter().map(|e| e["ts"].as_f64().unwrap()).collect();
    assert!(starts.windows(2).all(|w| w[0] <= w[1]));

    for (path, expected) in [
        ("traces/mlp-small.jsonl", "names the input"),
        ("/tmp/x.txt", ".json"),
        // Checked before the replay, not when writing after it.
        ("/nonexistent-dtr-dir/t.json", "does not exist"),
    ] {
        let (ok, stdout, stderr) = dtr(&[
            "replay",
            "traces/mlp-small.jsonl",
            "--ratio",
            "0.6",
            "--timeline-out",
            path,
        ]);
        assert!(
            !ok && stderr.contains(expected) && stdout.is_empty(),
            "{stderr}"
        );
    }
    std::fs::remove_dir_all(dir).ok();
}

/// Argument errors say what is wrong with the value given.
#[test]
fn argument_errors_name_the_real_problem() {
    for (args, expected) in [
        (
            vec!["replay", "traces/mlp-small.jsonl", "--ratio", "-0.5"],
            "must be positive",
        ),
        (
            vec!["replay", "traces/mlp-small.jsonl", "--budget", "1e30"],
            "out of range",
        ),
        (
            vec!["replay", "traces/mlp-small.jsonl", "--budget", "-5"],
            "negative",
        ),
        (
            vec![
                "sweep",
                "traces/mlp-small.jsonl",
                "--ratios",
                "-0.5",
                "--out",
                "/tmp/never-made",
            ],
            "must be positive",
        ),
        (
            vec![
                "sweep",
                "traces/mlp-small.jsonl",
                "--seeds",
                "0",
                "--out",
                "/tmp/never-made",
            ],
            "--seeds",
        ),
    ] {
        let (ok, _, stderr) = dtr(&args);
        assert!(!ok && stderr.contains(expected), "{args:?}: {stderr}");
        assert!(
            !stderr.contains("use '--"),
            "{args:?}: clap's hint: {stderr}"
        );
        assert!(!stderr.contains("unknown unit"), "{args:?}: {stderr}");
    }
    let (ok, stdout, _) = dtr(&[
        "replay",
        "traces/mlp-small.jsonl",
        "--budget",
        "2e5",
        "--json",
    ]);
    assert!(ok && stdout.contains("\"budget_bytes\":200000"), "{stdout}");
    let dir = temp_dir("gen");
    let out = dir.join("unet.jsonl");
    let (ok, _, stderr) = dtr(&[
        "gen",
        "unet",
        "--depth",
        "0",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(
        !ok && stderr.contains("--depth must be at least 1"),
        "{stderr}"
    );
    assert!(
        !stderr.contains("unet.jsonl"),
        "it blames no file: {stderr}"
    );
    assert!(!out.exists());
    // A length no memory holds is refused at once, not built.
    let (ok, _, stderr) = dtr(&[
        "gen",
        "chain",
        "--length",
        "18446744073709551615",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(
        !ok && stderr.contains("--length must be at most"),
        "{stderr}"
    );
    assert!(!out.exists());
    std::fs::remove_dir_all(dir).ok();
}

/// A sweep saves each run as it finishes: an interrupted sweep keeps them,
/// refuses to start over them silently, and `--resume` runs only the rest.
#[test]
fn an_interrupted_sweep_keeps_its_runs_and_resumes() {
    let dir = temp_dir("resume");
    let whole = dir.join("whole");
    let args = |out: &std::path::Path, resume: bool| {
        let mut args = vec![
            "sweep".to_string(),
            "traces/mlp-small.jsonl".into(),
            "--heuristics".into(),
            "dtr-eq,lru".into(),
            "--ratios".into(),
            "1,0.5,0.2".into(),
            "--jobs".into(),
            "1".into(),
            "--out".into(),
            out.display().to_string(),
        ];
        if resume {
            args.push("--resume".into());
        }
        args
    };
    let run = |args: Vec<String>| dtr(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let (ok, _, stderr) = run(args(&whole, false));
    assert!(ok, "{stderr}");
    assert!(
        !whole.join("results.partial.jsonl").exists(),
        "removed once complete"
    );
    let rows: Vec<serde_json::Value> =
        serde_json::from_str(&std::fs::read_to_string(whole.join("results.json")).unwrap())
            .unwrap();
    assert_eq!(rows.len(), 6);

    // As an interrupted sweep leaves it: two runs saved, a third cut short.
    let cut = dir.join("cut");
    std::fs::create_dir_all(&cut).unwrap();
    let mut partial = String::new();
    for row in &rows[..2] {
        partial += &format!("{row}\n");
    }
    partial += &rows[2].to_string()[..20];
    std::fs::write(cut.join("results.partial.jsonl"), &partial).unwrap();
    let (ok, _, stderr) = run(args(&cut, false));
    assert!(!ok && stderr.contains("--resume"), "{stderr}");
    assert_eq!(
        std::fs::read_to_string(cut.join("results.partial.jsonl")).unwrap(),
        partial
    );
    let (ok, _, stderr) = run(args(&cut, true));
    assert!(ok && stderr.contains("resuming: 2 runs"), "{stderr}");
    let resumed: Vec<serde_json::Value> =
        serde_json::from_str(&std::fs::read_to_string(cut.join("results.json")).unwrap()).unwrap();
    assert_eq!(resumed.len(), 6);
    for (a, b) in rows.iter().zip(&resumed) {
        for field in [
            "index",
            "heuristic",
            "ratio",
            "status",
            "overhead",
            "overhead_at_stop",
            "evictions",
        ] {
            assert_eq!(a[field], b[field], "{field}");
        }
    }

    // A saved run of another grid is refused, not mixed in.
    let other = dir.join("other");
    std::fs::create_dir_all(&other).unwrap();
    let mut foreign = rows[1].clone();
    foreign["ratio"] = serde_json::json!(0.7);
    std::fs::write(other.join("results.partial.jsonl"), format!("{foreign}\n")).unwrap();
    let (ok, _, stderr) = run(args(&other, true));
    assert!(
        !ok && stderr.contains("not a cell of this sweep"),
        "{stderr}"
    );
    std::fs::remove_dir_all(dir).ok();
}

/// Copies a trace to `trace` and checks that a sweep of it into `out`
/// refuses to run, leaving it as it was.
fn sweep_refuses_to_overwrite(trace: &std::path::Path, out: &std::path::Path) {
    std::fs::copy("traces/mlp-small.jsonl", trace).unwrap();
    let (ok, _, stderr) = dtr(&[
        "sweep",
        trace.to_str().unwrap(),
        "--ratios",
        "1",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(
        !ok && stderr.contains("would overwrite the input"),
        "{stderr}"
    );
    assert_eq!(
        std::fs::read(trace).unwrap(),
        std::fs::read("traces/mlp-small.jsonl").unwrap()
    );
}

/// A sweep's outputs never overwrite one of its traces.
#[test]
fn sweep_refuses_an_out_that_would_overwrite_a_trace() {
    let dir = temp_dir("sweep-input");
    sweep_refuses_to_overwrite(&dir.join("results.json"), &dir);
    std::fs::remove_dir_all(dir).ok();
}

/// Stopped runs have no overhead, only where they stopped; tables show
/// sizes for people; every subcommand's help has an example.
#[test]
fn stopped_runs_say_where_they_stopped_and_tables_are_readable() {
    let dir = temp_dir("stopped");
    let (ok, _, stderr) = dtr(&[
        "sweep",
        "traces/mlp-small.jsonl",
        "--heuristics",
        "dtr-eq",
        "--ratios",
        "1,0.1",
        "--out",
        dir.to_str().unwrap(),
    ]);
    assert!(ok, "{stderr}");
    let rows: Vec<serde_json::Value> =
        serde_json::from_str(&std::fs::read_to_string(dir.join("results.json")).unwrap()).unwrap();
    let (done, stopped) = (&rows[0], &rows[1]);
    assert_eq!(
        (done["status"].as_str(), stopped["status"].as_str()),
        (Some("ok"), Some("oom"))
    );
    assert!(done["overhead"].as_f64().is_some() && done["overhead_at_stop"].is_null());
    assert!(stopped["overhead"].is_null() && stopped["overhead_at_stop"].as_f64().is_some());
    let csv = std::fs::read_to_string(dir.join("results.csv")).unwrap();
    let header: Vec<&str> = csv.lines().next().unwrap().split(',').collect();
    let column = |name: &str| header.iter().position(|h| *h == name).unwrap();
    let oom: Vec<&str> = csv.lines().nth(2).unwrap().split(',').collect();
    assert_eq!(oom[column("overhead")], "");
    assert!(oom[column("overhead_at_stop")].parse::<f64>().is_ok());

    // Results written before `overhead_at_stop` still load, read the new way.
    let mut old = stopped.clone();
    old.as_object_mut().unwrap().remove("overhead_at_stop");
    old["overhead"] = serde_json::json!(1.0);
    let old_file = dir.join("old.json");
    std::fs::write(&old_file, serde_json::json!([done, old]).to_string()).unwrap();
    let rows = dtr::experiments::read_results(&old_file).unwrap();
    assert_eq!(
        (rows[1].overhead, rows[1].overhead_at_stop),
        (None, Some(1.0))
    );

    let (ok, stdout, _) = dtr(&["info", "traces/mlp-small.jsonl"]);
    assert!(
        ok && stdout.contains("KiB") && !stdout.contains(" B ("),
        "{stdout}"
    );
    let (ok, stdout, _) = dtr(&["replay", "traces/mlp-small.jsonl", "--ratio", "0.6"]);
    assert!(ok && stdout.contains("KiB"), "{stdout}");
    for command in [
        "replay",
        "info",
        "sweep",
        "chains",
        "gen",
        "plot",
        "merge",
        "fit",
        "heuristics",
    ] {
        let (ok, stdout, _) = dtr(&[command, "--help"]);
        assert!(
            ok && stdout.contains(&format!("  dtr {command}")),
            "{command}: {stdout}"
        );
    }
    std::fs::remove_dir_all(dir).ok();
}

/// A run that stops says what would complete: the smallest budget `dtr fit`
/// finds, which does complete.
#[test]
fn an_out_of_memory_replay_suggests_a_budget_that_completes() {
    let (ok, stdout, stderr) = dtr(&[
        "replay",
        "traces/mlp-small.jsonl",
        "--ratio",
        "0.1",
        "--json",
    ]);
    assert!(ok, "{stderr}");
    let report: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(report["status"], "oom");
    let message = report["message"].as_str().unwrap();
    assert!(
        message.starts_with("traces/mlp-small.jsonl:") && message.contains("needs"),
        "{message}"
    );
    let suggested = report["suggested_budget_bytes"].as_u64().unwrap();
    let (ok, stdout, _) = dtr(&[
        "replay",
        "traces/mlp-small.jsonl",
        "--budget",
        &suggested.to_string(),
        "--json",
    ]);
    let again: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    assert!(ok && again["status"] == "ok", "{stdout}");
    let (_, stdout, _) = dtr(&["replay", "traces/mlp-small.jsonl", "--ratio", "0.1"]);
    assert!(
        stdout.contains(&format!("--budget {suggested}")),
        "{stdout}"
    );
}

/// In an arena the message gives the request as placed (aligned) and the
/// largest free block, so an alignment larger than the budget, or free
/// bytes scattered in pieces, read as what they are.
#[test]
fn an_arena_out_of_memory_names_the_aligned_request_and_the_largest_block() {
    let (ok, stdout, stderr) = dtr(&[
        "replay",
        "traces/mlp-small.jsonl",
        "--ratio",
        "0.5",
        "--memory",
        "arena:1073741824",
        "--no-suggest",
        "--json",
    ]);
    assert!(ok, "{stderr}");
    let report: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    let message = report["message"].as_str().unwrap();
    assert!(
        message.contains("needs 16384 B (1073741824 B aligned)"),
        "{message}"
    );
    assert!(message.contains("B free, the largest block "), "{message}");
    let (_, stdout, _) = dtr(&[
        "replay",
        "traces/mlp-small.jsonl",
        "--ratio",
        "0.1",
        "--json",
        "--no-suggest",
    ]);
    let report: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    let message = report["message"].as_str().unwrap();
    assert!(
        !message.contains("aligned") && !message.contains("largest block"),
        "counting bytes: {message}"
    );
}

/// A regular file is mapped, a pipe read: both give the same replay.
#[test]
fn a_trace_read_from_a_pipe_replays_as_from_its_file() {
    let args = ["--ratio", "0.6", "--json"];
    let (ok, from_file, stderr) = dtr(&[&["replay", "traces/mlp-small.jsonl"][..], &args].concat());
    assert!(ok, "{stderr}");
    let trace = std::fs::read(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/traces/mlp-small.jsonl"
    ))
    .unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_dtr"))
        .args([&["replay", "/dev/stdin"][..], &args].concat())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let writer = std::thread::spawn(move || std::io::Write::write_all(&mut stdin, &trace));
    let output = child.wait_with_output().unwrap();
    writer.join().unwrap().unwrap();
    assert!(output.status.success());
    assert!(from_file.contains(r#""status":"ok""#), "{from_file}");
    // Alike but for the trace's name and the wall time.
    let report = |text: &str| {
        let mut value: serde_json::Value = serde_json::from_str(text.trim()).unwrap();
        let object = value.as_object_mut().unwrap();
        object.retain(|key, _| key != "trace" && !key.contains("wall"));
        value
    };
    assert_eq!(
        report(&String::from_utf8_lossy(&output.stdout)),
        report(&from_file)
    );
}

/// Output into a pipe whose reader is gone (`dtr heuristics | head -0`)
/// ends the process by SIGPIPE, quietly, as other commands do: no panic.
#[cfg(unix)]
#[test]
fn output_into_a_closed_pipe_ends_quietly() {
    use std::os::unix::process::ExitStatusExt;
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let output = Command::new(env!("CARGO_BIN_EXE_dtr"))
        .arg("heuristics")
        .stdout(writer)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(output.status.signal(), Some(13), "{stderr}");
}

#[test]
fn the_guards_are_switches_that_take_an_optional_value() {
    let replay = |extra: &[&str]| {
        let args = [
            &[
                "replay",
                "traces/mlp-small.jsonl",
                "--ratio",
                "0.6",
                "--json",
            ],
            extra,
        ]
        .concat();
        dtr(&args)
    };
    for flags in [
        &[][..],
        &["--keep-needed-history", "--remat-guard"],
        &["--keep-needed-history=false", "--remat-guard=true"],
        &["--heuristic", "dtr", "--remat-guard"],
        &["--pin-resident-first", "--remat-guard=false"],
        &["--pin-resident-first=false"],
    ] {
        let (ok, stdout, stderr) = replay(flags);
        assert!(ok, "{flags:?}: {stderr}");
        let report: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
        assert_eq!(report["status"], "ok", "{flags:?}");
    }
    for flag in ["--remat-guard", "--pin-resident-first"] {
        let (ok, _, stderr) = replay(&[&format!("{flag}=maybe")]);
        assert!(!ok);
        assert!(stderr.contains(flag), "{stderr}");
    }
    // A value must be joined with `=`: the next word is the trace, not a value.
    let (ok, stdout, stderr) = dtr(&[
        "replay",
        "--keep-needed-history",
        "traces/mlp-small.jsonl",
        "--ratio",
        "0.6",
        "--json",
    ]);
    assert!(ok, "{stderr}");
    assert!(stdout.contains("\"status\":\"ok\""), "{stdout}");
}

/// A value named twice in a sweep's grid runs once: one row, not two alike.
#[test]
fn a_sweep_runs_a_repeated_value_once() {
    let dir = temp_dir("sweep-repeats");
    let (ok, _, stderr) = dtr(&[
        "sweep",
        "traces/mlp-small.jsonl",
        "--heuristics",
        "dtr,dtr",
        "--ratios",
        "0.5,0.5,0.6",
        "--memory",
        "counter,counter",
        "--out",
        dir.to_str().unwrap(),
    ]);
    assert!(ok, "{stderr}");
    let rows = std::fs::read_to_string(dir.join("results.csv")).unwrap();
    assert_eq!(rows.lines().count(), 1 + 2, "{rows}");
    std::fs::remove_dir_all(dir).ok();
}
