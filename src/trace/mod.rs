//! Op traces: record a program once, replay it under any budget and policy.
//!
//! A [`Trace`] is a validated list of events over dense tensor indices, each
//! with the line it came from. [`native`] reads and writes dtr's own JSON-lines
//! format (`docs/trace-format.md`), [`simrd`] imports the DTR authors' logs,
//! [`recorder`] writes a trace as an interpreter runs, and [`replay`] runs a
//! trace on an interpreter and computes its unbounded baseline.

mod ids;
mod lines;
pub mod native;
pub mod recorder;
pub mod replay;
pub mod simrd;

use std::path::Path;
use std::sync::Arc;

use smallvec::SmallVec;

use crate::error::{Error, Result};
use crate::intern::Interner;
use crate::ops::Op;
use crate::shape::Dims;

/// A tensor of a trace, numbered densely from 0 in order of creation.
pub type TraceTensor = u32;

/// One output of an [`TraceEvent::Apply`].
#[derive(Debug, Clone, PartialEq)]
pub struct TraceOutput {
    /// The tensor it makes.
    pub tensor: TraceTensor,
    /// Bytes allocated (0 for a view).
    pub bytes: u64,
    /// `Some(i)`: a view of input `i`'s storage.
    pub alias_of: Option<usize>,
    /// Its shape, when the trace records it (boxed: most traces have
    /// none, and there are millions of outputs).
    pub dims: Option<Box<Dims>>,
}

/// An op application in a trace. `kernel` is present when dtr can execute
/// the op on a data backend; the simulator needs only the sizes and `cost`.
#[derive(Debug, Clone, PartialEq)]
pub struct Apply {
    /// The op's name as recorded, shared among the events of one op name
    /// (by the trace builder).
    pub op: Arc<str>,
    /// The op as dtr runs it, if it has a kernel for it.
    pub kernel: Option<Box<Op>>,
    /// Its inputs, in order.
    pub inputs: SmallVec<[TraceTensor; 4]>,
    /// Its outputs, in order.
    pub outputs: Vec<TraceOutput>,
    /// Its recompute cost, in the trace's cost units.
    pub cost: u64,
    /// The model module that ran it, when the recorder knew (PyTorch's
    /// module path, such as `ResNet.layer1.0.conv1`).
    pub module: Option<Arc<str>>,
}

/// One instruction of a traced program.
// Kept small, 40 bytes (an apply and a put's shape and values boxed): a
// trace holds up to millions of events, most of them one tensor's id.
#[derive(Debug, Clone, PartialEq)]
pub enum TraceEvent {
    /// A tensor from outside (a parameter, an input, a constant).
    Put {
        /// The tensor it makes.
        tensor: TraceTensor,
        /// Bytes of its storage.
        bytes: u64,
        /// Its shape, when the trace records it.
        dims: Option<Box<Dims>>,
        /// Its values (row-major), when the trace records them.
        data: Option<Box<[f32]>>,
    },
    /// An op application.
    Apply(Box<Apply>),
    /// One more reference to a tensor.
    Retain {
        /// The tensor.
        tensor: TraceTensor,
    },
    /// One reference dropped.
    Del {
        /// The tensor.
        tensor: TraceTensor,
    },
    /// The program reads a tensor's value.
    Get {
        /// The tensor.
        tensor: TraceTensor,
    },
    /// Rematerialised if needed and kept resident until an `Unpin` (for good
    /// when none follows: the outputs of the authors' logs).
    Pin {
        /// The tensor.
        tensor: TraceTensor,
    },
    /// Releases one `Pin` of the tensor's storage.
    Unpin {
        /// The tensor.
        tensor: TraceTensor,
    },
    /// The tensor's history is cut; it becomes a root.
    Detach {
        /// The tensor.
        tensor: TraceTensor,
    },
}

/// A validated trace: every event refers to tensors that exist and are
/// referenced at that point.
#[derive(Debug, Clone, Default)]
pub struct Trace {
    /// Where it came from, for messages (`file` of `file:line`).
    pub source: String,
    /// The program, in order.
    pub events: Vec<TraceEvent>,
    /// Source line of each event.
    pub lines: Vec<usize>,
    /// Bytes of each tensor's storage (the aliased storage for views).
    pub storage_bytes: Vec<u64>,
    /// Whether each tensor is still referenced after the last event: an
    /// output of the program (see [`Trace::held_to_end`]).
    held_to_end: Vec<bool>,
}

