//! Op traces: record a program once, replay it under any budget and policy.
//!
//! A [`Trace`] is a validated list of events over dense tensor indices, each
//! with the line it came from. [`native`] reads and writes dtr's own JSON-lines
//! format (`docs/trace-format.md`), [`simrd`] imports the DTR authors' logs,
//! [`recorder`] writes a trace as an interpreter runs, and [`replay`] runs a
//! trace on an interpreter and computes its unbounded baseline.

pub mod native;
pub mod recorder;
pub mod replay;
pub mod simrd;

use std::path::Path;

use smallvec::SmallVec;

use crate::error::{Error, Result};
use crate::ops::Op;
use crate::shape::Dims;

/// A tensor of a trace, numbered densely from 0 in order of creation.
pub type TraceTensor = u32;

/// One output of an [`TraceEvent::Apply`].
#[derive(Debug, Clone, PartialEq)]
pub struct TraceOutput {
    pub tensor: TraceTensor,
    /// Bytes allocated (0 for a view).
    pub bytes: u64,
    /// `Some(i)`: a view of input `i`'s storage.
    pub alias_of: Option<usize>,
    pub dims: Option<Dims>,
}

/// One instruction of a traced program.
// Most events of a trace are applies, so boxing them would save nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq)]
pub enum TraceEvent {
    /// A tensor from outside (a parameter, an input, a constant).
    Put {
        tensor: TraceTensor,
        bytes: u64,
        dims: Option<Dims>,
        data: Option<Vec<f32>>,
    },
    /// An op application. `kernel` is present when dtr can execute the op
    /// on a data backend; the simulator needs only the sizes and `cost`.
    Apply {
        op: String,
        kernel: Option<Op>,
        inputs: SmallVec<[TraceTensor; 4]>,
        outputs: SmallVec<[TraceOutput; 2]>,
        cost: u64,
        /// The model module that ran it, when the recorder knew (PyTorch's
        /// module path, such as `ResNet.layer1.0.conv1`).
        module: Option<String>,
    },
    /// One more reference to a tensor.
    Retain {
        tensor: TraceTensor,
    },
    /// One reference dropped.
    Del {
        tensor: TraceTensor,
    },
    /// The program reads a tensor's value.
    Get {
        tensor: TraceTensor,
    },
    /// Rematerialised if needed and kept resident until an `Unpin` (for good
    /// when none follows: the outputs of the authors' logs).
    Pin {
        tensor: TraceTensor,
    },
    Unpin {
        tensor: TraceTensor,
    },
    /// The tensor's history is cut; it becomes a root.
    Detach {
        tensor: TraceTensor,
    },
}

/// A validated trace: every event refers to tensors that exist and are
/// referenced at that point.
#[derive(Debug, Clone, Default)]
pub struct Trace {
    /// Where it came from, for messages (`file` of `file:line`).
    pub source: String,
    pub events: Vec<TraceEvent>,
    /// Source line of each event.
    pub lines: Vec<usize>,
    /// Bytes of each tensor's storage (the aliased storage for views).
    pub storage_bytes: Vec<u64>,
}

impl Trace {
    pub fn tensor_count(&self) -> usize {
        self.storage_bytes.len()
    }

    /// `file:line: message` for event `index`.
    pub fn error_at(&self, index: usize, message: impl std::fmt::Display) -> Error {
        Error::Trace(format!(
            "{}:{}: {message}",
            self.source,
            self.lines.get(index).copied().unwrap_or(0)
        ))
    }
}

/// Which reader a file needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TraceFormat {
    /// dtr's JSON lines with a versioned header.
    Native,
    /// The DTR authors' simulator logs.
    Simrd,
}

impl TraceFormat {
    /// Guesses from the first non-empty line.
    pub fn detect(text: &str) -> Option<TraceFormat> {
        let first = text.lines().find(|l| !l.trim().is_empty())?;
        if first.contains("\"format\"") && first.contains("dtr-trace") {
            Some(TraceFormat::Native)
        } else if first.contains("\"INSTRUCTION\"") {
            Some(TraceFormat::Simrd)
        } else {
            None
        }
    }
}

/// Reads a trace file in the given format, or the detected one.
pub fn load(path: &Path, format: Option<TraceFormat>) -> Result<(Trace, TraceFormat)> {
    let source = path.display().to_string();
    let text = std::fs::read_to_string(path)
        .map_err(|e| Error::Trace(format!("{source}: cannot read: {e}")))?;
    let format = match format.or_else(|| TraceFormat::detect(&text)) {
        Some(format) => format,
        None => {
            return Err(Error::Trace(format!(
                "{source}:1: not a dtr trace nor a DTR simulator log"
            )))
        }
    };
    let trace = match format {
        TraceFormat::Native => native::parse(&source, &text)?,
        TraceFormat::Simrd => simrd::parse(&source, &text)?,
    };
    Ok((trace, format))
}

/// Builds a [`Trace`], checking each event as it is added: the readers
/// resolve their own ids and names, then report here in dense indices.
#[derive(Debug)]
pub(crate) struct TraceBuilder {
    trace: Trace,
    /// References held on each tensor.
    refs: Vec<u32>,
    /// Where each tensor's last reference was dropped.
    released_at: Vec<Option<usize>>,
}

impl TraceBuilder {
    pub fn new(source: &str) -> TraceBuilder {
        TraceBuilder {
            trace: Trace {
                source: source.to_string(),
                ..Trace::default()
            },
            refs: Vec::new(),
            released_at: Vec::new(),
        }
    }

    pub fn finish(self) -> Trace {
        self.trace
    }

