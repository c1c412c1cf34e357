//! Elementwise maps, broadcasting, strided copies and reductions: tight
//! loops over slices that the compiler vectorises (built for AVX2 when the
//! host has it), cut into pieces for the backend's threads when large.
//!
//! Wider vectors never change a result: Rust does not fuse `a * b + c` into
//! an FMA or reorder float additions on its own, and every sum here adds in
//! an order fixed by the shape (see [`sum`]).

use std::mem::MaybeUninit;

use smallvec::SmallVec;

use super::math::{exp, tanh};
use super::parallel::{
    Threads, ELEMENTWISE_CHUNK, PARALLEL_MIN_ELEMENTS, PARALLEL_MIN_HEAVY_ELEMENTS as HEAVY,
};
use crate::ops::{BinaryOp, ReduceOp, ScalarOp, UnaryOp};
use crate::shape::Layout;

/// Runs `body` compiled with AVX2 enabled when the host supports it, so the
/// loops inlined into it use 256-bit vectors; elsewhere as it is.
#[inline(always)]
pub fn vectorized<R>(body: impl FnOnce() -> R) -> R {
    #[cfg(target_arch = "x86_64")]
    {
        #[target_feature(enable = "avx2")]
        fn avx2<R>(body: impl FnOnce() -> R) -> R {
            body()
        }
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the host has AVX2, checked just above.
            return unsafe { avx2(body) };
        }
    }
    body()
}

/// A new vector of `n` values, written by `fill(start, piece)` for
/// consecutive pieces (in parallel from `min` elements).
///
/// `fill` must write every element of its piece.
fn new_vec(
    threads: &Threads,
    (n, min): (usize, usize),
    chunk: usize,
    fill: impl Fn(usize, &mut [MaybeUninit<f32>]) + Sync + Send,
) -> Vec<f32> {
    let mut out = Vec::with_capacity(n);
    threads.for_each_chunk(
        &mut out.spare_capacity_mut()[..n],
        chunk,
        min,
        |i, piece| fill(i * chunk, piece),
    );
    // SAFETY: the pieces cover `0..n` and `fill` wrote each of their
    // elements (every caller below writes its whole piece).
    unsafe { out.set_len(n) };
    out
}

/// `f(x[i])` for every element, in parallel from `min` elements.
#[inline(always)]
fn map1(
    threads: &Threads,
    min: usize,
    x: &[f32],
    f: impl Fn(f32) -> f32 + Sync + Send,
) -> Vec<f32> {
    new_vec(
        threads,
        (x.len(), min),
        ELEMENTWISE_CHUNK,
        |start, piece| {
            let x = &x[start..start + piece.len()];
            vectorized(|| {
                for (o, &v) in piece.iter_mut().zip(x) {
                    o.write(f(v));
                }
            })
        },
    )
}

/// `f(x[i], y[i])` for every element, in parallel from `min` elements.
#[inline(always)]
fn map2(
    threads: &Threads,
    min: usize,
    x: &[f32],
    y: &[f32],
    f: impl Fn(f32, f32) -> f32 + Sync + Send,
) -> Vec<f32> {
    assert_eq!(x.len(), y.len());
    new_vec(
        threads,
        (x.len(), min),
        ELEMENTWISE_CHUNK,
        |start, piece| {
            let (x, y) = (
                &x[start..start + piece.len()],
                &y[start..start + piece.len()],
            );
            vectorized(|| {
                for ((o, &a), &b) in piece.iter_mut().zip(x).zip(y) {
                    o.write(f(a, b));
                }
            })
        },
    )
}

const SQRT_2_OVER_PI: f32 = 0.797_884_6;
const GELU_CUBIC: f32 = 0.044_715;

