//! Both trace readers on hostile input: arbitrary bytes and mutated valid
//! traces give errors, never panics; a mutated trace that still parses
//! replays to a report or an error, never a panic, and replays unbounded
//! without an error: what a reader accepts, a replay accepts. The kinds of
//! invalid input the format document names are each tested below.

use dtr::trace::replay::{replay, Kernels, ReplayStatus};
use dtr::trace::{native, simrd, Trace};
use dtr::{Config, Interpreter, SimulatorBackend};
use proptest::prelude::*;

const NATIVE: &str = r#"{"format":"dtr-trace","version":1}
{"event":"put","id":0,"bytes":32,"dims":[2,4],"dtype":"f32","data":[1,2,3,4,5,6,7,8]}
{"event":"apply","op":"exp","kernel":{"unary":"exp"},"inputs":[0],"outputs":[{"id":1,"bytes":32,"dims":[2,4]}],"cost":8}
{"event":"apply","op":"transpose","kernel":{"transpose":{"dim0":0,"dim1":1}},"inputs":[1],"outputs":[{"id":2,"bytes":0,"alias_of":0,"dims":[4,2]}],"cost":1}
{"event":"apply","op":"matmul","kernel":"mat_mul","inputs":[1,2],"outputs":[{"id":3,"bytes":16,"dims":[2,2]}],"cost":32}
{"event":"del","id":1}
{"event":"retain","id":3}
{"event":"get","id":3}
{"event":"apply","op":"layer_norm_like","inputs":[3,0],"outputs":[{"id":4,"bytes":16},{"id":5,"bytes":8},{"id":6,"bytes":0,"alias_of":1}],"cost":20}
{"event":"pin","id":4}
{"event":"unpin","id":4}
{"event":"detach","id":4}
{"event":"del","id":2}
{"event":"del","id":3}
{"event":"del","id":3}
{"event":"pin","id":5}
"#;

/// The same program as a version 4 trace, which closes with its count.
fn native_v4() -> String {
    let body: Vec<&str> = NATIVE.lines().skip(1).collect();
    format!(
        "{{\"format\":\"dtr-trace\",\"version\":4}}\n{}\n{{\"event\":\"end\",\"events\":{}}}\n",
        body.join("\n"),
        body.len()
    )
}

const SIMRD: &str = r#"{"INSTRUCTION":"CONSTANT","NAME":"skipped"}
{"ANNOTATION":"START","INSTRUCTION":"ANNOTATE"}
{"INSTRUCTION":"CONSTANT","NAME":"w"}
{"INSTRUCTION":"MEMORY","MEMORY":"100","NAME":"w"}
{"DST":"w2","INSTRUCTION":"COPY","SRC":"w"}
{"ARGS":["w"],"INSTRUCTION":"CALL","NAME":"mul","RESULT":["a","b"],"TIME":"10"}
{"INSTRUCTION":"MEMORY","MEMORY":"400","NAME":"a"}
{"ALIAS":"-1","INSTRUCTION":"ALIAS","NAME":"a"}
{"INSTRUCTION":"MEMORY","MEMORY":"0","NAME":"b"}
{"ALIAS":"0","INSTRUCTION":"ALIAS","NAME":"b"}
{"ARGS":["a","b"],"INSTRUCTION":"CALL","NAME":"view","RESULT":["v"],"TIME":"1"}
{"INSTRUCTION":"MEMORY","MEMORY":"400","NAME":"v"}
{"ALIAS":"0","INSTRUCTION":"ALIAS","NAME":"v"}
{"ARGS":["v","w2"],"INSTRUCTION":"MUTATE","MUTATE":[0],"NAME":"relu_","TIME":"5"}
{"ANNOTATION":"BACKWARD","INSTRUCTION":"ANNOTATE"}
{"DST":"v","INSTRUCTION":"COPY_FROM","SRC":"a"}
{"INSTRUCTION":"RELEASE","NAME":"a"}
{"INSTRUCTION":"RELEASE","NAME":"w"}
{"INSTRUCTION":"RELEASE","NAME":"nobody"}
"#;

#[test]
fn the_seed_traces_are_valid() {
    native::parse("seed", NATIVE).unwrap();
    simrd::parse("seed", SIMRD).unwrap();
}

