//! The GPU backend: WGSL compute kernels (`shaders/`) through wgpu.
//!
//! In counter memory every storage owns a device buffer, taken from a pool
//! of freed buffers of the same size. In arena memory every storage is the
//! range of one device buffer at the offset the interpreter's allocator
//! chose, so the budget governs device addresses for real: evicting frees
//! the range, rematerialising writes it again (all bindings are then
//! read_write, since wgpu forbids binding one buffer read-only and
//! read_write in the same dispatch). Ops are encoded into one command encoder and submitted in batches
//! without waiting: only [`Backend::read`] waits for the GPU. Elementwise
//! kernels read strided inputs directly (views and broadcasting cost no
//! copy); other kernels take packed inputs, made by a strided copy kernel
//! when a view is not packed.
//!
//! Errors never panic: wgpu validation and out-of-memory errors are caught
//! (an uncaptured-error handler, and error scopes around allocation) and
//! returned as [`Error::Backend`]; a bad index in an embedding or
//! cross-entropy sets a device-side flag reported at the next read.

mod kernels;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use smallvec::{smallvec, SmallVec};
use wgpu::util::DeviceExt;

use super::{Backend, BufferView};
use crate::error::{Error, Result};
use crate::memory::Block;
use crate::ops::{Op, Signature};
use crate::shape::Layout;

use kernels::Kernel;

/// Dispatches encoded before the batch is submitted.
const BATCH: usize = 64;

fn fail(message: impl Into<String>) -> Error {
    Error::backend("wgpu", message)
}

/// How to pick the device.
#[derive(Debug, Clone)]
pub struct WgpuOptions {
    /// Use the first adapter whose name contains this (case-insensitive);
    /// `None` takes the system's default adapter.
    pub adapter: Option<String>,
    /// Graphics APIs to look on; by default Vulkan, Metal and DX12.
    pub backends: wgpu::Backends,
}

impl Default for WgpuOptions {
    fn default() -> WgpuOptions {
        WgpuOptions {
            adapter: None,
            backends: wgpu::Backends::PRIMARY,
        }
    }
}

/// Where one storage's bytes are on the device.
#[derive(Debug)]
pub enum WgpuBuffer {
    /// A pooled buffer of its own (counter memory).
    Owned(wgpu::Buffer),
    /// Bytes `offset..offset + size` of the backend's arena buffer (arena
    /// memory: the interpreter's allocator chose the offset).
    Range {
        /// Start in the arena buffer, in bytes.
        offset: u64,
        /// Length in bytes.
        size: u64,
    },
}

/// A range of a device buffer, as bound to a kernel.
#[derive(Debug, Clone)]
pub(crate) struct Slice {
    buffer: wgpu::Buffer,
    offset: u64,
    size: u64,
}

impl Slice {
    fn whole(buffer: &wgpu::Buffer) -> Slice {
        Slice {
            buffer: buffer.clone(),
            offset: 0,
            size: buffer.size(),
        }
    }
}