pub fn unary(threads: &Threads, op: UnaryOp, x: &[f32]) -> Vec<f32> {
    match op {
        UnaryOp::Neg => map1(threads, PARALLEL_MIN_ELEMENTS, x, |x| -x),
        UnaryOp::Exp => map1(threads, HEAVY, x, exp),
        UnaryOp::Log => map1(threads, HEAVY, x, f32::ln),
        UnaryOp::Sqrt => map1(threads, PARALLEL_MIN_ELEMENTS, x, f32::sqrt),
        UnaryOp::Relu => map1(threads, PARALLEL_MIN_ELEMENTS, x, |x| x.max(0.0)),
        UnaryOp::Gelu => map1(threads, HEAVY, x, |x| {
            0.5 * x * (1.0 + tanh(SQRT_2_OVER_PI * (x + GELU_CUBIC * x * x * x)))
        }),
        UnaryOp::Tanh => map1(threads, HEAVY, x, tanh),
        UnaryOp::Sigmoid => map1(threads, HEAVY, x, |x| 1.0 / (1.0 + exp(-x))),
    }
}

/// `saved` is the op's output or input, as [`UnaryOp::backward_uses_output`] says.
pub fn unary_backward(threads: &Threads, op: UnaryOp, grad: &[f32], saved: &[f32]) -> Vec<f32> {
    match op {
        UnaryOp::Neg => map2(threads, PARALLEL_MIN_ELEMENTS, grad, saved, |g, _| -g),
        UnaryOp::Exp => map2(threads, PARALLEL_MIN_ELEMENTS, grad, saved, |g, s| g * s),
        UnaryOp::Log => map2(threads, PARALLEL_MIN_ELEMENTS, grad, saved, |g, s| g / s),
        UnaryOp::Sqrt => map2(threads, PARALLEL_MIN_ELEMENTS, grad, saved, |g, s| {
            g / (2.0 * s)
        }),
        UnaryOp::Relu => map2(threads, PARALLEL_MIN_ELEMENTS, grad, saved, |g, s| {
            if s > 0.0 {
                g
            } else {
                0.0
            }
        }),
        UnaryOp::Gelu => map2(threads, HEAVY, grad, saved, |g, x| {
            let t = tanh(SQRT_2_OVER_PI * (x + GELU_CUBIC * x * x * x));
            let du = SQRT_2_OVER_PI * (1.0 + 3.0 * GELU_CUBIC * x * x);
            g * (0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * du)
        }),
        UnaryOp::Tanh => map2(threads, PARALLEL_MIN_ELEMENTS, grad, saved, |g, s| {
            g * (1.0 - s * s)
        }),
        UnaryOp::Sigmoid => map2(threads, PARALLEL_MIN_ELEMENTS, grad, saved, |g, s| {
            g * s * (1.0 - s)
        }),
    }
}

pub fn scalar(threads: &Threads, op: ScalarOp, x: &[f32], c: f32) -> Vec<f32> {
    match op {
        ScalarOp::Add => map1(threads, PARALLEL_MIN_ELEMENTS, x, |x| x + c),
        ScalarOp::Mul => map1(threads, PARALLEL_MIN_ELEMENTS, x, |x| x * c),
        ScalarOp::Pow => map1(threads, HEAVY, x, |x| x.powf(c)),
    }
}

/// Axes of a walk over several equally shaped strided operands, with
/// adjacent axes merged wherever every operand allows it and size-1 axes
/// dropped, so the last axis (the inner loop) is as long as it can be.
struct Walk<const K: usize> {
    /// All axes but the last.
    outer: SmallVec<[usize; 4]>,
    outer_strides: [SmallVec<[usize; 4]>; K],
    inner: usize,
    inner_strides: [usize; K],
    offsets: [usize; K],
}