/// An edit of a trace's text.
#[derive(Debug, Clone)]
enum Mutation {
    DeleteLine(usize),
    DuplicateLine(usize),
    SwapLines(usize, usize),
    /// Replace the `n`-th run of digits with `value`.
    Number(usize, u64),
    Truncate(usize, usize),
    Insert(usize, String),
    /// Cut the trace after line `n`, at a line boundary.
    CutAfterLine(usize),
    /// Insert an `unpin` of tensor id `id` at line `n`.
    Unpin(usize, u64),
    /// Insert an op with an impossible kernel on tensor id `id` at line `n`.
    ImpossibleKernel(usize, u64, usize),
    /// Insert a put of `bytes` at line `n`.
    HugePut(usize, u64),
}

/// Kernels no backend could run, on any input: a transpose of an axis a
/// small tensor lacks, a fill of 2⁸⁰ elements, a convolution of stride 0,
/// an apply whose output shape overflows.
const IMPOSSIBLE: [&str; 4] = [
    r#""kernel":{"transpose":{"dim0":0,"dim1":7}},"outputs":[{"id":900,"bytes":32,"dims":[4,2]}]"#,
    r#""kernel":{"fill":{"dims":[1099511627776,1099511627776],"value":1.0}},"outputs":[{"id":900,"bytes":32}]"#,
    r#""kernel":{"conv2d":{"stride":[0,0],"padding":[0,0]}},"outputs":[{"id":900,"bytes":32}]"#,
    r#""outputs":[{"id":900,"bytes":32,"dims":[4294967296,4294967296,4294967296]}]"#,
];

fn mutation() -> impl Strategy<Value = Mutation> {
    let i = || 0usize..32;
    prop_oneof![
        i().prop_map(Mutation::DeleteLine),
        i().prop_map(Mutation::DuplicateLine),
        (i(), i()).prop_map(|(a, b)| Mutation::SwapLines(a, b)),
        (
            0usize..64,
            prop_oneof![0u64..20, Just(u64::MAX), Just(u64::MAX / 2), any::<u64>()]
        )
            .prop_map(|(n, v)| Mutation::Number(n, v)),
        (i(), 0usize..200).prop_map(|(l, at)| Mutation::Truncate(l, at)),
        (i(), "[ -~]{0,40}").prop_map(|(l, s)| Mutation::Insert(l, s)),
        i().prop_map(Mutation::CutAfterLine),
        (i(), 0u64..8).prop_map(|(l, id)| Mutation::Unpin(l, id)),
        (i(), 0u64..8, 0usize..IMPOSSIBLE.len())
            .prop_map(|(l, id, k)| Mutation::ImpossibleKernel(l, id, k)),
        (
            i(),
            prop_oneof![
                Just(u64::MAX),
                Just(1u64 << 62),
                Just((1u64 << 62) + 1),
                any::<u64>()
            ]
        )
            .prop_map(|(l, bytes)| Mutation::HugePut(l, bytes)),
    ]
}