/// Runs ops as WGSL compute kernels on one GPU adapter, through wgpu.
pub struct WgpuBackend {
    /// The adapter's device-local memory, where the platform tells it.
    memory_bytes: Option<u64>,
    device: wgpu::Device,
    queue: wgpu::Queue,
    info: wgpu::AdapterInfo,
    /// By kernel and whether every binding is read_write (arena memory:
    /// wgpu forbids binding one buffer both read-only and read_write in a
    /// dispatch, and there inputs and outputs share the arena buffer).
    pipelines: HashMap<(Kernel, bool), wgpu::ComputePipeline>,
    modules: HashMap<(&'static str, bool), wgpu::ShaderModule>,
    encoder: Option<wgpu::CommandEncoder>,
    encoded: usize,
    /// Freed buffers by size, reused before creating new ones.
    free: HashMap<u64, Vec<wgpu::Buffer>>,
    /// Scratch buffers of the batch being encoded (packed copies, row losses).
    scratch: Vec<wgpu::Buffer>,
    /// Device-side flag set by kernels that meet a bad index.
    status: wgpu::Buffer,
    /// The one buffer arena memory places storages in; grown on demand.
    arena: Option<wgpu::Buffer>,
    /// The first error wgpu reported outside an error scope.
    uncaptured: Arc<Mutex<Option<String>>>,
}

impl WgpuBackend {
    /// Opens the chosen adapter; a missing adapter is an error, never a panic.
    pub fn new(options: &WgpuOptions) -> Result<WgpuBackend> {
        let mut descriptor = wgpu::InstanceDescriptor::new_without_display_handle();
        descriptor.backends = options.backends;
        let instance = wgpu::Instance::new(descriptor);
        let adapter = match &options.adapter {
            Some(wanted) => {
                let adapters = pollster::block_on(instance.enumerate_adapters(options.backends));
                let names: Vec<String> = adapters.iter().map(|a| a.get_info().name).collect();
                adapters
                    .into_iter()
                    .find(|a| {
                        a.get_info()
                            .name
                            .to_lowercase()
                            .contains(&wanted.to_lowercase())
                    })
                    .ok_or_else(|| {
                        fail(format!(
                            "no GPU adapter matches `{wanted}`; found: {names:?}"
                        ))
                    })?
            }
            None => pollster::block_on(
                instance.request_adapter(&wgpu::RequestAdapterOptions::default()),
            )
            .map_err(|e| {
                fail(format!(
                    "no GPU adapter found ({e}); use the CPU backend, or install a Vulkan driver"
                ))
            })?,
        };
        let descriptor = wgpu::DeviceDescriptor {
            label: Some("dtr"),
            required_limits: adapter.limits(),
            ..wgpu::DeviceDescriptor::default()
        };
        let (device, queue) = pollster::block_on(adapter.request_device(&descriptor))
            .map_err(|e| fail(format!("cannot open {}: {e}", adapter.get_info().name)))?;
        let uncaptured = Arc::new(Mutex::new(None));
        let sink = uncaptured.clone();
        device.on_uncaptured_error(Arc::new(move |error: wgpu::Error| {
            let mut slot = sink.lock().unwrap_or_else(|p| p.into_inner());
            slot.get_or_insert_with(|| error.to_string());
        }));
        let status = device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: Some("dtr status"),
            contents: &[0u8; 4],
            usage: wgpu::BufferUsages::STORAGE
                | wgpu::BufferUsages::COPY_SRC
                | wgpu::BufferUsages::COPY_DST,
        });
        Ok(WgpuBackend {
            memory_bytes: device_local_bytes(&adapter),
            device,
            queue,
            info: adapter.get_info(),
            pipelines: HashMap::new(),
            modules: HashMap::new(),
            encoder: None,
            encoded: 0,
            free: HashMap::new(),
            scratch: Vec::new(),
            status,
            arena: None,
            uncaptured,
        })
    }

    /// The adapter in use.
    pub fn adapter_name(&self) -> &str {
        &self.info.name
    }

    fn check_uncaptured(&self) -> Result<()> {
        match self
            .uncaptured
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
            Some(message) => Err(fail(message)),
            None => Ok(()),
        }
    }

    /// A device buffer of at least `bytes`, from the pool or new.
    fn buffer(&mut self, bytes: u64) -> Result<wgpu::Buffer> {
        let size = bytes.max(4).div_ceil(4) * 4;
        if let Some(buffer) = self.free.get_mut(&size).and_then(Vec::pop) {
            return Ok(buffer);
        }
        self.create(size)
    }

    /// A new device buffer. Creation runs in error scopes, so running out of
    /// device memory is an error, not a panic.
    fn create(&mut self, size: u64) -> Result<wgpu::Buffer> {
        let limits = self.device.limits();
        let max = limits
            .max_storage_buffer_binding_size
            .min(limits.max_buffer_size);
        if size > max {
            return Err(fail(format!(
                "a {size}-byte tensor exceeds this device's storage binding limit of {max} bytes"
            )));
        }
        let memory = self.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let validation = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let buffer = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: None,
            size,
            usage: wgpu::BufferUsages::STORAGE
                | wgpu::BufferUsages::COPY_SRC
                | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let invalid = pollster::block_on(validation.pop());
        let exhausted = pollster::block_on(memory.pop());
        match invalid.or(exhausted) {
            Some(error) => Err(fail(format!("allocating {size} bytes: {error}"))),
            None => Ok(buffer),
        }
    }

    fn recycle(&mut self, buffer: WgpuBuffer) {
        if let WgpuBuffer::Owned(buffer) = buffer {
            self.free.entry(buffer.size()).or_default().push(buffer);
        }
    }

    /// The device range behind a storage.
    pub(crate) fn slice(&self, buffer: &WgpuBuffer) -> Slice {
        match buffer {
            WgpuBuffer::Owned(buffer) => Slice::whole(buffer),
            WgpuBuffer::Range { offset, size } => Slice {
                buffer: self.arena.clone().expect("ranges exist only with an arena"),
                offset: *offset,
                size: *size,
            },
        }
    }

    /// The arena range for `block`, growing the arena buffer (copying what
    /// it holds) when the block ends past it.
    fn place(&mut self, block: Block) -> Result<WgpuBuffer> {
        let alignment = self.device.limits().min_storage_buffer_offset_alignment as u64;
        if block.offset % alignment != 0 {
            return Err(fail(format!(
                "arena offset {} is not a multiple of this device's storage offset alignment {alignment}; \
                 use an arena alignment of at least {alignment}",
                block.offset
            )));
        }
        let size = block.size.max(4).div_ceil(4) * 4;
        let end = block.offset + size;
        let capacity = self.arena.as_ref().map_or(0, wgpu::Buffer::size);
        if end > capacity {
            // One buffer, as large as one binding may be: a budget past that
            // is refused by `create` with the device's limit in the message.
            let limits = self.device.limits();
            let max = limits
                .max_storage_buffer_binding_size
                .min(limits.max_buffer_size);
            let grown = end.max(capacity.saturating_mul(2)).min(max).max(end);
            let bigger = self.create(grown)?;
            if let Some(old) = self.arena.take() {
                let encoder = self.encoder.get_or_insert_with(|| {
                    self.device
                        .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                            label: Some("dtr batch"),
                        })
                });
                encoder.copy_buffer_to_buffer(&old, 0, &bigger, 0, capacity);
            }
            self.arena = Some(bigger);
        }
        Ok(WgpuBuffer::Range {
            offset: block.offset,
            size,
        })
    }

    /// A fresh buffer for `bytes`: at `at` in the arena, or from the pool.
    fn output(&mut self, bytes: u64, at: Option<Block>) -> Result<WgpuBuffer> {
        match at {
            Some(block) => self.place(block),
            None => Ok(WgpuBuffer::Owned(self.buffer(bytes)?)),
        }
    }

    fn pipeline(&mut self, kernel: Kernel) -> &wgpu::ComputePipeline {
        let writable = self.arena.is_some();
        if !self.pipelines.contains_key(&(kernel, writable)) {
            let (file, parts) = kernel.module();
            let module = self.modules.entry((file, writable)).or_insert_with(|| {
                let source = parts.concat();
                let source = if writable {
                    source.replace("var<storage, read>", "var<storage, read_write>")
                } else {
                    source
                };
                self.device
                    .create_shader_module(wgpu::ShaderModuleDescriptor {
                        label: Some(file),
                        source: wgpu::ShaderSource::Wgsl(source.into()),
                    })
            });
            let pipeline = self
                .device
                .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                    label: Some(kernel.entry_point()),
                    layout: None,
                    module,
                    entry_point: Some(kernel.entry_point()),
                    compilation_options: Default::default(),
                    cache: None,
                });
            self.pipelines.insert((kernel, writable), pipeline);
        }
        &self.pipelines[&(kernel, writable)]
    }

    /// Encodes one dispatch; `bindings` must be exactly the kernel's.
    fn dispatch(
        &mut self,
        kernel: Kernel,
        params: &[u32],
        bindings: &[(u32, &Slice)],
        groups: [u32; 3],
    ) {
        let params = self
            .device
            .create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: None,
                contents: bytemuck::cast_slice(if params.is_empty() { &[0u32] } else { params }),
                usage: wgpu::BufferUsages::STORAGE,
            });
        let layout = self.pipeline(kernel).get_bind_group_layout(0);
        let mut entries = vec![wgpu::BindGroupEntry {
            binding: 0,
            resource: params.as_entire_binding(),
        }];
        entries.extend(
            bindings
                .iter()
                .map(|(binding, slice)| wgpu::BindGroupEntry {
                    binding: *binding,
                    resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                        buffer: &slice.buffer,
                        offset: slice.offset,
                        size: std::num::NonZeroU64::new(slice.size),
                    }),
                }),
        );
        let bind_group = self.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: None,
            layout: &layout,
            entries: &entries,
        });
        let pipeline = self.pipeline(kernel).clone();
        let encoder = self.encoder.get_or_insert_with(|| {
            self.device
                .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                    label: Some("dtr batch"),
                })
        });
        {
            let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: None,
                timestamp_writes: None,
            });
            pass.set_pipeline(&pipeline);
            pass.set_bind_group(0, &bind_group, &[]);
            pass.dispatch_workgroups(groups[0], groups[1], groups[2]);
        }
        self.encoded += 1;
        if self.encoded >= BATCH {
            self.submit();
        }
    }

    /// Sends the encoded batch to the GPU without waiting for it.
    fn submit(&mut self) {
        if let Some(encoder) = self.encoder.take() {
            self.queue.submit([encoder.finish()]);
        }
        self.encoded = 0;
        for buffer in std::mem::take(&mut self.scratch) {
            self.recycle(WgpuBuffer::Owned(buffer));
        }
    }

    /// A packed (row-major, offset 0) slice with the view's elements:
    /// the view's own memory when it already is, else a scratch copy.
    pub(crate) fn packed(&mut self, view: BufferView<'_, WgpuBuffer>) -> Result<Slice> {
        let layout = view.layout;
        let slice = self.slice(view.buffer);
        if layout.is_contiguous() && layout.offset == 0 {
            return Ok(slice);
        }
        let out = Slice::whole(&self.buffer(layout.numel() as u64 * 4)?);
        self.copy(&slice, layout, &out, &Layout::contiguous(&layout.dims))?;
        self.scratch.push(out.buffer.clone());
        Ok(out)
    }

    /// Strided copy from `from` (as `source`) into `to` (as `target`), same dims.
    pub(crate) fn copy(
        &mut self,
        from: &Slice,
        source: &Layout,
        to: &Slice,
        target: &Layout,
    ) -> Result<()> {
        let params = kernels::strided_params(
            source.numel(),
            0,
            0.0,
            &source.dims,
            source,
            None,
            Some(target),
        )?;
        let groups = kernels::groups_for(source.numel() as u32);
        self.dispatch(Kernel::Copy, &params, &[(1, from), (3, to)], groups);
        Ok(())
    }
}