impl<const K: usize> Walk<K> {
    fn new(dims: &[usize], layouts: [&Layout; K]) -> Walk<K> {
        let mut axes: SmallVec<[(usize, [usize; K]); 4]> = SmallVec::new();
        for (axis, &d) in dims.iter().enumerate() {
            if d == 1 {
                continue;
            }
            let strides: [usize; K] = std::array::from_fn(|k| layouts[k].strides[axis]);
            match axes.last_mut() {
                Some((len, last)) if (0..K).all(|k| last[k] == strides[k] * d) => {
                    *len *= d;
                    *last = strides;
                }
                _ => axes.push((d, strides)),
            }
        }
        let (inner, inner_strides) = axes.pop().unwrap_or((1, [0; K]));
        Walk {
            outer: axes.iter().map(|a| a.0).collect(),
            outer_strides: std::array::from_fn(|k| axes.iter().map(|a| a.1[k]).collect()),
            inner,
            inner_strides,
            offsets: std::array::from_fn(|k| layouts[k].offset),
        }
    }

    fn rows(&self) -> usize {
        self.outer.iter().product()
    }

    /// Calls `f(row, offsets)` for rows `start..end`, with each operand's
    /// offset of the row's first element.
    fn for_rows(&self, start: usize, end: usize, mut f: impl FnMut(usize, [usize; K])) {
        let rank = self.outer.len();
        let mut counter: SmallVec<[usize; 4]> = SmallVec::from_elem(0, rank);
        let mut offsets = self.offsets;
        let mut rest = start;
        for axis in (0..rank).rev() {
            counter[axis] = rest % self.outer[axis];
            rest /= self.outer[axis];
            for (offset, strides) in offsets.iter_mut().zip(&self.outer_strides) {
                *offset += counter[axis] * strides[axis];
            }
        }
        for row in start..end {
            f(row, offsets);
            for axis in (0..rank).rev() {
                counter[axis] += 1;
                for (offset, strides) in offsets.iter_mut().zip(&self.outer_strides) {
                    *offset += strides[axis];
                }
                if counter[axis] < self.outer[axis] {
                    break;
                }
                for (offset, strides) in offsets.iter_mut().zip(&self.outer_strides) {
                    *offset -= strides[axis] * self.outer[axis];
                }
                counter[axis] = 0;
            }
        }
    }

    /// A new row-major vector of the walk's elements, each row written by
    /// `fill(row offsets, row)`; rows are split over threads when large.
    fn collect(
        &self,
        threads: &Threads,
        fill: impl Fn([usize; K], &mut [MaybeUninit<f32>]) + Sync + Send,
    ) -> Vec<f32> {
        let (rows, inner) = (self.rows(), self.inner);
        let rows_per_piece = (ELEMENTWISE_CHUNK / inner.max(1)).max(1);
        new_vec(
            threads,
            (rows * inner, PARALLEL_MIN_ELEMENTS),
            rows_per_piece * inner,
            |start, piece| {
                let first = start / inner.max(1);
                let last = first + piece.len() / inner.max(1);
                self.for_rows(first, last, |row, offsets| {
                    let at = (row - first) * inner;
                    fill(offsets, &mut piece[at..at + inner]);
                });
            },
        )
    }
}

/// The elements of `layout` inside `buffer`, packed row-major.
pub fn gather(threads: &Threads, buffer: &[f32], layout: &Layout) -> Vec<f32> {
    let walk = Walk::new(&layout.dims, [layout]);
    let stride = walk.inner_strides[0];
    walk.collect(threads, |[offset], row| match stride {
        1 => {
            let src = &buffer[offset..offset + row.len()];
            for (o, &v) in row.iter_mut().zip(src) {
                o.write(v);
            }
        }
        _ => {
            for (j, o) in row.iter_mut().enumerate() {
                o.write(buffer[offset + j * stride]);
            }
        }
    })
}

/// `a op b` where both are views of the output's shape (stride 0 on
/// broadcast axes).
pub fn binary(
    threads: &Threads,
    op: BinaryOp,
    (a, la): (&[f32], &Layout),
    (b, lb): (&[f32], &Layout),
) -> Vec<f32> {
    match op {
        BinaryOp::Add => broadcast(threads, a, la, b, lb, |x, y| x + y),
        BinaryOp::Sub => broadcast(threads, a, la, b, lb, |x, y| x - y),
        BinaryOp::Mul => broadcast(threads, a, la, b, lb, |x, y| x * y),
        BinaryOp::Div => broadcast(threads, a, la, b, lb, |x, y| x / y),
    }
}

