//! Trace reading throughput, in MB/s of text parsed into a validated
//! [`Trace`](dtr::trace::Trace) (from memory: the file read is not timed).
//!
//! - `simrd`: the DTR authors' logs in `../shared/traces/dtr-prototype` (or
//!   `DTR_PROTOTYPE_TRACES`).
//! - `native`: dtr's JSON lines: the project's traces in `traces/` (with
//!   data and kernels), and each authors' log written as a native trace.
//!
//! Without the authors' logs it says so and measures the project's traces
//! only. `cargo bench --bench trace_read` (any divan flag after `--`, such
//! as a name filter).

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use divan::counter::{BytesCount, BytesFormat};
use divan::{Bencher, Divan};
use dtr::trace::{native, simrd};

/// A trace's text and the name it is benched under.
struct Input {
    name: String,
    text: String,
}

impl fmt::Display for Input {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({:.2} MB)", self.name, self.text.len() as f64 / 1e6)
    }
}

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn prototype_dir() -> PathBuf {
    std::env::var_os("DTR_PROTOTYPE_TRACES")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join("../shared/traces/dtr-prototype"))
}

/// The files in `dir` ending in `.extension`, sorted.
fn files(dir: &Path, extension: &str) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut paths: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == extension))
        .collect();
    paths.sort();
    paths
}

fn read(path: &Path) -> Input {
    // The authors' names end in a date: the model and batch say enough.
    let stem = path.file_stem().unwrap_or_default().to_string_lossy();
    let name = match stem.split_once('-') {
        Some((model, rest)) if path.extension().is_some_and(|e| e == "log") => {
            format!("{model}-{}", rest.split('-').next().unwrap_or(""))
        }
        _ => stem.into_owned(),
    };
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    Input { name, text }
}

fn simrd_logs() -> &'static [Input] {
    static LOGS: OnceLock<Vec<Input>> = OnceLock::new();
    LOGS.get_or_init(|| {
        files(&prototype_dir(), "log")
            .iter()
            .map(|p| read(p))
            .collect()
    })
}

fn native_traces() -> &'static [Input] {
    static TRACES: OnceLock<Vec<Input>> = OnceLock::new();
    TRACES.get_or_init(|| {
        let dir = root().join("traces");
        let mut traces: Vec<Input> = [dir.clone(), dir.join("torchvision")]
            .iter()
            .flat_map(|d| files(d, "jsonl"))
            .map(|p| read(&p))
            .collect();
        for log in simrd_logs() {
            let trace = simrd::parse(&log.name, &log.text).expect("the authors' logs import");
            traces.push(Input {
                name: format!("{} as dtr", log.name),
                text: native::to_string(&trace),
            });
        }
        traces
    })
}

#[divan::bench(args = simrd_logs())]
fn simrd(bencher: Bencher, input: &Input) {
    bencher
        .counter(BytesCount::new(input.text.len()))
        .bench(|| simrd::parse(&input.name, &input.text).expect("valid log"));
}

#[divan::bench(args = native_traces())]
fn native(bencher: Bencher, input: &Input) {
    bencher
        .counter(BytesCount::new(input.text.len()))
        .bench(|| native::parse(&input.name, &input.text).expect("valid trace"));
}

fn main() {
    if simrd_logs().is_empty() {
        eprintln!(
            "{} not found (set DTR_PROTOTYPE_TRACES): no simrd logs; \
             native traces from traces/ only",
            prototype_dir().display()
        );
    }
    Divan::default()
        .bytes_format(BytesFormat::Decimal)
        .config_with_args()
        .main();
}
