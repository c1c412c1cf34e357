//! Records the program an interpreter runs as a native trace, line by line.

use std::io::Write;

use slotmap::SecondaryMap;

use super::native::TraceWriter;
use super::{TraceEvent, TraceOutput, TraceTensor};
use crate::graph::{Graph, TensorId};
use crate::interp::{Observer, RunEvent, TensorInstruction};
use crate::ops::{Op, Signature};

/// An [`Observer`] that writes every instruction of the program to a
/// native trace (the runtime's own work, evictions and recomputations, is
/// not part of the program).
/// Install it with [`crate::Interpreter::set_observer`]; end with
/// [`crate::Interpreter::finish_observer`], which reports write errors.
pub struct TraceRecorder<W: Write + Send> {
    writer: TraceWriter<W>,
    ids: SecondaryMap<TensorId, TraceTensor>,
    next: TraceTensor,
    /// The first write error; later events are dropped.
    error: Option<std::io::Error>,
}

impl<W: Write + Send> TraceRecorder<W> {
    /// Writes the header and starts recording into `out`.
    pub fn new(out: W) -> std::io::Result<TraceRecorder<W>> {
        Ok(TraceRecorder {
            writer: TraceWriter::new(out)?,
            ids: SecondaryMap::new(),
            next: 0,
            error: None,
        })
    }

    fn name(&mut self, tensor: TensorId) -> TraceTensor {
        let id = self.next;
        self.next += 1;
        self.ids.insert(tensor, id);
        id
    }

    fn emit(&mut self, event: TraceEvent) {
        if self.error.is_none() {
            if let Err(error) = self.writer.write(&event) {
                self.error = Some(error);
            }
        }
    }
}

impl<W: Write + Send> Observer for TraceRecorder<W> {
    fn observe(&mut self, event: &RunEvent<'_>, graph: &Graph) {
        match *event {
            RunEvent::Put {
                tensor,
                bytes,
                dims,
                data,
            } => self.put(tensor, bytes, dims, data),
            RunEvent::Apply {
                node,
                inputs,
                outputs,
            } => {
                let node = &graph.nodes[node];
                self.apply(node.op(), inputs, outputs, node.signature());
            }
            RunEvent::Instruction {
                instruction,
                tensor,
            } => self.instruction(instruction, tensor),
            _ => {}
        }
    }

    fn finish(&mut self) -> std::io::Result<()> {
        match self.error.take() {
            Some(error) => Err(error),
            None => self.writer.finish(),
        }
    }
}

impl<W: Write + Send> TraceRecorder<W> {
    fn put(&mut self, tensor: TensorId, bytes: u64, dims: &[usize], data: Option<&[f32]>) {
        let id = self.name(tensor);
        let dims = data.map(|_| Box::new(dims.into()));
        self.emit(TraceEvent::Put {
            tensor: id,
            bytes,
            dims,
            data: data.map(Box::from),
        });
    }

    fn apply(&mut self, op: &Op, inputs: &[TensorId], outputs: &[TensorId], signature: &Signature) {
        // A recorded op's layouts only describe bytes: its shapes are unknown.
        let shaped = !matches!(op, Op::Recorded(_));
        let inputs = inputs
            .iter()
            .map(|&t| self.ids.get(t).copied().unwrap_or(TraceTensor::MAX))
            .collect();
        let outputs = outputs
            .iter()
            .zip(&signature.outputs)
            .map(|(&t, spec)| TraceOutput {
                tensor: self.name(t),
                bytes: spec.bytes,
                alias_of: spec.alias_of,
                dims: shaped.then(|| Box::new(spec.layout.dims.clone())),
            })
            .collect();
        let (kernel, module) = match op {
            Op::Recorded(recorded) => (None, recorded.module.clone()),
            kernel => (Some(Box::new(kernel.clone())), None),
        };
        self.emit(TraceEvent::Apply(Box::new(super::Apply {
            op: op.name().into(),
            kernel,
            inputs,
            outputs,
            cost: signature.cost,
            module,
        })));
    }

    fn instruction(&mut self, instruction: TensorInstruction, tensor: TensorId) {
        let tensor = self.ids.get(tensor).copied().unwrap_or(TraceTensor::MAX);
        self.emit(match instruction {
            TensorInstruction::Retain => TraceEvent::Retain { tensor },
            TensorInstruction::Del => TraceEvent::Del { tensor },
            TensorInstruction::Get => TraceEvent::Get { tensor },
            TensorInstruction::Pin => TraceEvent::Pin { tensor },
            TensorInstruction::Unpin => TraceEvent::Unpin { tensor },
            TensorInstruction::Detach => TraceEvent::Detach { tensor },
        });
    }
}