#[inline(always)]
fn broadcast(
    threads: &Threads,
    a: &[f32],
    la: &Layout,
    b: &[f32],
    lb: &Layout,
    f: impl Fn(f32, f32) -> f32 + Sync + Send + Copy,
) -> Vec<f32> {
    if la.is_contiguous() && lb.is_contiguous() && la.dims == lb.dims {
        let n = la.numel();
        return map2(
            threads,
            PARALLEL_MIN_ELEMENTS,
            &a[la.offset..la.offset + n],
            &b[lb.offset..lb.offset + n],
            f,
        );
    }
    let walk = Walk::new(&la.dims, [la, lb]);
    let [sa, sb] = walk.inner_strides;
    walk.collect(threads, |[oa, ob], row| {
        let n = row.len();
        vectorized(|| match (sa, sb) {
            (1, 1) => {
                for ((o, &x), &y) in row.iter_mut().zip(&a[oa..oa + n]).zip(&b[ob..ob + n]) {
                    o.write(f(x, y));
                }
            }
            (1, 0) => {
                let y = b[ob];
                for (o, &x) in row.iter_mut().zip(&a[oa..oa + n]) {
                    o.write(f(x, y));
                }
            }
            (0, 1) => {
                let x = a[oa];
                for (o, &y) in row.iter_mut().zip(&b[ob..ob + n]) {
                    o.write(f(x, y));
                }
            }
            _ => {
                for (j, o) in row.iter_mut().enumerate() {
                    o.write(f(a[oa + j * sa], b[ob + j * sb]));
                }
            }
        })
    })
}

/// Independent partial sums per row: enough to fill a vector register and
/// hide the add latency; the partials are then added in lane order.
const LANES: usize = 16;

/// Rows longer than this are summed block by block (block partials added
/// in order), so one long row can be split over threads with the same bits.
const SUM_BLOCK: usize = 1 << 13;

/// `Σ x` in a fixed order: [`LANES`] interleaved partial sums, then the
/// partials in lane order, then the tail. Depends only on `x.len()`.
#[inline(always)]
pub fn sum_lanes(x: &[f32]) -> f32 {
    let mut acc = [0.0f32; LANES];
    let chunks = x.chunks_exact(LANES);
    let tail = chunks.remainder();
    for c in chunks {
        for j in 0..LANES {
            acc[j] += c[j];
        }
    }
    let mut total = 0.0f32;
    for a in acc {
        total += a;
    }
    for &t in tail {
        total += t;
    }
    total
}

/// `Σ f(x[i])` in [`sum_lanes`]'s order.
#[inline(always)]
pub fn sum_lanes_of(x: &[f32], f: impl Fn(f32) -> f32) -> f32 {
    let mut acc = [0.0f32; LANES];
    let chunks = x.chunks_exact(LANES);
    let tail = chunks.remainder();
    for c in chunks {
        for j in 0..LANES {
            acc[j] += f(c[j]);
        }
    }
    let mut total = 0.0f32;
    for a in acc {
        total += a;
    }
    for &t in tail {
        total += f(t);
    }
    total
}

/// `max x` (−∞ when empty), lane by lane like [`sum_lanes`].
#[inline(always)]
pub fn max_lanes(x: &[f32]) -> f32 {
    let mut acc = [f32::NEG_INFINITY; LANES];
    let chunks = x.chunks_exact(LANES);
    let tail = chunks.remainder();
    for c in chunks {
        for j in 0..LANES {
            acc[j] = acc[j].max(c[j]);
        }
    }
    let mut best = f32::NEG_INFINITY;
    for a in acc {
        best = best.max(a);
    }
    for &t in tail {
        best = best.max(t);
    }
    best
}

