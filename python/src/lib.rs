//! `dtr._native`: the Rust DTR interpreter, driven from Python.
//!
//! This crate converts types and errors and nothing else. The interpreter
//! (scoring, eviction, locking, rematerialisation) is the `dtr` crate's; the
//! one thing added here is [`TorchBackend`], a backend whose buffers are
//! Python objects (torch storages) and whose `execute` asks the Python side
//! to re-run a recorded ATen call.

use std::sync::{Mutex, PoisonError};

use pyo3::create_exception;
use pyo3::exceptions::{PyOSError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use slotmap::{Key, KeyData};
use smallvec::SmallVec;

use dtr::backend::{Backend, BufferView};
use dtr::memory::Block;
use dtr::ops::{Op, RecordedOp, RecordedOutput, Signature};
use dtr::shape::Layout;
use dtr::trace::recorder::TraceRecorder;
use dtr::{Config, Error, Interpreter, TensorId};

create_exception!(
    _native,
    OutOfMemoryError,
    PyRuntimeError,
    "No eviction can make room: args are (message, context, requested_bytes, budget_bytes, in_use_bytes)."
);

/// A backend whose buffers live in Python: the host object's `execute(call,
/// buffers)` re-runs a recorded call and returns one buffer per output, and
/// `release(buffer)` frees one.
struct TorchBackend {
    host: Py<PyAny>,
    /// Outputs of a call the host has already run, handed over on that
    /// call's first `execute` (its inputs were resident, so it is the root).
    ran: Option<(u64, Vec<Py<PyAny>>)>,
    /// The Python exception behind the last failed `execute`, re-raised as
    /// itself instead of as a string.
    failure: Option<PyErr>,
    /// Calls whose nodes the interpreter has freed: the host may forget them.
    forgotten: Vec<u64>,
}

impl TorchBackend {
    fn no_host_data(what: &str) -> Error {
        Error::Backend {
            backend: "torch",
            message: format!("{what}: torch tensors enter through `adopt`"),
        }
    }
}

impl Backend for TorchBackend {
    type Buffer = Py<PyAny>;

    fn name(&self) -> &'static str {
        "torch"
    }

    fn upload(&mut self, _: &[f32], _: &Layout, _: Option<Block>) -> dtr::Result<Py<PyAny>> {
        Err(Self::no_host_data("upload"))
    }

    fn allocate(&mut self, _: &Layout, _: u64, _: Option<Block>) -> dtr::Result<Py<PyAny>> {
        Err(Self::no_host_data("allocate"))
    }

    fn execute(
        &mut self,
        op: &Op,
        inputs: &[BufferView<'_, Py<PyAny>>],
        signature: &Signature,
        _at: Option<&[Block]>,
    ) -> dtr::Result<SmallVec<[Option<Py<PyAny>>; 2]>> {
        let Op::Recorded(recorded) = op else {
            return Err(Error::Backend {
                backend: "torch",
                message: format!("`{}` is not a recorded torch call", op.name()),
            });
        };
        if matches!(&self.ran, Some((call, _)) if *call == recorded.call) {
            let (_, outputs) = self.ran.take().expect("matched above");
            return Ok(outputs.into_iter().map(Some).collect());
        }
        let result = Python::attach(|py| -> PyResult<Vec<Py<PyAny>>> {
            let buffers = PyList::new(py, inputs.iter().map(|view| view.buffer.clone_ref(py)))?;
            let outputs = self
                .host
                .call_method1(py, "execute", (recorded.call, buffers))?;
            outputs.extract(py)
        });
        match result {
            Ok(outputs) if outputs.len() == signature.outputs.len() => {
                Ok(outputs.into_iter().map(Some).collect())
            }
            Ok(outputs) => Err(Error::Backend {
                backend: "torch",
                message: format!(
                    "re-running `{}` gave {} outputs, not {}",
                    recorded.name,
                    outputs.len(),
                    signature.outputs.len()
                ),
            }),
            Err(error) => {
                let message = format!("re-running `{}` failed: {error}", recorded.name);
                self.failure = Some(error);
                Err(Error::Backend {
                    backend: "torch",
                    message,
                })
            }
        }
    }

    fn read(&mut self, _: BufferView<'_, Py<PyAny>>) -> dtr::Result<Vec<f32>> {
        Err(Error::Backend {
            backend: "torch",
            message: "torch tensors are read by torch".into(),
        })
    }

    fn release(&mut self, buffer: Py<PyAny>) {
        Python::attach(|py| {
            if let Err(error) = self.host.call_method1(py, "release", (buffer,)) {
                error.write_unraisable(py, None);
            }
        });
    }

    fn forget(&mut self, op: &Op) {
        if let Op::Recorded(recorded) = op {
            self.forgotten.push(recorded.call);
        }
    }

    fn made_constant(&mut self, tensor: TensorId) {
        // At once: the host must keep the buffer alive for the calls that
        // read it before the program can drop its last reference.
        Python::attach(|py| {
            if let Err(error) = self
                .host
                .call_method1(py, "made_constant", (handle(tensor),))
            {
                error.write_unraisable(py, None);
            }
        });
    }
}

fn handle(tensor: TensorId) -> u64 {
    tensor.data().as_ffi()
}

fn tensor_id(handle: u64) -> TensorId {
    // An unknown or stale handle finds no tensor: the interpreter then
    // reports `UnknownTensor` rather than panicking.
    TensorId::from(KeyData::from_ffi(handle))
}

/// The DTR interpreter over a Python host. One per `dtr.torch.budget` session.
///
/// Called from more than one thread: on CUDA, PyTorch runs the backward pass
/// on its own per-device thread, and the session's dispatch mode follows it
/// there. PyO3's borrow flag already serialises the `&mut self` methods (a
/// re-entrant or concurrent call raises instead of racing); the `Mutex` is
/// what makes the interpreter `Sync` for PyO3, and is never contended, since
/// every method reaches it through `&mut self` (`Mutex::get_mut`, no lock).
#[pyclass(module = "dtr._native")]
struct Engine {
    interp: Mutex<Interpreter<TorchBackend>>,
}

impl Engine {
    fn interp(&mut self) -> &mut Interpreter<TorchBackend> {
        // Never locked, so never poisoned; a poisoned one holds a usable value anyway.
        self.interp
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// A Python exception for an interpreter error: the host's own exception
    /// when a re-run failed, `OutOfMemoryError` with its figures, else
    /// `ValueError` for bad arguments and `RuntimeError` for the rest.
    fn error(&mut self, error: Error) -> PyErr {
        if let Some(failure) = self.interp().backend_mut().failure.take() {
            return failure;
        }
        match &error {
            Error::OutOfMemory {
                context,
                requested_bytes,
                budget_bytes,
                in_use_bytes,
                ..
            } => OutOfMemoryError::new_err((
                error.to_string(),
                context.clone(),
                *requested_bytes,
                *budget_bytes,
                *in_use_bytes,
            )),
            // No progress within the budget: as much an out-of-memory as
            // one no eviction can solve, and handled the same way.
            Error::Thrash { .. } => {
                let memory = self.interp().memory();
                OutOfMemoryError::new_err((
                    error.to_string(),
                    "recomputation".to_string(),
                    0u64,
                    memory.budget_bytes.unwrap_or(u64::MAX),
                    memory.in_use_bytes,
                ))
            }
            Error::InvalidArgument(_)
            | Error::UnknownTensor(_)
            | Error::UnknownHeuristic { .. } => PyValueError::new_err(error.to_string()),
            Error::Io { .. } => PyOSError::new_err(error.to_string()),
            _ => PyRuntimeError::new_err(error.to_string()),
        }
    }

    fn check<T>(&mut self, result: dtr::Result<T>) -> PyResult<T> {
        result.map_err(|error| self.error(error))
    }
}

#[pymethods]
impl Engine {
    /// `host` has `execute(call, buffers) -> list` and `release(buffer)`.
    /// `remat_memory_guard`: evict last what could not be rematerialised
    /// within the budget (see `dtr::Config::remat_memory_guard`).
    /// `min_evictable_bytes`: smaller storages are never evicted (see
    /// `dtr::Config::min_evictable_bytes`).
    #[new]
    /// `remat_ratio_limit`: raise once recomputation has cost this many
    /// times the ops' first runs (see `dtr::Config::remat_ratio_limit`).
    #[pyo3(signature = (host, budget_bytes=None, heuristic="dtr", seed=0, remat_memory_guard=true, min_evictable_bytes=0, remat_ratio_limit=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        host: Py<PyAny>,
        budget_bytes: Option<u64>,
        heuristic: &str,
        seed: u64,
        remat_memory_guard: bool,
        min_evictable_bytes: u64,
        remat_ratio_limit: Option<f64>,
    ) -> PyResult<Self> {
        let config = Config {
            remat_ratio_limit,
            ..Config::default()
        }
        .with_heuristic(heuristic)
        .with_seed(seed)
        .with_budget(budget_bytes.into())
        .with_remat_memory_guard(remat_memory_guard)
        .with_min_evictable_bytes(min_evictable_bytes)
        // Stock PyTorch frees what only the history here would keep.
        .with_constants_freed_by_detaching(true);
        let backend = TorchBackend {
            host,
            ran: None,
            failure: None,
            forgotten: Vec::new(),
        };
        let interp = Interpreter::new(backend, config).map_err(|e| match e {
            Error::UnknownHeuristic { .. } | Error::InvalidArgument(_) => {
                PyValueError::new_err(e.to_string())
            }
            other => PyRuntimeError::new_err(other.to_string()),
        })?;
        Ok(Engine {
            interp: Mutex::new(interp),
        })
    }

    /// Tracks a storage made outside dtr (a parameter, an input) as a
    /// constant of `nbytes`; returns its handle.
    fn adopt(&mut self, nbytes: u64, buffer: Py<PyAny>) -> PyResult<u64> {
        let result = self.interp().adopt(nbytes, buffer);
        self.check(result).map(handle)
    }

    /// Records call `call` (named `name`), which has just run over the
    /// resident `inputs` and made `outputs` of `nbytes` each, costing
    /// `cost`: makes room for the outputs by evicting, and returns their
    /// handles.
    /// `module` names the part of the model that ran it, for recorded traces.
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (call, name, inputs, outputs, nbytes, cost, module=None))]
    fn apply(
        &mut self,
        call: u64,
        name: String,
        inputs: Vec<u64>,
        outputs: Vec<Py<PyAny>>,
        nbytes: Vec<u64>,
        cost: u64,
        module: Option<String>,
    ) -> PyResult<Vec<u64>> {
        if outputs.len() != nbytes.len() {
            return Err(PyValueError::new_err(format!(
                "apply: {} outputs but {} sizes",
                outputs.len(),
                nbytes.len()
            )));
        }
        let op = Op::Recorded(RecordedOp {
            name: name.into(),
            cost: cost.max(1),
            outputs: nbytes
                .iter()
                .map(|&bytes| RecordedOutput {
                    bytes,
                    alias_of: None,
                })
                .collect(),
            call,
            module: module.map(Into::into),
        });
        let inputs: SmallVec<[TensorId; 4]> = inputs.into_iter().map(tensor_id).collect();
        self.interp().backend_mut().ran = Some((call, outputs));
        let result = self.interp().apply_op(op, &inputs);
        // Unused when the op failed before running.
        self.interp().backend_mut().ran = None;
        let outputs = self.check(result)?;
        Ok(outputs.into_iter().map(handle).collect())
    }

    /// Drops the user's handle: the storage is freed, or kept as history.
    fn release(&mut self, tensor: u64) -> PyResult<()> {
        let result = self.interp().del(tensor_id(tensor));
        self.check(result)
    }

    /// Rematerialises `tensor` if evicted and keeps it resident until `unpin`.
    fn pin(&mut self, tensor: u64) -> PyResult<()> {
        let result = self.interp().pin(tensor_id(tensor));
        self.check(result)
    }

    fn unpin(&mut self, tensor: u64) -> PyResult<()> {
        let result = self.interp().unpin(tensor_id(tensor));
        self.check(result)
    }

    /// Rematerialises `tensor` if it was evicted.
    fn ensure_resident(&mut self, tensor: u64) -> PyResult<()> {
        let result = self.interp().ensure_resident(tensor_id(tensor));
        self.check(result)
    }

    /// Evicts `tensor` now if it can be (recomputable, resident, not pinned
    /// or in use); returns whether it was.
    fn evict(&mut self, tensor: u64) -> PyResult<bool> {
        let result = self.interp().evict_now(tensor_id(tensor));
        self.check(result)
    }

    fn is_resident(&mut self, tensor: u64) -> PyResult<bool> {
        self.interp()
            .is_resident(tensor_id(tensor))
            .map_err(|e| PyValueError::new_err(e.to_string()))
    }

    /// Makes `tensor` a constant: materialised, never evicted, history cut.
    fn detach(&mut self, tensor: u64) -> PyResult<()> {
        let result = self.interp().detach(tensor_id(tensor));
        self.check(result)
    }

    /// Before `tensor` changes in place: materialises and detaches the
    /// nearest live tensors whose recomputation would read its old value
    /// (those computed from them recompute from them); returns them.
    fn preserve_dependents(&mut self, tensor: u64) -> PyResult<Vec<u64>> {
        let result = self.interp().preserve_dependents(tensor_id(tensor));
        self.check(result)
            .map(|detached| detached.into_iter().map(handle).collect())
    }

    /// The bytes `preserve_dependents` would make constants of now: what a
    /// copy of `tensor` for its history (`redirect_reads`) saves when smaller.
    fn bytes_preserving_dependents(&mut self, tensor: u64) -> PyResult<u64> {
        let result = self.interp().bytes_preserving_dependents(tensor_id(tensor));
        self.check(result)
    }

    /// Before `from` changes in place: every op that reads it reads `to`, a
    /// constant copy of its value, instead.
    fn redirect_reads(&mut self, from: u64, to: u64) -> PyResult<()> {
        let result = self.interp().redirect_reads(tensor_id(from), tensor_id(to));
        self.check(result)
    }

    /// Starts writing every instruction the engine is given to the dtr trace
    /// at `path` (replayable with `dtr replay`).
    fn record(&mut self, path: std::path::PathBuf) -> PyResult<()> {
        let file = std::fs::File::create(&path).map_err(|error| {
            PyOSError::new_err(format!(
                "cannot write a trace to {}: {error}",
                path.display()
            ))
        })?;
        let recorder = TraceRecorder::new(std::io::BufWriter::new(file))
            .map_err(|error| PyOSError::new_err(format!("{}: {error}", path.display())))?;
        self.interp().set_observer(Box::new(recorder));
        Ok(())
    }

    /// Stops recording: flushes the trace and reports any write error.
    fn finish_record(&mut self) -> PyResult<()> {
        self.interp()
            .finish_observer()
            .map_err(|error| PyOSError::new_err(format!("writing the trace failed: {error}")))
    }

    /// Ends a training step: the next steps evict by this step's plan
    /// while they repeat it (see `Interpreter::mark_step`).
    fn mark_step(&mut self) -> PyResult<()> {
        let result = self.interp().mark_step();
        self.check(result)
    }

    /// Changes the budget (`None`: unbounded).
    fn set_budget(&mut self, budget_bytes: Option<u64>) {
        self.interp().set_budget_bytes(budget_bytes);
    }

    /// Calls whose records the host may drop: the interpreter freed their nodes.
    fn take_forgotten(&mut self) -> Vec<u64> {
        std::mem::take(&mut self.interp().backend_mut().forgotten)
    }

    /// The interpreter's counters and memory figures.
    fn stats<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let interp = self.interp();
        let stats = interp.stats();
        let memory = interp.memory();
        let dict = PyDict::new(py);
        dict.set_item("peak_bytes", memory.peak_bytes)?;
        dict.set_item("in_use_bytes", memory.in_use_bytes)?;
        dict.set_item("budget_bytes", memory.budget_bytes)?;
        dict.set_item("constant_peak_bytes", memory.constant_peak_bytes)?;
        dict.set_item("evictions", stats.evictions)?;
        dict.set_item("eager_evictions", stats.eager_evictions)?;
        dict.set_item("rematerializations", stats.rematerializations)?;
        dict.set_item("lock_relaxations", stats.lock_relaxations)?;
        dict.set_item("outputs_reserved_first", stats.outputs_reserved_first)?;
        dict.set_item("steps", stats.steps)?;
        dict.set_item("planned_steps", stats.planned_steps)?;
        dict.set_item("plan_repairs", stats.plan_repairs)?;
        dict.set_item("engine_ops", stats.ops)?;
        dict.set_item("compute_ns", stats.compute)?;
        dict.set_item("remat_compute_ns", stats.remat_compute)?;
        dict.set_item("tracked_tensors", interp.tracked_tensors())?;
        dict.set_item("heuristic", interp.heuristic_name())?;
        Ok(dict)
    }

    /// Checks the interpreter's invariants; raises `RuntimeError` naming the broken one.
    fn check_invariants(&mut self) -> PyResult<()> {
        self.interp()
            .check_invariants()
            .map_err(PyRuntimeError::new_err)
    }
}

