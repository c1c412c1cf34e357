//! Recording and replaying traces: values on the CPU, decisions on the
//! simulator, and `file:line` errors for bad traces.

mod recording;

use dtr::trace::recorder::TraceRecorder;
use dtr::trace::replay::{baseline, replay, Kernels, ReplayStatus};
use dtr::trace::{native, simrd};
use dtr::{
    BinaryOp, Config, CpuBackend, Interpreter, Op, ReduceOp, SimulatorBackend, TensorId, UnaryOp,
};
use recording::SharedBuffer;

/// A two-layer network's forward and backward, under a budget, recorded.
/// Returns the trace text, the values read and the run's statistics.
fn record_program(config: Config) -> (String, Vec<Vec<f32>>, dtr::Stats) {
    let buffer = SharedBuffer::default();
    let mut dtr = Interpreter::new(CpuBackend::new(), config).unwrap();
    dtr.set_observer(Box::new(TraceRecorder::new(buffer.clone()).unwrap()));
    let mut reads = Vec::new();
    let values = |n: usize, seed: f32| {
        (0..n)
            .map(|i| (i as f32 * 0.37 + seed).sin())
            .collect::<Vec<_>>()
    };
    let x = dtr.put(&values(64, 0.1), &[16, 4]).unwrap();
    let w1 = dtr.put(&values(32, 0.2), &[4, 8]).unwrap();
    let w2 = dtr.put(&values(16, 0.3), &[8, 2]).unwrap();
    let h = dtr.apply1(Op::MatMul, &[x, w1]).unwrap();
    let a = dtr.apply1(Op::Unary(UnaryOp::Tanh), &[h]).unwrap();
    dtr.del(h).unwrap();
    let y = dtr.apply1(Op::MatMul, &[a, w2]).unwrap();
    let s = dtr.apply1(Op::Softmax { axis: -1 }, &[y]).unwrap();
    let at = dtr
        .apply1(Op::Transpose { dim0: 0, dim1: 1 }, &[a])
        .unwrap();
    let g = dtr.apply1(Op::MatMul, &[at, s]).unwrap();
    let total = dtr
        .apply1(
            Op::Reduce {
                op: ReduceOp::Sum,
                axis: 0,
                keepdim: false,
            },
            &[g],
        )
        .unwrap();
    let back = dtr
        .apply1(Op::UnaryBackward(UnaryOp::Tanh), &[a, a])
        .unwrap();
    let mixed = dtr.apply1(Op::Binary(BinaryOp::Mul), &[back, a]).unwrap();
    for t in [total, s, mixed, y] {
        reads.push(dtr.get_value(t).unwrap());
    }
    let tensors: [TensorId; 10] = [x, w1, w2, a, y, s, at, g, total, back];
    for t in tensors {
        dtr.del(t).unwrap();
    }
    reads.push(dtr.get_value(mixed).unwrap());
    dtr.finish_observer().unwrap();
    let text = buffer.text();
    (text, reads, dtr.stats().clone())
}

fn tight_config() -> Config {
    // Enough for the largest op with its inputs, below the program's peak.
    Config::default().with_budget_bytes(2000).with_events(true)
}

#[test]
fn recorded_trace_replays_to_the_same_values_on_the_cpu() {
    let (text, reads, stats) = record_program(tight_config());
    assert!(
        stats.evictions > 0 && stats.rematerializations > 0,
        "the budget should force recomputation: {stats:?}"
    );
    let trace = native::parse("recorded.jsonl", &text).unwrap();
    let mut cpu = Interpreter::new(CpuBackend::new(), tight_config()).unwrap();
    let report = replay(&trace, &mut cpu, Kernels::Execute).unwrap();
    assert_eq!(report.status, ReplayStatus::Ok);
    let replayed: Vec<Vec<f32>> = report.reads.into_iter().map(|(_, v)| v).collect();
    assert_eq!(replayed, reads, "values differ from the recorded run");
    assert_eq!(
        report.stats, stats,
        "decisions differ from the recorded run"
    );
}