/// One row's reduction: [`SUM_BLOCK`]-sized blocks reduced by the lane
/// kernels, the block results combined in order.
fn reduce_row(op: ReduceOp, row: &[f32]) -> f32 {
    let blocks = row.chunks(SUM_BLOCK);
    match op {
        ReduceOp::Max => blocks.map(max_lanes).fold(f32::NEG_INFINITY, f32::max),
        ReduceOp::Sum | ReduceOp::Mean => {
            let mut total = 0.0f32;
            for block in blocks {
                total += vectorized(|| sum_lanes(block));
            }
            total
        }
    }
}

/// Work (elements read) from which a reduction uses the pool.
const REDUCE_PARALLEL_MIN: usize = PARALLEL_MIN_ELEMENTS;

/// Output columns per task when reducing over a non-last axis.
const REDUCE_INNER_BLOCK: usize = 1 << 10;

/// Reduces the middle axis of a packed `(outer, len, inner)` tensor.
pub fn reduce(
    threads: &Threads,
    op: ReduceOp,
    x: &[f32],
    (outer, len, inner): (usize, usize, usize),
) -> Vec<f32> {
    let finish = |v: f32| match op {
        ReduceOp::Mean => v / len as f32,
        _ => v,
    };
    if inner == 1 {
        if outer == 1 && len > SUM_BLOCK {
            // One long row: its blocks in parallel, combined in order.
            let blocks = len.div_ceil(SUM_BLOCK);
            let partials = threads.map(blocks, len, REDUCE_PARALLEL_MIN, |i| {
                let block = &x[i * SUM_BLOCK..((i + 1) * SUM_BLOCK).min(len)];
                reduce_row(op, block)
            });
            let total = match op {
                ReduceOp::Max => partials.into_iter().fold(f32::NEG_INFINITY, f32::max),
                _ => partials.into_iter().fold(0.0f32, |acc, p| acc + p),
            };
            return vec![finish(total)];
        }
        let rows_per_piece = (ELEMENTWISE_CHUNK / len.max(1)).max(1);
        let mut out = vec![0.0f32; outer];
        threads.for_each_chunk(
            &mut out,
            rows_per_piece,
            REDUCE_PARALLEL_MIN / len.max(1),
            |i, piece| {
                for (r, o) in piece.iter_mut().enumerate() {
                    let row = (i * rows_per_piece + r) * len;
                    *o = finish(reduce_row(op, &x[row..row + len]));
                }
            },
        );
        return out;
    }
    // Columns reduce independently, each adding its rows in order.
    let mut out = vec![0.0f32; outer * inner];
    let block = REDUCE_INNER_BLOCK.min(inner);
    let per_outer = inner.div_ceil(block);
    let out_ptr = super::parallel::SharedMut::new(out.as_mut_ptr());
    threads.for_each(
        outer * per_outer,
        outer * len * inner,
        REDUCE_PARALLEL_MIN,
        |task| {
            let (o, start) = (task / per_outer, (task % per_outer) * block);
            let width = block.min(inner - start);
            // SAFETY: task (o, start) alone writes columns
            // `start..start + width` of output row `o`.
            let acc = unsafe {
                std::slice::from_raw_parts_mut(out_ptr.get().add(o * inner + start), width)
            };
            let row = |l: usize| {
                let at = (o * len + l) * inner + start;
                &x[at..at + width]
            };
            if len == 0 {
                acc.fill(finish(match op {
                    ReduceOp::Max => f32::NEG_INFINITY,
                    _ => 0.0,
                }));
                return;
            }
            acc.copy_from_slice(row(0));
            vectorized(|| {
                for l in 1..len {
                    let r = row(l);
                    match op {
                        ReduceOp::Max => acc.iter_mut().zip(r).for_each(|(a, &v)| *a = a.max(v)),
                        _ => acc.iter_mut().zip(r).for_each(|(a, &v)| *a += v),
                    }
                }
                if op == ReduceOp::Mean {
                    acc.iter_mut().for_each(|a| *a /= len as f32);
                }
            });
        },
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(n: usize, seed: usize) -> Vec<f32> {
        (0..n)
            .map(|i| ((i * 7919 + seed * 104_729) % 1009) as f32 / 100.0 - 5.0)
            .collect()
    }

    #[test]
    fn gather_follows_any_strides() {
        let threads = Threads::always_parallel(2);
        let buffer = data(2 * 3 * 5 + 1, 1);
        // [5, 3, 2] read from a [2, 3, 5] tensor at offset 1, axes reversed.
        let layout = Layout {
            dims: [5, 3, 2][..].into(),
            strides: [1, 5, 15][..].into(),
            offset: 1,
        };
        let mut want = vec![];
        layout.for_each_index(|i| want.push(buffer[i]));
        assert_eq!(gather(&threads, &buffer, &layout), want);
        // A large broadcast (stride 0) view, split over threads.
        let row = data(300, 2);
        let wide = Layout {
            dims: [400, 300][..].into(),
            strides: [0, 1][..].into(),
            offset: 0,
        };
        let got = gather(&threads, &row, &wide);
        assert!(got.chunks(300).all(|r| r == row.as_slice()));
    }

    #[test]
    fn broadcast_binary_matches_elementwise_definition() {
        let threads = Threads::always_parallel(3);
        let (a, b) = (data(257 * 129, 3), data(129, 4));
        let la = Layout::contiguous(&[257, 129]);
        let lb = Layout {
            dims: [257, 129][..].into(),
            strides: [0, 1][..].into(),
            offset: 0,
        };
        let got = binary(&threads, BinaryOp::Sub, (&a, &la), (&b, &lb));
        for (i, g) in got.iter().enumerate() {
            assert_eq!(g.to_bits(), (a[i] - b[i % 129]).to_bits());
        }
        // Column broadcast on the left: [257, 1] → [257, 129].
        let lc = Layout {
            dims: [257, 129][..].into(),
            strides: [1, 0][..].into(),
            offset: 0,
        };
        let c = data(257, 5);
        let got = binary(&threads, BinaryOp::Div, (&c, &lc), (&a, &la));
        for (i, g) in got.iter().enumerate() {
            assert_eq!(g.to_bits(), (c[i / 129] / a[i]).to_bits());
        }
    }

    #[test]
    fn reductions_match_a_double_precision_sum_and_repeat_bitwise() {
        for (outer, len, inner) in [
            (1, 1, 1),
            (3, 1, 1),
            (1, 100_003, 1),
            (7, 33, 1),
            (1, 1024, 128),
            (5, 13, 1500),
            (2, 0, 3),
        ] {
            let x = data(outer * len * inner, 6);
            for op in [ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max] {
                let first = reduce(&Threads::new(1).unwrap(), op, &x, (outer, len, inner));
                for threads in [2, 4] {
                    let again = reduce(
                        &Threads::always_parallel(threads),
                        op,
                        &x,
                        (outer, len, inner),
                    );
                    assert!(first
                        .iter()
                        .zip(&again)
                        .all(|(p, q)| p.to_bits() == q.to_bits()));
                }
                for o in 0..outer {
                    for i in 0..inner {
                        let values = (0..len).map(|l| x[(o * len + l) * inner + i] as f64);
                        let want = match op {
                            ReduceOp::Sum => values.sum::<f64>(),
                            ReduceOp::Mean => values.sum::<f64>() / len as f64,
                            ReduceOp::Max => values.fold(f64::NEG_INFINITY, f64::max),
                        };
                        let got = first[o * inner + i] as f64;
                        let tol = 1e-5 * (len as f64).max(1.0) * 5.0;
                        assert!(
                            (got - want).abs() <= tol
                                || (len == 0 && got.is_nan() == want.is_nan()),
                            "{op:?} ({outer}, {len}, {inner}) at ({o}, {i}): {got} vs {want}"
                        );
                    }
                }
            }
        }
    }
}