impl Drop for WgpuBackend {
    fn drop(&mut self) {
        self.submit();
    }
}

impl Backend for WgpuBackend {
    type Buffer = WgpuBuffer;

    fn name(&self) -> &'static str {
        "wgpu"
    }

    fn can_swap(&self) -> bool {
        true
    }

    fn device_memory_bytes(&self) -> Option<u64> {
        self.memory_bytes
    }

    fn upload(&mut self, data: &[f32], layout: &Layout, at: Option<Block>) -> Result<WgpuBuffer> {
        if data.len() != layout.numel() {
            return Err(Error::InvalidArgument(format!(
                "{} values given for a tensor of shape {:?}",
                data.len(),
                layout.dims.as_slice()
            )));
        }
        let buffer = self.output(data.len() as u64 * 4, at)?;
        if !data.is_empty() {
            // A queue write runs before the next submission's commands: send
            // the pending ones first, since they may still read this memory's
            // previous contents.
            self.submit();
            let slice = self.slice(&buffer);
            self.queue
                .write_buffer(&slice.buffer, slice.offset, bytemuck::cast_slice(data));
        }
        Ok(buffer)
    }

    fn allocate(&mut self, layout: &Layout, _bytes: u64, at: Option<Block>) -> Result<WgpuBuffer> {
        let buffer = self.output(layout.numel() as u64 * 4, at)?;
        let params = [layout.numel() as u32, 0, 0, 0f32.to_bits()];
        let slice = self.slice(&buffer);
        self.dispatch(
            Kernel::Fill,
            &params,
            &[(3, &slice)],
            kernels::groups_for(layout.numel() as u32),
        );
        Ok(buffer)
    }

    fn execute(
        &mut self,
        op: &Op,
        inputs: &[BufferView<'_, WgpuBuffer>],
        signature: &Signature,
        at: Option<&[Block]>,
    ) -> Result<SmallVec<[Option<WgpuBuffer>; 2]>> {
        let mut outputs: SmallVec<[Option<WgpuBuffer>; 2]> = smallvec![];
        let mut places = at.unwrap_or(&[]).iter();
        for spec in &signature.outputs {
            outputs.push(match spec.alias_of {
                Some(_) => None,
                None => Some(self.output(spec.layout.numel() as u64 * 4, places.next().copied())?),
            });
        }
        let result = kernels::encode(self, op, inputs, signature, &outputs);
        if let Err(error) = result.and_then(|()| self.check_uncaptured()) {
            for buffer in outputs.into_iter().flatten() {
                self.recycle(buffer);
            }
            return Err(error);
        }
        Ok(outputs)
    }

    fn read(&mut self, view: BufferView<'_, WgpuBuffer>) -> Result<Vec<f32>> {
        let n = view.layout.numel();
        let source = self.packed(view)?;
        let bytes = n as u64 * 4;
        let staging = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("dtr readback"),
            size: bytes + 4,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let encoder = self.encoder.get_or_insert_with(|| {
            self.device
                .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                    label: Some("dtr batch"),
                })
        });
        if bytes > 0 {
            encoder.copy_buffer_to_buffer(&source.buffer, source.offset, &staging, 4, bytes);
        }
        encoder.copy_buffer_to_buffer(&self.status, 0, &staging, 0, 4);
        self.submit();
        let (sender, receiver) = std::sync::mpsc::channel();
        staging.map_async(wgpu::MapMode::Read, .., move |result| {
            let _ = sender.send(result);
        });
        self.device
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| fail(format!("waiting for the GPU: {e}")))?;
        self.check_uncaptured()?;
        match receiver.recv() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(fail(format!("reading back: {e}"))),
            Err(_) => return Err(fail("reading back: the device was lost")),
        }
        let mapped = staging
            .slice(..)
            .get_mapped_range()
            .map_err(|e| fail(format!("reading back: {e}")))?;
        let words: &[u32] = bytemuck::cast_slice(&mapped);
        let flagged = words[0] != 0;
        let values: Vec<f32> = bytemuck::cast_slice(&words[1..]).to_vec();
        drop(mapped);
        staging.unmap();
        if flagged {
            self.queue.write_buffer(&self.status, 0, &[0u8; 4]);
            return Err(fail(
                "an embedding or cross-entropy index was not an integer in range",
            ));
        }
        Ok(values)
    }

    fn release(&mut self, buffer: WgpuBuffer) {
        self.recycle(buffer);
    }
}