impl Trace {
    /// Number of tensors the trace makes (puts and op outputs).
    pub fn tensor_count(&self) -> usize {
        self.storage_bytes.len()
    }

    /// Whether the program never releases `tensor`: it holds it to its end
    /// (an output, such as the gradients the authors' logs pin there).
    pub fn held_to_end(&self, tensor: TraceTensor) -> bool {
        self.held_to_end
            .get(tensor as usize)
            .copied()
            .unwrap_or(false)
    }

    /// `file:line: message` for event `index`.
    pub(crate) fn error_at(&self, index: usize, message: impl std::fmt::Display) -> Error {
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
    fn detect(text: &str) -> Option<TraceFormat> {
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

/// A JSON string borrowed from the text being read, or owned when it had
/// escapes (`Cow<str>`'s own `Deserialize` always copies).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Text<'a>(pub std::borrow::Cow<'a, str>);

impl std::ops::Deref for Text<'_> {
    type Target = str;

    fn deref(&self) -> &str {
        &self.0
    }
}

impl<'de: 'a, 'a> serde::Deserialize<'de> for Text<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct TextVisitor<'a>(std::marker::PhantomData<&'a str>);

        impl<'de: 'a, 'a> serde::de::Visitor<'de> for TextVisitor<'a> {
            type Value = Text<'a>;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a string")
            }

            fn visit_borrowed_str<E>(self, s: &'de str) -> Result<Text<'a>, E> {
                Ok(Text(std::borrow::Cow::Borrowed(s)))
            }

            fn visit_str<E>(self, s: &str) -> Result<Text<'a>, E> {
                Ok(Text(std::borrow::Cow::Owned(s.to_string())))
            }

            fn visit_string<E>(self, s: String) -> Result<Text<'a>, E> {
                Ok(Text(std::borrow::Cow::Owned(s)))
            }
        }

        deserializer.deserialize_str(TextVisitor(std::marker::PhantomData))
    }
}

/// Any JSON value, read through and dropped. Unlike
/// [`serde::de::IgnoredAny`], which skips a value without checking its
/// numbers' range or its strings' escapes, it reads the value as a
/// `serde_json::Value` would, so it refuses what that refuses.
pub(crate) struct ValidJson;

impl<'de> serde::Deserialize<'de> for ValidJson {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ValidVisitor;

        impl<'de> serde::de::Visitor<'de> for ValidVisitor {
            type Value = ValidJson;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("any JSON value")
            }

            fn visit_bool<E>(self, _: bool) -> Result<ValidJson, E> {
                Ok(ValidJson)
            }

            fn visit_i64<E>(self, _: i64) -> Result<ValidJson, E> {
                Ok(ValidJson)
            }

            fn visit_u64<E>(self, _: u64) -> Result<ValidJson, E> {
                Ok(ValidJson)
            }

            fn visit_f64<E>(self, _: f64) -> Result<ValidJson, E> {
                Ok(ValidJson)
            }

            fn visit_str<E>(self, _: &str) -> Result<ValidJson, E> {
                Ok(ValidJson)
            }

            fn visit_unit<E>(self) -> Result<ValidJson, E> {
                Ok(ValidJson)
            }

            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<ValidJson, A::Error> {
                while seq.next_element::<ValidJson>()?.is_some() {}
                Ok(ValidJson)
            }

            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<ValidJson, A::Error> {
                while map.next_entry::<ValidJson, ValidJson>()?.is_some() {}
                Ok(ValidJson)
            }
        }

        deserializer.deserialize_any(ValidVisitor)
    }
}