#[test]
fn the_simulator_makes_the_same_decisions_as_the_cpu() {
    let (text, _, _) = record_program(tight_config());
    let trace = native::parse("recorded.jsonl", &text).unwrap();
    let mut cpu = Interpreter::new(CpuBackend::new(), tight_config()).unwrap();
    let on_cpu = replay(&trace, &mut cpu, Kernels::Execute).unwrap();
    let mut sim = Interpreter::new(SimulatorBackend::new(), tight_config()).unwrap();
    let on_sim = replay(&trace, &mut sim, Kernels::Recorded).unwrap();
    assert_eq!(on_sim.stats, on_cpu.stats);
    assert_eq!(on_sim.peak_bytes, on_cpu.peak_bytes);
    assert_eq!(
        sim.events(),
        cpu.events(),
        "eviction and rematerialisation sequences differ"
    );
}

#[test]
fn native_traces_round_trip_and_baseline_matches_an_unbounded_run() {
    let (text, _, _) = record_program(Config::default());
    let trace = native::parse("recorded.jsonl", &text).unwrap();
    assert_eq!(native::to_string(&trace), text);
    let base = baseline(&trace);
    let mut sim = Interpreter::new(SimulatorBackend::new(), Config::default()).unwrap();
    let report = replay(&trace, &mut sim, Kernels::Recorded).unwrap();
    assert_eq!(base.compute, report.stats.compute);
    assert_eq!(
        base.peak_bytes, report.peak_bytes,
        "without recomputation the peaks agree"
    );
}

fn native_error(body: &str) -> String {
    let text = format!("{{\"format\":\"dtr-trace\",\"version\":1}}\n{body}");
    native::parse("bad.jsonl", &text).unwrap_err().to_string()
}

/// Version 2: tensors of other dtypes (as recorded from PyTorch) replay on
/// the simulator from their sizes.
#[test]
fn other_dtypes_replay_on_the_simulator_from_their_sizes() {
    let text = r#"{"format":"dtr-trace","version":2}
{"event":"put","id":0,"bytes":64,"dims":[8],"dtype":"i64"}
{"event":"apply","op":"aten.ne.Scalar","inputs":[0],"outputs":[{"id":1,"bytes":8,"dims":[8],"dtype":"bool"}],"cost":100}
{"event":"apply","op":"aten._to_copy.default","inputs":[1],"outputs":[{"id":2,"bytes":16,"dims":[8],"dtype":"f16"}],"cost":50}
{"event":"del","id":1}
{"event":"get","id":2}
"#;
    let trace = native::parse("dtypes.jsonl", text).unwrap();
    let base = baseline(&trace);
    assert_eq!((base.peak_bytes, base.compute), (64 + 8 + 16, 150));
    let mut sim = Interpreter::new(SimulatorBackend::new(), Config::default()).unwrap();
    let report = replay(&trace, &mut sim, Kernels::Recorded).unwrap();
    assert_eq!(report.status, ReplayStatus::Ok);
    let mut cpu = Interpreter::new(CpuBackend::new(), Config::default()).unwrap();
    let refused = replay(&trace, &mut cpu, Kernels::Execute).unwrap_err();
    assert!(
        refused
            .to_string()
            .starts_with("dtypes.jsonl:3: `aten.ne.Scalar` has no kernel"),
        "{refused}"
    );
}