fn mutate(text: &str, mutations: &[Mutation]) -> String {
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    for m in mutations {
        if lines.is_empty() {
            break;
        }
        let n = lines.len();
        match m {
            Mutation::DeleteLine(i) => {
                lines.remove(i % n);
            }
            Mutation::DuplicateLine(i) => {
                let line = lines[i % n].clone();
                lines.insert(i % n, line);
            }
            Mutation::SwapLines(a, b) => lines.swap(a % n, b % n),
            Mutation::Number(k, value) => {
                let joined = lines.join("\n");
                let mut runs = Vec::new();
                let bytes = joined.as_bytes();
                let mut i = 0;
                while i < bytes.len() {
                    if bytes[i].is_ascii_digit() {
                        let start = i;
                        while i < bytes.len() && bytes[i].is_ascii_digit() {
                            i += 1;
                        }
                        runs.push((start, i));
                    } else {
                        i += 1;
                    }
                }
                if let Some(&(start, end)) = runs.get(k % runs.len().max(1)) {
                    let edited = format!("{}{value}{}", &joined[..start], &joined[end..]);
                    lines = edited.lines().map(str::to_string).collect();
                }
            }
            Mutation::Truncate(l, at) => {
                let line = &mut lines[l % n];
                let mut cut = (*at).min(line.len());
                while !line.is_char_boundary(cut) {
                    cut -= 1;
                }
                line.truncate(cut);
            }
            Mutation::Insert(l, s) => lines.insert(l % (n + 1), s.clone()),
            Mutation::CutAfterLine(l) => lines.truncate(l % n + 1),
            Mutation::Unpin(l, id) => {
                lines.insert(l % (n + 1), format!(r#"{{"event":"unpin","id":{id}}}"#))
            }
            Mutation::ImpossibleKernel(l, id, k) => lines.insert(
                l % (n + 1),
                format!(
                    r#"{{"event":"apply","op":"bad","inputs":[{id}],{},"cost":1}}"#,
                    IMPOSSIBLE[*k]
                ),
            ),
            Mutation::HugePut(l, bytes) => lines.insert(
                l % (n + 1),
                format!(r#"{{"event":"put","id":{},"bytes":{bytes}}}"#, 800 + l),
            ),
        }
    }
    lines.join("\n")
}

/// What a reader accepts, a replay accepts: unbounded, on the simulator,
/// a trace that parsed runs to its end.
fn replays_unbounded(trace: &Trace) -> Result<(), String> {
    let mut dtr = Interpreter::new(SimulatorBackend::new(), Config::default()).unwrap();
    match replay(trace, &mut dtr, Kernels::Recorded) {
        Ok(report) if report.status == ReplayStatus::Ok => Ok(()),
        Ok(report) => Err(format!("stopped unbounded: {:?}", report.message)),
        Err(error) => Err(format!("the reader accepted what replay refuses: {error}")),
    }
}

/// Replays a trace that parsed on the simulator under a small budget.
fn replay_without_panic(trace: &Trace, budget: u64) {
    for retain in [false, true] {
        let config = Config::default()
            .with_budget_bytes(budget)
            .with_retained_history(retain)
            .with_remat_limit(1000);
        let mut dtr = Interpreter::new(SimulatorBackend::new(), config).unwrap();
        let _ = replay(trace, &mut dtr, Kernels::Recorded);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_are_errors_not_panics(bytes in prop::collection::vec(any::<u8>(), 0..400)) {
        let text = String::from_utf8_lossy(&bytes);
        let _ = native::parse("fuzz", &text);
        let _ = simrd::parse("fuzz", &text);
        let _ = native::parse("fuzz", &format!("{{\"format\":\"dtr-trace\",\"version\":1}}\n{text}"));
    }

    #[test]
    fn mutated_native_traces_never_panic(mutations in prop::collection::vec(mutation(), 1..6), budget in 0u64..400) {
        if let Ok(trace) = native::parse("fuzz", &mutate(NATIVE, &mutations)) {
            replays_unbounded(&trace).map_err(TestCaseError::fail)?;
            replay_without_panic(&trace, budget);
        }
    }

    #[test]
    fn mutated_version_4_traces_never_panic(mutations in prop::collection::vec(mutation(), 1..4), budget in 0u64..400) {
        let text = mutate(&native_v4(), &mutations);
        if let Ok(trace) = native::parse("fuzz", &text) {
            replays_unbounded(&trace).map_err(TestCaseError::fail)?;
            replay_without_panic(&trace, budget);
        }
    }

    /// A version 4 trace cut at any line boundary is refused, naming the
    /// last line it has.
    #[test]
    fn version_4_traces_cut_at_a_line_boundary_are_refused(keep in 1usize..17) {
        let full = native_v4();
        let lines: Vec<&str> = full.lines().collect();
        prop_assume!(keep < lines.len());
        let cut = lines[..keep].join("\n") + "\n";
        let error = native::parse("cut.jsonl", &cut).unwrap_err().to_string();
        prop_assert!(error.starts_with(&format!("cut.jsonl:{keep}: ")), "{}", error);
        prop_assert!(error.contains("cut short"), "{}", error);
    }

    /// Bytes that are not UTF-8 are refused with their line and column.
    #[test]
    fn non_utf8_bytes_are_refused_with_their_position(at in 0usize..400, byte in 0x80u8..=0xff) {
        let mut bytes = native_v4().into_bytes();
        let at = at % bytes.len();
        // A lone continuation or lead byte: never valid after ASCII.
        prop_assume!(bytes[at].is_ascii());
        bytes[at] = byte;
        let line = 1 + bytes[..at].iter().filter(|&&b| b == b'\n').count();
        let column = at - bytes[..at].iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1) + 1;
        let error = dtr::trace::utf8("bad.jsonl", bytes).unwrap_err().to_string();
        prop_assert!(
            error.starts_with(&format!("bad.jsonl:{line}: byte {column} of the line")),
            "{}", error
        );
    }

    #[test]
    fn mutated_simrd_logs_never_panic(mutations in prop::collection::vec(mutation(), 1..6), budget in 0u64..1200) {
        if let Ok(trace) = simrd::parse("fuzz", &mutate(SIMRD, &mutations)) {
            replay_without_panic(&trace, budget);
        }
    }
}

fn v4_error(body: &str) -> String {
    let count = body.lines().count();
    let text = format!(
        "{{\"format\":\"dtr-trace\",\"version\":4}}\n{body}\n{{\"event\":\"end\",\"events\":{count}}}\n"
    );
    native::parse("bad.jsonl", &text).unwrap_err().to_string()
}

#[test]
fn version_4_traces_round_trip_and_old_versions_still_read() {
    let trace = native::parse("v4.jsonl", &native_v4()).unwrap();
    let written = native::to_string(&trace);
    assert!(written.starts_with(r#"{"format":"dtr-trace","version":4}"#));
    assert!(written.ends_with(&format!(
        "{{\"event\":\"end\",\"events\":{}}}\n",
        trace.events.len()
    )));
    assert_eq!(
        native::parse("again", &written).unwrap().events,
        trace.events
    );
    // Versions 1 to 3 have no end line, and need none.
    native::parse("v1.jsonl", NATIVE).unwrap();
    let v3 = NATIVE.replacen("\"version\":1", "\"version\":3", 1);
    native::parse("v3.jsonl", &v3).unwrap();
    let with_end = format!("{v3}{{\"event\":\"end\",\"events\":15}}\n");
    let error = native::parse("v3.jsonl", &with_end)
        .unwrap_err()
        .to_string();
    assert!(error.contains("`end` is a version 4 event"), "{error}");
    // A count that does not match, and a line after the end.
    let wrong = native_v4().replace("\"events\":15", "\"events\":14");
    let error = native::parse("n.jsonl", &wrong).unwrap_err().to_string();
    assert!(
        error.starts_with("n.jsonl:17: the `end` line counts 14 events, but 15"),
        "{error}"
    );
    let after = native_v4() + "{\"event\":\"get\",\"id\":3}\n";
    let error = native::parse("a.jsonl", &after).unwrap_err().to_string();
    assert!(
        error.starts_with("a.jsonl:18: an event after the trace's `end` line (line 17)"),
        "{error}"
    );
}

#[test]
fn unpin_of_a_tensor_never_pinned_is_refused_by_the_reader() {
    let put = r#"{"event":"put","id":0,"bytes":32,"dims":[2,4]}"#;
    let error = v4_error(&format!("{put}\n{{\"event\":\"unpin\",\"id\":0}}"));
    assert!(
        error.starts_with("bad.jsonl:3: unpin of tensor id 0, which is not pinned"),
        "{error}"
    );
    let error = v4_error(&format!(
        "{put}\n{{\"event\":\"pin\",\"id\":0}}\n{{\"event\":\"unpin\",\"id\":0}}\n{{\"event\":\"unpin\",\"id\":0}}"
    ));
    assert!(error.starts_with("bad.jsonl:5: unpin"), "{error}");
    // Pins count per storage, as the interpreter counts them: a view's
    // unpin undoes its base's pin.
    let text = format!(
        "{{\"format\":\"dtr-trace\",\"version\":3}}\n{put}\n{{\"event\":\"pin\",\"id\":0}}\n\
         {{\"event\":\"apply\",\"op\":\"view\",\"inputs\":[0],\"outputs\":[{{\"id\":1,\"bytes\":0,\"alias_of\":0}}],\"cost\":1}}\n\
         {{\"event\":\"unpin\",\"id\":1}}\n"
    );
    let trace = native::parse("view.jsonl", &text).unwrap();
    replays_unbounded(&trace).unwrap();
}

#[test]
fn impossible_kernels_and_out_of_range_sizes_are_refused_with_their_line() {
    let put = r#"{"event":"put","id":0,"bytes":32,"dims":[2,4],"data":[1,2,3,4,5,6,7,8]}"#;
    for (k, expected) in [
        (0, "axis 7 is out of range"),
        (1, "too large"),
        (2, "the kernel of `bad` cannot run"),
        (3, "too large"),
    ] {
        let inputs = if k == 1 { "[]" } else { "[0]" };
        let apply = format!(
            r#"{{"event":"apply","op":"bad","inputs":{inputs},{},"cost":1}}"#,
            IMPOSSIBLE[k]
        );
        let apply = if k == 2 {
            // A convolution needs a rank-4 input and weight.
            apply.replace("\"inputs\":[0]", "\"inputs\":[1,1]")
        } else {
            apply
        };
        let body = if k == 2 {
            r#"{"event":"put","id":1,"bytes":64,"dims":[1,1,4,4]}"#.to_string() + "\n" + &apply
        } else {
            format!("{put}\n{apply}")
        };
        let error = v4_error(&body);
        assert!(error.starts_with("bad.jsonl:3: "), "{k}: {error}");
        assert!(error.contains(expected), "{k}: {error}");
    }
    let half = 1u64 << 61;
    let error = v4_error(&format!(
        "{{\"event\":\"put\",\"id\":0,\"bytes\":{half}}}\n{{\"event\":\"put\",\"id\":1,\"bytes\":{half}}}\n{{\"event\":\"put\",\"id\":2,\"bytes\":1}}"
    ));
    assert!(error.starts_with("bad.jsonl:4: out of range"), "{error}");
    let error = v4_error(&format!(
        "{{\"event\":\"put\",\"id\":0,\"bytes\":{}}}",
        u64::MAX
    ));
    assert!(error.starts_with("bad.jsonl:2: out of range"), "{error}");
    let error = v4_error(&format!(
        "{put}\n{{\"event\":\"apply\",\"op\":\"x\",\"inputs\":[0],\"outputs\":[{{\"id\":1,\"bytes\":4}}],\"cost\":{}}}",
        u64::MAX
    ));
    assert!(error.starts_with("bad.jsonl:3: out of range"), "{error}");
}

/// One op with 200,000 outputs reads in well under a second, and a
/// repeated id among them is found as fast.
#[test]
fn an_op_with_200000_outputs_reads_fast() {
    let outputs: Vec<String> = (1..=200_000)
        .map(|id| format!(r#"{{"id":{id},"bytes":4}}"#))
        .collect();
    let text = |outputs: &str| {
        format!(
            "{{\"format\":\"dtr-trace\",\"version\":3}}\n{{\"event\":\"put\",\"id\":0,\"bytes\":4}}\n\
             {{\"event\":\"apply\",\"op\":\"split\",\"inputs\":[0],\"outputs\":[{outputs}],\"cost\":1}}\n"
        )
    };
    let started = std::time::Instant::now();
    let trace = native::parse("wide.jsonl", &text(&outputs.join(","))).unwrap();
    assert_eq!(trace.tensor_count(), 200_001);
    let mut repeated = outputs.clone();
    repeated.push(r#"{"id":7,"bytes":4}"#.into());
    let error = native::parse("wide.jsonl", &text(&repeated.join(","))).unwrap_err();
    assert!(
        error.to_string().contains("output id 7 is repeated") || error.to_string().contains("7"),
        "{error}"
    );
    let seconds = started.elapsed().as_secs_f64();
    // Unoptimised test builds are slower; the bound is for quadratic work
    // (27 s before), not a benchmark.
    assert!(
        seconds < if cfg!(debug_assertions) { 10.0 } else { 1.0 },
        "{seconds} s"
    );
}

/// Reading a file that is not UTF-8 names the line and byte.
#[test]
fn a_trace_file_that_is_not_utf8_is_refused_with_its_position() {
    let dir = std::env::temp_dir().join(format!("dtr-utf8-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("bad.jsonl");
    let mut bytes = native_v4().into_bytes();
    let third = bytes
        .iter()
        .enumerate()
        .filter(|(_, &b)| b == b'\n')
        .nth(1)
        .unwrap()
        .0
        + 1;
    bytes[third + 4] = 0xff;
    std::fs::write(&path, bytes).unwrap();
    let error = dtr::trace::load(&path, None).unwrap_err().to_string();
    assert!(
        error.ends_with(
            "bad.jsonl:3: byte 5 of the line (0xff) is not UTF-8; traces are UTF-8 text"
        ),
        "{error}"
    );
    std::fs::remove_dir_all(dir).ok();
}
