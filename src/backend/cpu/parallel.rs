//! The CPU backend's threads, and the rule that keeps its results bitwise
//! reproducible: work is cut into pieces by the shape alone (never by the
//! thread count or by who finishes first), every output element is written
//! by one piece, and partial results are combined in a fixed order. Threads
//! only decide which piece runs where, so a kernel gives the same bits with
//! 1 thread or 16.

use std::sync::{Arc, Mutex};

use crate::error::{Error, Result};

/// Memory-bound work (copies, adds, relu, scaling, sums) below this many
/// elements stays on the calling thread. Handing work to the pool and
/// waiting for it costs about 8 µs on the 2-core development host
/// (`cargo bench --bench cpu_kernels`: a 32k-element relu takes 4 µs on the
/// caller, 11 µs split in two), and these ops stream 0.1–0.4 ns per
/// element, so only tensors of about 100 µs of work gain.
pub const PARALLEL_MIN_ELEMENTS: usize = 1 << 18;

/// The same for work with a transcendental function or several passes per
/// element (exp, tanh, GELU, softmax, layer norm, pooling windows), at
/// 1–3 ns per element.
pub const PARALLEL_MIN_HEAVY_ELEMENTS: usize = 1 << 15;

/// Elements per piece of elementwise work: large enough to amortise the
/// hand-off, small enough to balance.
pub const ELEMENTWISE_CHUNK: usize = 1 << 14;

/// A pool of `count` threads; with one thread there is no pool and every
/// kernel runs on the caller.
#[derive(Debug, Clone)]
pub struct Threads {
    pool: Option<Arc<rayon::ThreadPool>>,
    count: usize,
    /// Whether small work stays on the caller (tests turn this off so that
    /// small inputs take the parallel paths too).
    thresholds: bool,
    /// Buffers for kernels' temporaries (im2col matrices), kept between
    /// ops so a large temporary is not zeroed and faulted in on every call;
    /// at most one per thread. This workspace is outside the budget, like
    /// a GPU library's.
    scratch: Arc<Mutex<Vec<Vec<f32>>>>,
}

impl Threads {
    pub fn new(count: usize) -> Result<Threads> {
        if count == 0 {
            return Err(Error::InvalidArgument(
                "the CPU backend needs at least one thread".into(),
            ));
        }
        let pool = if count > 1 {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(count)
                .thread_name(|i| format!("dtr-cpu-{i}"))
                .build()
                .map_err(|e| Error::backend("cpu", format!("thread pool: {e}")))?;
            Some(Arc::new(pool))
        } else {
            None
        };
        Ok(Threads {
            pool,
            count,
            thresholds: true,
            scratch: Arc::default(),
        })
    }

    /// `count` threads that split work of any size.
    #[cfg(test)]
    pub fn always_parallel(count: usize) -> Threads {
        Threads {
            thresholds: false,
            ..Threads::new(count).unwrap()
        }
    }

    /// Runs `f` on a buffer of `len` elements holding whatever an earlier
    /// user left there: `f` must write before it reads.
    pub fn with_scratch<R>(&self, len: usize, f: impl FnOnce(&mut [f32]) -> R) -> R {
        let taken = self.scratch.lock().ok().and_then(|mut free| free.pop());
        let mut buffer = taken.unwrap_or_default();
        if buffer.len() < len {
            buffer.resize(len, 0.0);
        }
        let result = f(&mut buffer[..len]);
        if let Ok(mut free) = self.scratch.lock() {
            if free.len() < self.count {
                free.push(buffer);
            }
        }
        result
    }

    /// Every core the process may use.
    pub fn available() -> usize {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    }

    pub fn count(&self) -> usize {
        self.count
    }

    /// Whether work of `size` (elements, or whatever unit the caller's
    /// threshold is in) is worth handing to the pool.
    fn parallel(&self, size: usize, threshold: usize) -> Option<&rayon::ThreadPool> {
        self.pool
            .as_deref()
            .filter(|_| size >= threshold || !self.thresholds)
    }

    /// Runs `task(i)` for every `i` in `0..tasks`, on the pool when `size`
    /// reaches `threshold`. Tasks must write disjoint outputs.
    pub fn for_each(
        &self,
        tasks: usize,
        size: usize,
        threshold: usize,
        task: impl Fn(usize) + Sync + Send,
    ) {
        use rayon::prelude::*;
        match self.parallel(size, threshold) {
            Some(pool) if tasks > 1 => {
                pool.install(|| (0..tasks).into_par_iter().for_each(task));
            }
            _ => (0..tasks).for_each(task),
        }
    }

    /// Computes `task(i)` for every `i` in `0..tasks` and returns the
    /// results in index order (for partial sums combined afterwards).
    pub fn map<T: Send>(
        &self,
        tasks: usize,
        size: usize,
        threshold: usize,
        task: impl Fn(usize) -> T + Sync + Send,
    ) -> Vec<T> {
        use rayon::prelude::*;
        match self.parallel(size, threshold) {
            Some(pool) if tasks > 1 => {
                pool.install(|| (0..tasks).into_par_iter().map(task).collect())
            }
            _ => (0..tasks).map(task).collect(),
        }
    }

    /// Splits `out` into consecutive chunks of `chunk` elements (the last
    /// may be shorter) and runs `task(index, chunk)` on each, on the pool
    /// when `out` has at least `min_elements` elements.
    pub fn for_each_chunk<T: Send>(
        &self,
        out: &mut [T],
        chunk: usize,
        min_elements: usize,
        task: impl Fn(usize, &mut [T]) + Sync + Send,
    ) {
        use rayon::prelude::*;
        let chunk = chunk.max(1);
        match self.parallel(out.len(), min_elements) {
            Some(pool) if out.len() > chunk => pool.install(|| {
                out.par_chunks_mut(chunk)
                    .enumerate()
                    .for_each(|(i, c)| task(i, c))
            }),
            _ => out
                .chunks_mut(chunk)
                .enumerate()
                .for_each(|(i, c)| task(i, c)),
        }
    }
}

/// A raw pointer that tasks may share because each writes a disjoint part
/// of what it points to (the caller's proof obligation).
#[derive(Clone, Copy)]
pub struct SharedMut(*mut f32);

impl SharedMut {
    pub fn new(ptr: *mut f32) -> SharedMut {
        SharedMut(ptr)
    }

    /// The pointer (a method, so closures capture the `Sync` wrapper and
    /// not the bare pointer field).
    pub fn get(self) -> *mut f32 {
        self.0
    }
}

// SAFETY: only used by tasks that write disjoint elements; see each use.
unsafe impl Send for SharedMut {}
unsafe impl Sync for SharedMut {}