/// The largest device-local memory heap, on Vulkan: WebGPU itself has no
/// memory query (gfx-rs/wgpu#2447), so this asks the driver through wgpu-hal.
/// Other platforms answer `None`.
#[cfg(not(target_arch = "wasm32"))]
fn device_local_bytes(adapter: &wgpu::Adapter) -> Option<u64> {
    const DEVICE_LOCAL: u32 = 0x1; // VK_MEMORY_HEAP_DEVICE_LOCAL_BIT
                                   // SAFETY: only reads the physical device's properties; nothing is
                                   // created or destroyed, and the guard outlives the call.
    let hal = unsafe { adapter.as_hal::<wgpu::hal::api::Vulkan>() }?;
    let instance = hal.shared_instance().raw_instance();
    // SAFETY: the physical device belongs to this instance.
    let properties =
        unsafe { instance.get_physical_device_memory_properties(hal.raw_physical_device()) };
    let count = (properties.memory_heap_count as usize).min(properties.memory_heaps.len());
    properties.memory_heaps[..count]
        .iter()
        .filter(|heap| heap.flags.as_raw() & DEVICE_LOCAL != 0)
        .map(|heap| heap.size)
        .max()
}

#[cfg(target_arch = "wasm32")]
fn device_local_bytes(_adapter: &wgpu::Adapter) -> Option<u64> {
    None
}