/// `(name, description)` of every eviction heuristic `Engine` accepts.
#[pyfunction]
fn heuristics() -> Vec<(&'static str, &'static str)> {
    dtr::policy::POLICIES
        .iter()
        .filter(|policy| policy.is_heuristic())
        .map(|policy| (policy.name, policy.about))
        .collect()
}

/// Bytes from a size such as `"1.5GiB"`, `"800MB"` or `"4096"`; `ValueError` if it is not one.
#[pyfunction]
fn parse_bytes(text: &str) -> PyResult<u64> {
    dtr::parse_bytes(text).map_err(|error| PyValueError::new_err(error.to_string()))
}

/// Logs the engine's decisions to stderr when `DTR_LOG` is set, with
/// `RUST_LOG`'s syntax: `DTR_LOG=dtr::evict=debug,dtr::oom=warn`, say.
fn init_logging() {
    let Ok(filter) = std::env::var("DTR_LOG") else {
        return;
    };
    // A subscriber installed by someone else stays.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
        .with_writer(std::io::stderr)
        .try_init();
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    init_logging();
    m.add_class::<Engine>()?;
    m.add_function(wrap_pyfunction!(heuristics, m)?)?;
    m.add_function(wrap_pyfunction!(parse_bytes, m)?)?;
    m.add("OutOfMemoryError", m.py().get_type::<OutOfMemoryError>())?;
    Ok(())
}