/// The non-blank lines of `text`, numbered from 1, split as [`str::lines`]
/// splits them (a `\r` before a `\n` is dropped), with a vectorised search
/// for each newline.
pub(crate) fn numbered_lines(text: &str) -> impl Iterator<Item = (usize, &str)> {
    let mut rest = text;
    let mut number = 0;
    std::iter::from_fn(move || loop {
        if rest.is_empty() {
            return None;
        }
        let line = match memchr::memchr(b'\n', rest.as_bytes()) {
            Some(end) => {
                let line = &rest[..end];
                rest = &rest[end + 1..];
                line.strip_suffix('\r').unwrap_or(line)
            }
            None => std::mem::take(&mut rest),
        };
        number += 1;
        // A line that starts with a visible ASCII character, as nearly all
        // do, is not blank: no need to trim it.
        let blank = match line.as_bytes().first() {
            Some(first) if first.is_ascii_graphic() => false,
            _ => line.trim().is_empty(),
        };
        if !blank {
            return Some((number, line));
        }
    })
}

/// Reads a trace file in the given format, or the detected one.
pub fn load(path: &Path, format: Option<TraceFormat>) -> Result<(Trace, TraceFormat)> {
    let source = path.display().to_string();
    let bytes =
        FileBytes::open(path).map_err(|e| Error::Trace(format!("{source}: cannot read: {e}")))?;
    let text = utf8_str(&source, &bytes)?;
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

/// A file's bytes: mapped for a regular file (no copy, and no fresh pages
/// to fault in: whole-process `dtr replay` on a 1 MB log spent about a
/// tenth of its time in `read`'s copy), read for anything else.
enum FileBytes {
    Mapped(memmap2::Mmap),
    Read(Vec<u8>),
}

impl FileBytes {
    fn open(path: &Path) -> std::io::Result<FileBytes> {
        let file = std::fs::File::open(path)?;
        if file.metadata()?.is_file() {
            // SAFETY: the map is read-only and private, and lives only while
            // the trace is parsed (the `Trace` borrows nothing from it). A
            // file changed by another process meanwhile could change these
            // bytes, as with any tool that maps its input (ripgrep, rustc's
            // metadata); traces are written once, before they are read.
            if let Ok(map) = unsafe { memmap2::Mmap::map(&file) } {
                return Ok(FileBytes::Mapped(map));
            }
        }
        let mut bytes = Vec::new();
        std::io::Read::read_to_end(&mut &file, &mut bytes)?;
        Ok(FileBytes::Read(bytes))
    }
}

impl std::ops::Deref for FileBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            FileBytes::Mapped(map) => map,
            FileBytes::Read(bytes) => bytes,
        }
    }
}

/// The text of a trace file, or an error naming the line and column of its
/// first byte that is not UTF-8.
pub fn utf8(source: &str, bytes: Vec<u8>) -> Result<String> {
    String::from_utf8(bytes).map_err(|error| not_utf8(source, error.as_bytes(), error.utf8_error()))
}

/// [`utf8`] on borrowed bytes.
fn utf8_str<'b>(source: &str, bytes: &'b [u8]) -> Result<&'b str> {
    std::str::from_utf8(bytes).map_err(|error| not_utf8(source, bytes, error))
}

fn not_utf8(source: &str, bytes: &[u8], error: std::str::Utf8Error) -> Error {
    let at = error.valid_up_to();
    let before = &bytes[..at];
    let line = 1 + memchr::memchr_iter(b'\n', before).count();
    let line_start = memchr::memrchr(b'\n', before).map_or(0, |i| i + 1);
    Error::Trace(format!(
        "{source}:{line}: byte {} of the line (0x{:02x}) is not UTF-8; traces are UTF-8 text",
        at - line_start + 1,
        bytes[at]
    ))
}

/// The largest total of sizes (and of costs) a trace may add up to: 2⁶²,
/// so that budgets, alignment and sums of live bytes never overflow.
const MAX_TOTAL: u64 = 1 << 62;

/// An output as a reader gives it to [`TraceBuilder::apply`]: bytes,
/// the input it is a view of, dims.
pub(crate) type OutputSpec = (u64, Option<usize>, Option<Dims>);