/// Version 3: the module an op ran in travels from a trace through a replay
/// and its recording; recorded ops carry no made-up shapes.
#[test]
fn module_names_survive_replay_and_recording() {
    let text = r#"{"format":"dtr-trace","version":3}
{"event":"put","id":0,"bytes":64}
{"event":"apply","op":"aten.relu.default","inputs":[0],"outputs":[{"id":1,"bytes":64}],"cost":10,"module":"Net.block.0"}
{"event":"apply","op":"aten.sum.default","inputs":[1],"outputs":[{"id":2,"bytes":4}],"cost":5}
"#;
    let trace = native::parse("modules.jsonl", text).unwrap();
    let buffer = SharedBuffer::default();
    let mut sim = Interpreter::new(SimulatorBackend::new(), Config::default()).unwrap();
    sim.set_observer(Box::new(TraceRecorder::new(buffer.clone()).unwrap()));
    replay(&trace, &mut sim, Kernels::Recorded).unwrap();
    sim.finish_observer().unwrap();
    let written = buffer.text();
    let lines: Vec<&str> = written.lines().collect();
    assert_eq!(lines[0], r#"{"format":"dtr-trace","version":4}"#);
    assert!(
        lines[2].contains(r#""module":"Net.block.0""#),
        "{}",
        lines[2]
    );
    assert!(!lines[3].contains("module"), "{}", lines[3]);
    assert!(!lines[2].contains("dims"), "{}", lines[2]);
    let again = native::parse("again.jsonl", &written).unwrap();
    assert_eq!(again.events, trace.events);
}

#[test]
fn native_errors_name_file_and_line() {
    let put = r#"{"event":"put","id":1,"bytes":4}"#;
    let cases = [
        (format!("{put}\n{{\"event\":\"del\",\"id\":7}}"), "bad.jsonl:3: unknown tensor id 7"),
        (format!("{put}\n{{\"event\":\"del\""), "bad.jsonl:3: EOF while parsing"),
        (r#"{"event":"put","id":1}"#.to_string(), "bad.jsonl:2: missing field `bytes`"),
        (format!("{put}\n{put}"), "bad.jsonl:3: tensor id 1 is defined twice"),
        (
            format!("{put}\n{{\"event\":\"del\",\"id\":1}}\n{{\"event\":\"get\",\"id\":1}}"),
            "bad.jsonl:4: tensor id 1 is used after its last reference was released on line 3",
        ),
        (
            format!("{put}\n{{\"event\":\"apply\",\"op\":\"v\",\"inputs\":[1],\"outputs\":[{{\"id\":2,\"bytes\":0,\"alias_of\":3}}],\"cost\":1}}"),
            "bad.jsonl:3: output 0 of `v` aliases input 3, but it has 1 inputs",
        ),
        (r#"{"event":"explode"}"#.to_string(), "bad.jsonl:2: unknown variant `explode`"),
        (
            r#"{"event":"put","id":1,"bytes":8,"dtype":"i64","dims":[1],"data":[1]}"#.to_string(),
            "bad.jsonl:2: `data` is for f32 tensors, not i64",
        ),
        (
            format!("{put}\n{{\"event\":\"apply\",\"op\":\"exp\",\"kernel\":{{\"unary\":\"exp\"}},\"inputs\":[1],\"outputs\":[{{\"id\":2,\"bytes\":2,\"dtype\":\"f16\"}}],\"cost\":1}}"),
            "bad.jsonl:3: `exp` has a kernel, but its output 2 is f16",
        ),
        (
            r#"{"event":"put","id":1,"bytes":8,"dtype":"float32"}"#.to_string(),
            "bad.jsonl:2: dtype `float32` is not one of f32, f64",
        ),
        (
            format!("{put}\n{{\"event\":\"apply\",\"op\":\"big\",\"inputs\":[1],\"outputs\":[{{\"id\":2,\"bytes\":4,\"dims\":[4294967296,4294967296]}}],\"cost\":1}}"),
            "bad.jsonl:3: output 0 of `big`: shape [4294967296, 4294967296] is too large",
        ),
        (
            format!("{put}\n{{\"event\":\"apply\",\"op\":\"two\",\"inputs\":[1],\"outputs\":[{{\"id\":2,\"bytes\":4}},{{\"id\":3,\"bytes\":4}},{{\"id\":2,\"bytes\":4}}],\"cost\":1}}"),
            "bad.jsonl:3: output id 2 is repeated",
        ),
        (
            format!("{put}\n{{\"event\":\"apply\",\"op\":\"v\",\"inputs\":[1],\"outputs\":[{{\"id\":2,\"bytes\":0,\"alias_of\":0}}],\"cost\":1}}\n{{\"event\":\"detach\",\"id\":2}}"),
            "bad.jsonl:4: detach of tensor id 2, a view of another tensor's storage",
        ),
    ];
    for (body, expected) in cases {
        let message = native_error(&body);
        assert!(
            message.starts_with(expected),
            "expected `{expected}…`, got `{message}`"
        );
    }
    let header =
        native::parse("h.jsonl", "{\"format\":\"dtr-trace\",\"version\":9}\n").unwrap_err();
    assert!(
        header
            .to_string()
            .starts_with("h.jsonl:1: version 9 is not supported"),
        "{header}"
    );
}

#[test]
fn simrd_errors_name_file_and_line() {
    let start = r#"{"ANNOTATION":"START","INSTRUCTION":"ANNOTATE"}"#;
    let cases = [
        (
            r#"{"INSTRUCTION":"CONSTANT","NAME":"a"}"#.to_string(),
            "log:2: expected MEMORY for `a` after this line",
        ),
        (
            r#"{"INSTRUCTION":"RELEASE","NAME":"zz"}
{"INSTRUCTION":"COPY","DST":"b","SRC":"zz"}"#
                .to_string(),
            "log:3: unknown tensor `zz`",
        ),
        (
            r#"{"INSTRUCTION":"CALL","NAME":"f","ARGS":[],"RESULT":["r"],"TIME":"x"}"#.to_string(),
            "log:2: `TIME` must be an integer",
        ),
        ("not json".to_string(), "log:2: expected ident"),
        (
            r#"{"INSTRUCTION":"WHAT"}"#.to_string(),
            "log:2: unknown instruction `WHAT`",
        ),
    ];
    for (body, expected) in cases {
        let message = simrd::parse("log", &format!("{start}\n{body}"))
            .unwrap_err()
            .to_string();
        assert!(
            message.starts_with(expected),
            "expected `{expected}…`, got `{message}`"
        );
    }
}

/// A log long enough to be read in many chunks, on two threads: its lines
/// are imported in order, and an error names its own line.
#[test]
fn long_simrd_logs_are_read_in_order_and_errors_name_their_line() {
    let mut lines = vec![r#"{"ANNOTATION":"START","INSTRUCTION":"ANNOTATE"}"#.to_string()];
    for i in 0..5000 {
        lines.push(format!(r#"{{"INSTRUCTION":"CONSTANT","NAME":"c{i}"}}"#));
        lines.push(format!(
            r#"{{"INSTRUCTION":"MEMORY","MEMORY":"{}","NAME":"c{i}"}}"#,
            i + 1
        ));
        if i % 2 == 0 {
            lines.push(format!(r#"{{"INSTRUCTION":"RELEASE","NAME":"c{i}"}}"#));
        }
    }
    let log = lines.join("\n");
    assert!(log.len() > 300_000, "read on two threads from 256 KiB");
    let trace = simrd::parse("log", &log).unwrap();
    let sizes: Vec<u64> = trace
        .events
        .iter()
        .filter_map(|e| match e {
            dtr::trace::TraceEvent::Put { bytes, .. } => Some(*bytes),
            _ => None,
        })
        .collect();
    assert_eq!(sizes, (1..=5000).collect::<Vec<u64>>(), "in file order");
    // Each event's line, as the file numbers it: a put on its CONSTANT's.
    assert_eq!(trace.lines[..4], [2, 4, 5, 7]);
    // The even sizes are never released: at the end they are all held.
    let held: u64 = (1..=2500u64).map(|k| 2 * k).sum();
    assert_eq!(baseline(&trace).peak_bytes, held);

    let broken = |at: usize, with: &str| {
        let mut lines = lines.clone();
        lines[at - 1] = with.to_string();
        simrd::parse("log", &lines.join("\n"))
            .unwrap_err()
            .to_string()
    };
    let message = broken(11_001, "not json");
    assert!(
        message.starts_with("log:11001: expected ident"),
        "{message}"
    );
    // Line 104 releases `c40`.
    let message = broken(104, r#"{"INSTRUCTION":"COPY","DST":"d","SRC":"zz"}"#);
    assert!(
        message.starts_with("log:104: unknown tensor `zz`"),
        "{message}"
    );
    // An import error early and a JSON error late: the JSON error wins, as
    // it names the first thing wrong with the file.
    let mut lines_two = lines.clone();
    lines_two[103] = r#"{"INSTRUCTION":"COPY","DST":"d","SRC":"zz"}"#.to_string();
    lines_two[12_000] = "[1]".to_string();
    let message = simrd::parse("log", &lines_two.join("\n"))
        .unwrap_err()
        .to_string();
    assert!(
        message.starts_with("log:12001: expected a JSON object"),
        "{message}"
    );
}

#[test]
fn simrd_conventions_for_mutation_aliases_and_outputs() {
    let log = r#"{"ANNOTATION":"START","INSTRUCTION":"ANNOTATE"}
{"INSTRUCTION":"CONSTANT","NAME":"w"}
{"INSTRUCTION":"MEMORY","MEMORY":"100","NAME":"w"}
{"ARGS":["w"],"INSTRUCTION":"CALL","NAME":"mul","RESULT":["a"],"TIME":"10"}
{"INSTRUCTION":"MEMORY","MEMORY":"400","NAME":"a"}
{"ALIAS":"-1","INSTRUCTION":"ALIAS","NAME":"a"}
{"ARGS":["a"],"INSTRUCTION":"CALL","NAME":"view","RESULT":["v"],"TIME":"1"}
{"INSTRUCTION":"MEMORY","MEMORY":"400","NAME":"v"}
{"ALIAS":"0","INSTRUCTION":"ALIAS","NAME":"v"}
{"ARGS":["v"],"INSTRUCTION":"MUTATE","MUTATE":[0],"NAME":"relu_","TIME":"5"}
{"INSTRUCTION":"RELEASE","NAME":"a"}
{"INSTRUCTION":"RELEASE","NAME":"nobody"}"#;
    let trace = simrd::parse("log", log).unwrap();
    let base = baseline(&trace);
    assert_eq!(base.compute, 16);
    assert_eq!(base.constant_bytes, 100);
    // w (100) + a (400, shared by the view v) + relu_'s copy of v's 400-byte storage.
    assert_eq!(base.peak_bytes, 900);
    // `w` and the mutated `v` are still referenced at the end: pinned outputs.
    let pins = trace
        .events
        .iter()
        .filter(|e| matches!(e, dtr::trace::TraceEvent::Pin { .. }))
        .count();
    assert_eq!(pins, 2);
}

/// Each trace the examples recorded (`traces/`) replays on the CPU under a
/// budget with the unbounded run's values, bit for bit.
#[test]
fn the_shipped_traces_replay_under_budget_with_unbounded_values() {
    for (name, ratio) in [
        ("mlp-small", 0.6),
        ("transformer-small", 0.75),
        ("resnet-small", 0.75),
    ] {
        let path =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("traces/{name}.jsonl"));
        let (trace, _) = dtr::trace::load(&path, None).unwrap();
        let base = baseline(&trace);
        let mut unbounded = Interpreter::new(CpuBackend::new(), Config::default()).unwrap();
        let expected = replay(&trace, &mut unbounded, Kernels::Execute).unwrap();
        // Of the unbounded interpreter's peak, as the examples measure it: a
        // put released while its dependents may need it stays resident, which
        // the free-at-release baseline does not count.
        assert!(expected.peak_bytes >= base.peak_bytes, "{name}");
        let budget = (ratio * expected.peak_bytes as f64) as u64;
        let mut bounded = Interpreter::new(
            CpuBackend::new(),
            Config::default()
                .with_heuristic("dtr")
                .with_budget_bytes(budget),
        )
        .unwrap();
        let report = replay(&trace, &mut bounded, Kernels::Execute).unwrap();
        assert_eq!(
            report.status,
            ReplayStatus::Ok,
            "{name}: {:?}",
            report.message
        );
        assert!(report.stats.rematerializations > 0, "{name}");
        assert!(report.peak_bytes <= budget, "{name}");
        assert!(!expected.reads.is_empty(), "{name}");
        assert_eq!(
            report.reads, expected.reads,
            "{name}: losses differ from the unbounded run"
        );
    }
}

/// The torchvision traces recorded from PyTorch (dtr.torch.record) replay
/// unchanged on the simulator: ResNet-50 under half its peak, each with
/// memory never over the budget, and with the baseline a run without budget
/// reaches.
#[test]
fn the_recorded_torchvision_traces_replay_on_the_simulator() {
    for (name, ratio) in [
        ("resnet50-b16", 0.5),
        ("mobilenet_v2-b16", 0.5),
        ("vit_b_16-b8", 0.95),
    ] {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join(format!("traces/torchvision/{name}.jsonl"));
        let (trace, _) = dtr::trace::load(&path, None).unwrap();
        let base = baseline(&trace);
        let mut unbounded = Interpreter::new(SimulatorBackend::new(), Config::default()).unwrap();
        let full = replay(&trace, &mut unbounded, Kernels::Recorded).unwrap();
        assert_eq!(full.status, ReplayStatus::Ok, "{name}");
        assert_eq!(full.stats.compute, base.compute, "{name}");
        let budget = (ratio * base.peak_bytes as f64) as u64;
        let mut bounded = Interpreter::new(
            SimulatorBackend::new(),
            Config::default()
                .with_heuristic("dtr")
                .with_budget_bytes(budget),
        )
        .unwrap();
        let report = replay(&trace, &mut bounded, Kernels::Recorded).unwrap();
        assert_eq!(
            report.status,
            ReplayStatus::Ok,
            "{name}: {:?}",
            report.message
        );
        assert!(report.peak_bytes <= budget, "{name}");
        assert!(
            report.stats.remat_compute > 0,
            "{name}: the budget made it recompute"
        );
    }
}

/// Outputs pinned at a trace's end (`Config::pin_resident_first`): `o1`
/// was evicted to make `o2`, and both share the history `a`; `x` is held
/// but never read again. Pinned in log order, `o1`'s rematerialisation
/// evicts `o2` (cheaper than `x`), which must then be recomputed in turn;
/// pinning the resident `o2` first leaves `x` the only victim.
#[test]
fn pinning_resident_outputs_first_spares_them_a_rematerialisation() {
    const TRACE: &str = r#"{"format":"dtr-trace","version":1}
{"event":"apply","op":"make_a","inputs":[],"outputs":[{"id":0,"bytes":100}],"cost":10}
{"event":"apply","op":"o1_of_a","inputs":[0],"outputs":[{"id":1,"bytes":20}],"cost":10}
{"event":"apply","op":"make_x","inputs":[],"outputs":[{"id":2,"bytes":100}],"cost":1000}
{"event":"apply","op":"o2_of_a","inputs":[0],"outputs":[{"id":3,"bytes":90}],"cost":10}
{"event":"del","id":0}
{"event":"pin","id":1}
{"event":"pin","id":3}
"#;
    let trace = native::parse("outputs", TRACE).unwrap();
    let run = |first: bool| {
        let config = Config::default()
            .with_heuristic("dtr")
            .with_budget_bytes(290)
            .with_resident_pinned_first(first);
        let mut dtr = Interpreter::new(SimulatorBackend::new(), config).unwrap();
        let report = replay(&trace, &mut dtr, Kernels::Recorded).unwrap();
        assert_eq!(report.status, ReplayStatus::Ok, "{:?}", report.message);
        assert!(report.peak_bytes <= 290);
        dtr.check_invariants().unwrap();
        report.stats
    };
    let in_log_order = run(false);
    let resident_first = run(true);
    // `a` and `o1` either way; `o2` too in log order.
    assert_eq!(in_log_order.rematerializations, 3);
    assert_eq!(resident_first.rematerializations, 2);
    assert!(resident_first.remat_compute < in_log_order.remat_compute);
}

/// A pin carried out ahead of its turn is not carried out again in its
/// turn: one `unpin` then frees the storage for eviction.
#[test]
fn a_tensor_pinned_ahead_is_pinned_once() {
    const TRACE: &str = r#"{"format":"dtr-trace","version":1}
{"event":"apply","op":"make_a","inputs":[],"outputs":[{"id":0,"bytes":100}],"cost":10}
{"event":"pin","id":0}
{"event":"unpin","id":0}
{"event":"apply","op":"make_b","inputs":[],"outputs":[{"id":1,"bytes":100}],"cost":10}
"#;
    let trace = native::parse("pin-unpin", TRACE).unwrap();
    for first in [false, true] {
        let config = Config::default()
            .with_budget_bytes(150)
            .with_resident_pinned_first(first);
        let mut dtr = Interpreter::new(SimulatorBackend::new(), config).unwrap();
        let report = replay(&trace, &mut dtr, Kernels::Recorded).unwrap();
        assert_eq!(
            report.status,
            ReplayStatus::Ok,
            "{first}: {:?}",
            report.message
        );
        assert_eq!(report.stats.evictions, 1, "{first}");
    }
}