    fn fail(&self, line: usize, message: impl std::fmt::Display) -> Error {
        Error::Trace(format!("{}:{line}: {message}", self.trace.source))
    }

    /// Bytes of a tensor's storage.
    pub fn storage_bytes(&self, tensor: TraceTensor) -> u64 {
        self.trace.storage_bytes[tensor as usize]
    }

    pub fn refs(&self, tensor: TraceTensor) -> u32 {
        self.refs[tensor as usize]
    }

    /// Checks that `tensor` may be used on `line`; `label` names it for the message.
    pub fn check_live(
        &self,
        line: usize,
        tensor: TraceTensor,
        label: &dyn std::fmt::Display,
    ) -> Result<()> {
        match self.released_at[tensor as usize] {
            Some(at) if self.refs[tensor as usize] == 0 => Err(self.fail(
                line,
                format!("{label} is used after its last reference was released on line {at}"),
            )),
            _ => Ok(()),
        }
    }

    fn new_tensor(&mut self, storage_bytes: u64) -> TraceTensor {
        self.trace.storage_bytes.push(storage_bytes);
        self.refs.push(1);
        self.released_at.push(None);
        (self.trace.storage_bytes.len() - 1) as TraceTensor
    }

    fn push(&mut self, line: usize, event: TraceEvent) {
        self.trace.events.push(event);
        self.trace.lines.push(line);
    }

    pub fn put(
        &mut self,
        line: usize,
        bytes: u64,
        dims: Option<Dims>,
        data: Option<Vec<f32>>,
    ) -> Result<TraceTensor> {
        if let Some(dims) = &dims {
            let values = data.as_ref().map(Vec::len);
            match crate::shape::checked_numel(dims) {
                None => return Err(self.fail(line, format!("shape {dims:?} is too large"))),
                Some(numel) if values.is_some_and(|n| n != numel) => {
                    let message =
                        format!("put has {} values for shape {dims:?}", values.unwrap_or(0));
                    return Err(self.fail(line, message));
                }
                Some(_) => {}
            }
        }
        let tensor = self.new_tensor(bytes);
        self.push(
            line,
            TraceEvent::Put {
                tensor,
                bytes,
                dims,
                data,
            },
        );
        Ok(tensor)
    }

    /// Adds an op; `outputs` gives `(bytes, alias_of, dims)` per output and
    /// returns the new tensors. Inputs must be live.
    #[allow(clippy::too_many_arguments)] // one per field of the event, plus line and labels
    pub fn apply(
        &mut self,
        line: usize,
        op: String,
        kernel: Option<Op>,
        inputs: SmallVec<[TraceTensor; 4]>,
        outputs: &[(u64, Option<usize>, Option<Dims>)],
        cost: u64,
        module: Option<String>,
        labels: &dyn Fn(usize) -> String,
    ) -> Result<SmallVec<[TraceTensor; 2]>> {
        for (i, &input) in inputs.iter().enumerate() {
            self.check_live(line, input, &labels(i))?;
        }
        let mut made = SmallVec::new();
        let mut specs = SmallVec::new();
        for (k, (bytes, alias_of, dims)) in outputs.iter().cloned().enumerate() {
            if let Some(dims) = &dims {
                if crate::shape::checked_numel(dims).is_none() {
                    let message = format!("output {k} of `{op}`: shape {dims:?} is too large");
                    return Err(self.fail(line, message));
                }
            }
            let storage_bytes = match alias_of {
                Some(i) if i >= inputs.len() => {
                    return Err(self.fail(
                        line,
                        format!(
                            "output {k} of `{op}` aliases input {i}, but it has {} inputs",
                            inputs.len()
                        ),
                    ))
                }
                Some(i) => self.storage_bytes(inputs[i]),
                None => bytes,
            };
            let tensor = self.new_tensor(storage_bytes);
            made.push(tensor);
            specs.push(TraceOutput {
                tensor,
                bytes: if alias_of.is_some() { 0 } else { bytes },
                alias_of,
                dims,
            });
        }
        self.push(
            line,
            TraceEvent::Apply {
                op,
                kernel,
                inputs,
                outputs: specs,
                cost,
                module,
            },
        );
        Ok(made)
    }

    pub fn retain(
        &mut self,
        line: usize,
        tensor: TraceTensor,
        label: &dyn std::fmt::Display,
    ) -> Result<()> {
        self.check_live(line, tensor, label)?;
        self.refs[tensor as usize] += 1;
        self.push(line, TraceEvent::Retain { tensor });
        Ok(())
    }

    pub fn del(
        &mut self,
        line: usize,
        tensor: TraceTensor,
        label: &dyn std::fmt::Display,
    ) -> Result<()> {
        self.check_live(line, tensor, label)?;
        self.refs[tensor as usize] -= 1;
        if self.refs[tensor as usize] == 0 {
            self.released_at[tensor as usize] = Some(line);
        }
        self.push(line, TraceEvent::Del { tensor });
        Ok(())
    }

    /// Adds an event that uses a live tensor: `Get`, `Pin`, `Unpin` or `Detach`.
    pub fn read(
        &mut self,
        line: usize,
        event: TraceEvent,
        label: &dyn std::fmt::Display,
    ) -> Result<()> {
        let (TraceEvent::Get { tensor }
        | TraceEvent::Pin { tensor }
        | TraceEvent::Unpin { tensor }
        | TraceEvent::Detach { tensor }) = event
        else {
            unreachable!("read() takes get, pin, unpin or detach");
        };
        self.check_live(line, tensor, label)?;
        self.push(line, event);
        Ok(())
    }
}