/// Builds a [`Trace`], checking each event as it is added: the readers
/// resolve their own ids and names, then report here in dense indices.
#[derive(Debug)]
pub(crate) struct TraceBuilder {
    trace: Trace,
    /// References held on each tensor.
    refs: Vec<u32>,
    /// Where each tensor's last reference was dropped.
    released_at: Vec<Option<usize>>,
    /// Each tensor's storage, named by the tensor that allocated it.
    storage_of: Vec<TraceTensor>,
    /// Pins held on each storage (indexed by its allocating tensor), as the
    /// interpreter counts them: an `unpin` needs one.
    pins: Vec<u32>,
    /// Sums of every size allocated and every cost, checked against [`MAX_TOTAL`].
    total_bytes: u64,
    total_cost: u64,
    /// Each tensor's dims where known, kept once the first kernel appears
    /// (to check kernels against their inputs; traces without kernels
    /// never pay for it).
    shapes: Option<Vec<Option<Dims>>>,
    /// The op and module names seen, each held once and shared by the events.
    names: Interner<str>,
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
            storage_of: Vec::new(),
            pins: Vec::new(),
            total_bytes: 0,
            total_cost: 0,
            shapes: None,
            names: Interner::default(),
        }
    }

    /// The shared copy of `name`.
    fn intern(&mut self, name: &str) -> Arc<str> {
        self.names.get(name, || name.into())
    }

    /// Makes room for about `events` events (and as many tensors) at once,
    /// instead of growing (and copying) the lists as they fill. Untouched
    /// room costs no memory until used, so an estimate from above is fine.
    pub fn reserve(&mut self, events: usize) {
        self.trace.events.reserve(events);
        self.trace.lines.reserve(events);
        self.trace.storage_bytes.reserve(events);
        self.refs.reserve(events);
        self.released_at.reserve(events);
        self.storage_of.reserve(events);
        self.pins.reserve(events);
    }

    pub fn finish(mut self) -> Trace {
        self.trace.held_to_end = self.refs.iter().map(|&refs| refs > 0).collect();
        self.trace.events.shrink_to_fit();
        self.trace.lines.shrink_to_fit();
        self.trace.storage_bytes.shrink_to_fit();
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
        match self.released_on(tensor) {
            Some(at) => Err(self.fail(
                line,
                format!("{label} is used after its last reference was released on line {at}"),
            )),
            None => Ok(()),
        }
    }

    /// The line that dropped the last reference to `tensor`, if none is left.
    fn released_on(&self, tensor: TraceTensor) -> Option<usize> {
        match self.released_at[tensor as usize] {
            Some(at) if self.refs[tensor as usize] == 0 => Some(at),
            _ => None,
        }
    }

    /// A new tensor: of a fresh storage, or (`view_of`) of another's.
    fn new_tensor(
        &mut self,
        storage_bytes: u64,
        view_of: Option<TraceTensor>,
        dims: Option<&Dims>,
    ) -> TraceTensor {
        let tensor = self.trace.storage_bytes.len() as TraceTensor;
        self.trace.storage_bytes.push(storage_bytes);
        self.refs.push(1);
        self.released_at.push(None);
        self.storage_of
            .push(view_of.map_or(tensor, |t| self.storage_of[t as usize]));
        self.pins.push(0);
        if let Some(shapes) = &mut self.shapes {
            shapes.push(dims.cloned());
        }
        tensor
    }

    /// Adds `bytes` allocated and `cost` spent to the totals; past
    /// [`MAX_TOTAL`] the sizes are out of range.
    fn count(&mut self, line: usize, bytes: u64, cost: u64) -> Result<()> {
        let (Some(total_bytes), Some(total_cost)) = (
            self.total_bytes
                .checked_add(bytes)
                .filter(|&t| t <= MAX_TOTAL),
            self.total_cost
                .checked_add(cost)
                .filter(|&t| t <= MAX_TOTAL),
        ) else {
            return Err(self.fail(
                line,
                format!(
                    "out of range: the trace's sizes or costs add up past 2^62 \
                     (this line: {bytes} bytes, cost {cost})"
                ),
            ));
        };
        (self.total_bytes, self.total_cost) = (total_bytes, total_cost);
        Ok(())
    }

    /// Checks a kernel's attributes against its inputs' dims, where all
    /// are known (a transpose of an axis the input lacks, a convolution of
    /// stride 0, a fill too large to address: what no backend could run).
    fn check_kernel(
        &mut self,
        line: usize,
        op: &str,
        kernel: &Op,
        inputs: &[TraceTensor],
    ) -> Result<()> {
        if self.shapes.is_none() {
            self.shapes = Some(self.known_shapes());
        }
        let shapes = self.shapes.as_ref().expect("made above");
        let layouts: Option<Vec<crate::shape::Layout>> = inputs
            .iter()
            .map(|&t| {
                shapes[t as usize]
                    .as_deref()
                    .map(crate::shape::Layout::contiguous)
            })
            .collect();
        let Some(layouts) = layouts else {
            return Ok(());
        };
        let layouts: Vec<&crate::shape::Layout> = layouts.iter().collect();
        kernel
            .signature(&layouts)
            .map(|_| ())
            .map_err(|error| self.fail(line, format!("the kernel of `{op}` cannot run: {error}")))
    }

    /// Every tensor's dims so far, from the events.
    fn known_shapes(&self) -> Vec<Option<Dims>> {
        let mut shapes = vec![None; self.trace.storage_bytes.len()];
        for event in &self.trace.events {
            match event {
                TraceEvent::Put { tensor, dims, .. } => {
                    shapes[*tensor as usize] = dims.as_deref().cloned()
                }
                TraceEvent::Apply(apply) => {
                    for output in &apply.outputs {
                        shapes[output.tensor as usize] = output.dims.as_deref().cloned();
                    }
                }
                _ => {}
            }
        }
        shapes
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
        self.count(line, bytes, 0)?;
        let tensor = self.new_tensor(bytes, None, dims.as_ref());
        self.push(
            line,
            TraceEvent::Put {
                tensor,
                bytes,
                dims: dims.map(Box::new),
                data: data.map(Vec::into_boxed_slice),
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
        op: &str,
        kernel: Option<Box<Op>>,
        inputs: SmallVec<[TraceTensor; 4]>,
        outputs: &[OutputSpec],
        cost: u64,
        module: Option<&str>,
        labels: &dyn Fn(usize) -> String,
    ) -> Result<SmallVec<[TraceTensor; 2]>> {
        // Labels are formatted only for a message.
        for (i, &input) in inputs.iter().enumerate() {
            if self.released_on(input).is_some() {
                self.check_live(line, input, &labels(i))?;
            }
        }
        if let Some(kernel) = &kernel {
            self.check_kernel(line, op, kernel, &inputs)?;
        }
        let fresh_bytes = outputs
            .iter()
            .filter(|(_, alias_of, _)| alias_of.is_none())
            .try_fold(0u64, |sum, (bytes, _, _)| sum.checked_add(*bytes))
            .unwrap_or(u64::MAX);
        self.count(line, fresh_bytes, cost)?;
        let mut made = SmallVec::new();
        let mut specs = Vec::with_capacity(outputs.len());
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
            let tensor = self.new_tensor(storage_bytes, alias_of.map(|i| inputs[i]), dims.as_ref());
            made.push(tensor);
            specs.push(TraceOutput {
                tensor,
                bytes: if alias_of.is_some() { 0 } else { bytes },
                alias_of,
                dims: dims.map(Box::new),
            });
        }
        let (op, module) = (self.intern(op), module.map(|m| self.intern(m)));
        self.push(
            line,
            TraceEvent::Apply(Box::new(Apply {
                op,
                kernel,
                inputs,
                outputs: specs,
                cost,
                module,
            })),
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
        let storage = self.storage_of[tensor as usize] as usize;
        match event {
            TraceEvent::Pin { .. } => self.pins[storage] = self.pins[storage].saturating_add(1),
            TraceEvent::Unpin { .. } if self.pins[storage] == 0 => {
                return Err(self.fail(
                    line,
                    format!("unpin of {label}, which is not pinned (no `pin` holds its storage)"),
                ))
            }
            TraceEvent::Unpin { .. } => self.pins[storage] -= 1,
            // As the interpreter refuses it: a view shares its storage's
            // history, which only the storage's own tensor can cut.
            TraceEvent::Detach { .. } if storage != tensor as usize => {
                return Err(self.fail(
                    line,
                    format!(
                        "detach of {label}, a view of another tensor's storage \
                         (detach a contiguous copy)"
                    ),
                ))
            }
            _ => {}
        }
        self.push(line, event);
        Ok(())
    }
}
