//! Both trace readers on hostile input: arbitrary bytes and mutated valid
//! traces give errors, never panics; a mutated trace that still parses
//! replays to a report or an error, never a panic.

use dtr::trace::replay::{replay, Kernels};
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
}

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
        }
    }
    lines.join("\n")
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
            replay_without_panic(&trace, budget);
        }
    }

    #[test]
    fn mutated_simrd_logs_never_panic(mutations in prop::collection::vec(mutation(), 1..6), budget in 0u64..1200) {
        if let Ok(trace) = simrd::parse("fuzz", &mutate(SIMRD, &mutations)) {
            replay_without_panic(&trace, budget);
        }
    }
}
