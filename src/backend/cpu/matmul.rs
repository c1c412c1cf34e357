//! Matrix products through the `gemm` crate, single-threaded per call: the
//! output is cut into row (or column) blocks by the shape alone and the
//! blocks run on the backend's threads, so the bits of a product do not
//! depend on the thread count (see [`super::parallel`]). Operands are read
//! through their strides, so transposed views are never copied.

use super::parallel::{SharedMut, Threads};
use crate::shape::Layout;

/// A product smaller than this many flops runs on the calling thread (about
/// 40 µs of GEMM on one core; the pool's hand-off costs about 8 µs).
pub const PARALLEL_MIN_FLOPS: usize = 1 << 22;

/// The smallest block of one product worth a task of its own, in flops.
const BLOCK_MIN_FLOPS: usize = 1 << 22;

/// At most this many blocks per product: enough to balance a few cores.
const MAX_BLOCKS: usize = 8;

/// Block sizes are multiples of this (the kernels' register tile height).
const BLOCK_ALIGN: usize = 16;

/// A matrix inside a buffer: element `(i, j)` sits at
/// `offset + i * row_stride + j * col_stride`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MatRef {
    pub offset: usize,
    pub rows: usize,
    pub cols: usize,
    pub row_stride: usize,
    pub col_stride: usize,
}

impl MatRef {
    /// A packed row-major `rows × cols` matrix at `offset`.
    pub fn row_major(offset: usize, rows: usize, cols: usize) -> MatRef {
        MatRef {
            offset,
            rows,
            cols,
            row_stride: cols,
            col_stride: 1,
        }
    }

    /// The same elements read as the transposed matrix.
    pub fn t(self) -> MatRef {
        MatRef {
            offset: self.offset,
            rows: self.cols,
            cols: self.rows,
            row_stride: self.col_stride,
            col_stride: self.row_stride,
        }
    }

    /// Rows `start..start + rows`.
    fn rows(self, start: usize, rows: usize) -> MatRef {
        MatRef {
            offset: self.offset + start * self.row_stride,
            rows,
            ..self
        }
    }

    /// Columns `start..start + cols`.
    fn cols(self, start: usize, cols: usize) -> MatRef {
        MatRef {
            offset: self.offset + start * self.col_stride,
            cols,
            ..self
        }
    }

    /// Whether every element lies inside a buffer of `len` elements.
    fn fits(&self, len: usize) -> bool {
        if self.rows == 0 || self.cols == 0 {
            return true;
        }
        let last = (self.rows - 1)
            .checked_mul(self.row_stride)
            .zip((self.cols - 1).checked_mul(self.col_stride))
            .and_then(|(r, c)| r.checked_add(c))
            .and_then(|rc| rc.checked_add(self.offset));
        last.is_some_and(|last| last < len)
    }
}

/// `out = a × b` (or `out += a × b` when `accumulate`), single-threaded.
/// `out` is row-major with rows `out_row_stride` apart, starting at
/// `out[0]`, and must hold `a.rows × b.cols` such rows.
///
/// # Panics
/// When the shapes disagree or a matrix reaches past its buffer.
pub fn gemm_into(
    out: &mut [f32],
    out_row_stride: usize,
    a: (&[f32], MatRef),
    b: (&[f32], MatRef),
    accumulate: bool,
) {
    let ((a_buf, a), (b_buf, b)) = (a, b);
    let out_ref = MatRef {
        offset: 0,
        rows: a.rows,
        cols: b.cols,
        row_stride: out_row_stride,
        col_stride: 1,
    };
    assert!(
        a.cols == b.rows && a.fits(a_buf.len()) && b.fits(b_buf.len()) && out_ref.fits(out.len()),
        "gemm_into: {a:?} × {b:?} into {out_ref:?} (buffers {}, {}, {})",
        a_buf.len(),
        b_buf.len(),
        out.len()
    );
    // SAFETY: the assert above keeps every access inside its slice, and
    // `out` is borrowed mutably for the call.
    unsafe {
        gemm_raw(
            out.as_mut_ptr(),
            out_row_stride,
            a_buf,
            a,
            b_buf,
            b,
            accumulate,
        )
    }
}

/// [`gemm_into`] on a raw output pointer.
///
/// # Safety
/// `out` must be valid for writes of the `a.rows × b.cols` elements at
/// `out + i * out_row_stride + j`, which nobody else touches during the call;
/// `a` and `b` must fit their buffers.
unsafe fn gemm_raw(
    out: *mut f32,
    out_row_stride: usize,
    a_buf: &[f32],
    a: MatRef,
    b_buf: &[f32],
    b: MatRef,
    accumulate: bool,
) {
    let (m, k, n) = (a.rows, a.cols, b.cols);
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        if !accumulate {
            for i in 0..m {
                std::slice::from_raw_parts_mut(out.add(i * out_row_stride), n).fill(0.0);
            }
        }
        return;
    }
    // dst = alpha · dst + beta · lhs × rhs; dst is read only when accumulating.
    ::gemm::gemm(
        m,
        n,
        k,
        out,
        1,
        out_row_stride as isize,
        accumulate,
        a_buf.as_ptr().add(a.offset),
        a.col_stride as isize,
        a.row_stride as isize,
        b_buf.as_ptr().add(b.offset),
        b.col_stride as isize,
        b.row_stride as isize,
        if accumulate { 1.0 } else { 0.0 },
        1.0,
        false,
        false,
        false,
        ::gemm::Parallelism::None,
    );
}

/// Lanes of [`row_dots`]' partial sums (one AVX2 register).
const DOT_LANES: usize = 8;

/// `out[i·n + j] (+)= a_i · b_j` for the rows `a_i` of `a` (`m × k`) and
/// `b_j` of `b` (`n × k`), both packed row-major: a product `A Bᵀ` whose
/// output is small and whose `k` is long (a convolution's weight gradient
/// sums over every output pixel). GEMM kernels tile the output and do
/// poorly here, so this blocks 4 × 2 dot products over [`DOT_LANES`]-wide
/// partial sums. Each dot product adds in the same order whatever block it
/// falls in: lanes, then the lanes in order, then the tail.
pub fn row_dots(
    out: &mut [f32],
    a: &[f32],
    b: &[f32],
    (m, k, n): (usize, usize, usize),
    accumulate: bool,
) {
    assert!(a.len() >= m * k && b.len() >= n * k && out.len() >= m * n);
    super::elementwise::vectorized(|| {
        let (m4, n2) = (m / 4 * 4, n / 2 * 2);
        for i in (0..m4).step_by(4) {
            for j in (0..n2).step_by(2) {
                dot_block::<4, 2>(out, a, b, (i, j), (k, n), accumulate);
            }
            for j in n2..n {
                dot_block::<4, 1>(out, a, b, (i, j), (k, n), accumulate);
            }
        }
        for i in m4..m {
            for j in 0..n {
                dot_block::<1, 1>(out, a, b, (i, j), (k, n), accumulate);
            }
        }
    })
}

#[inline(always)]
fn dot_block<const MI: usize, const NJ: usize>(
    out: &mut [f32],
    a: &[f32],
    b: &[f32],
    (i, j): (usize, usize),
    (k, n): (usize, usize),
    accumulate: bool,
) {
    type Lanes = [f32; DOT_LANES];
    let rows_a: [(&[Lanes], &[f32]); MI] =
        std::array::from_fn(|r| a[(i + r) * k..(i + r + 1) * k].as_chunks::<DOT_LANES>());
    let rows_b: [(&[Lanes], &[f32]); NJ] =
        std::array::from_fn(|c| b[(j + c) * k..(j + c + 1) * k].as_chunks::<DOT_LANES>());
    let mut acc = [[[0.0f32; DOT_LANES]; NJ]; MI];
    for chunk in 0..k / DOT_LANES {
        let va: [Lanes; MI] = std::array::from_fn(|r| rows_a[r].0[chunk]);
        let vb: [Lanes; NJ] = std::array::from_fn(|c| rows_b[c].0[chunk]);
        for r in 0..MI {
            for c in 0..NJ {
                for l in 0..DOT_LANES {
                    acc[r][c][l] += va[r][l] * vb[c][l];
                }
            }
        }
    }
    for r in 0..MI {
        for c in 0..NJ {
            let mut sum = 0.0f32;
            for lane in acc[r][c] {
                sum += lane;
            }
            for (x, y) in rows_a[r].1.iter().zip(rows_b[c].1) {
                sum += x * y;
            }
            let o = &mut out[(i + r) * n + j + c];
            *o = if accumulate { *o + sum } else { sum };
        }
    }
}

/// How one `m × k × n` product is cut: `(along_rows, block)`, from the
/// shape alone. The larger of `m` and `n` is split into blocks of at least
/// [`BLOCK_MIN_FLOPS`] work, at most [`MAX_BLOCKS`] of them.
fn blocking(m: usize, k: usize, n: usize) -> (bool, usize) {
    let along_rows = m >= n;
    let (len, other) = if along_rows { (m, n) } else { (n, m) };
    let flops_per_line = (2 * other * k).max(1);
    let min_block = BLOCK_MIN_FLOPS.div_ceil(flops_per_line);
    let block = min_block
        .max(len.div_ceil(MAX_BLOCKS))
        .next_multiple_of(BLOCK_ALIGN);
    (along_rows, block.min(len).max(1))
}

/// The batch of a matmul operand: one matrix per batch index, at the
/// offsets its layout gives (all at one offset when the operand is 2-D and
/// shared by every batch).
pub struct Operand<'a> {
    pub buffer: &'a [f32],
    pub matrix: MatRef,
    pub batch_offsets: Vec<usize>,
}

impl<'a> Operand<'a> {
    /// The last two axes of `layout` as matrices, one per index of its
    /// leading axes; `batch` matrices at one offset when it has none.
    pub fn new(buffer: &'a [f32], layout: &Layout, batch: usize) -> Operand<'a> {
        let rank = layout.rank();
        let matrix = MatRef {
            offset: 0,
            rows: layout.dims[rank - 2],
            cols: layout.dims[rank - 1],
            row_stride: layout.strides[rank - 2],
            col_stride: layout.strides[rank - 1],
        };
        let batch_offsets = if rank == 2 {
            vec![layout.offset; batch]
        } else {
            let (dims, strides) = (&layout.dims[..rank - 2], &layout.strides[..rank - 2]);
            let mut offsets = Vec::with_capacity(batch);
            let mut counter = vec![0usize; dims.len()];
            let mut offset = layout.offset;
            for _ in 0..dims.iter().product::<usize>() {
                offsets.push(offset);
                for axis in (0..dims.len()).rev() {
                    counter[axis] += 1;
                    offset += strides[axis];
                    if counter[axis] < dims[axis] {
                        break;
                    }
                    offset -= strides[axis] * dims[axis];
                    counter[axis] = 0;
                }
            }
            offsets
        };
        Operand {
            buffer,
            matrix,
            batch_offsets,
        }
    }

    fn at(&self, p: usize) -> MatRef {
        MatRef {
            offset: self.batch_offsets[p],
            ..self.matrix
        }
    }
}

/// `a × b` for every batch index, packed row-major `[batch, m, n]`.
pub fn batched(threads: &Threads, a: &Operand<'_>, b: &Operand<'_>) -> Vec<f32> {
    let batch = a.batch_offsets.len();
    let (m, k, n) = (a.matrix.rows, a.matrix.cols, b.matrix.cols);
    assert_eq!(b.batch_offsets.len(), batch, "matmul: batch sizes differ");
    let len = batch * m * n;
    // Not zeroed first: the blocks below write every element (GEMM with
    // alpha = 0 never reads its output, and k = 0 fills zeros).
    let mut out: Vec<f32> = Vec::with_capacity(len);
    if len == 0 {
        return out;
    }
    let (along_rows, block) = blocking(m, k, n);
    let blocks = if along_rows { m } else { n }.div_ceil(block);
    let out_ptr = SharedMut::new(out.as_mut_ptr());
    let flops = 2 * batch * m * n * k;
    threads.for_each(batch * blocks, flops, PARALLEL_MIN_FLOPS, |task| {
        let (p, start) = (task / blocks, (task % blocks) * block);
        let (a_p, b_p) = (a.at(p), b.at(p));
        let base = p * m * n;
        // SAFETY: task (p, block) writes only batch p's rows (or columns)
        // `start..start + len` of the packed `[batch, m, n]` output, which
        // no other task writes; the operands were checked by `fits` below.
        unsafe {
            let (a_blk, b_blk, at) = if along_rows {
                (a_p.rows(start, block.min(m - start)), b_p, base + start * n)
            } else {
                (a_p, b_p.cols(start, block.min(n - start)), base + start)
            };
            assert!(a_blk.fits(a.buffer.len()) && b_blk.fits(b.buffer.len()));
            gemm_raw(
                out_ptr.get().add(at),
                n,
                a.buffer,
                a_blk,
                b.buffer,
                b_blk,
                false,
            );
        }
    });
    // SAFETY: the tasks covered every (batch, block) and wrote all `len`
    // elements (see above).
    unsafe { out.set_len(len) };
    out
}

#[cfg(test)]
pub mod reference {
    //! The naive products the fast kernels are checked against.

    use super::MatRef;

    /// `a × b`, row-major output, summing `k` in order.
    pub fn matmul(a_buf: &[f32], a: MatRef, b_buf: &[f32], b: MatRef) -> Vec<f32> {
        let (m, k, n) = (a.rows, a.cols, b.cols);
        let mut out = vec![0.0f32; m * n];
        let at = |buf: &[f32], x: MatRef, i: usize, j: usize| {
            buf[x.offset + i * x.row_stride + j * x.col_stride]
        };
        for i in 0..m {
            for j in 0..n {
                let mut sum = 0.0f64;
                for l in 0..k {
                    sum += at(a_buf, a, i, l) as f64 * at(b_buf, b, l, j) as f64;
                }
                out[i * n + j] = sum as f32;
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(n: usize, seed: usize) -> Vec<f32> {
        (0..n)
            .map(|i| ((i * 7919 + seed * 104_729) % 1009) as f32 / 1009.0 - 0.5)
            .collect()
    }

    fn close(got: &[f32], want: &[f32], k: usize) {
        assert_eq!(got.len(), want.len());
        let tol = 1e-5 * (k.max(1) as f32).sqrt() + 1e-6;
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            assert!(
                (g - w).abs() <= tol * w.abs().max(1.0),
                "at {i}: {g} vs {w}"
            );
        }
    }

    #[test]
    fn blocking_depends_on_shape_only_and_covers_it() {
        for (m, k, n) in [(1, 1, 1), (1024, 128, 128), (7, 3, 1000), (4096, 1, 2)] {
            let (rows, block) = blocking(m, k, n);
            let len = if rows { m } else { n };
            assert!(block >= 1 && block <= len.max(1));
            assert!(len.div_ceil(block) <= MAX_BLOCKS.max(1));
        }
    }

    #[test]
    fn odd_shapes_match_the_reference() {
        let threads = Threads::always_parallel(3);
        for &(m, k, n) in &[
            (1, 1, 1),
            (1, 7, 1),
            (2, 3, 5),
            (13, 17, 19),
            (1, 64, 97),
            (97, 64, 1),
            (257, 31, 129),
            (1024, 128, 10),
            (5, 0, 3),
        ] {
            let (a, b) = (data(m * k, 1), data(k * n, 2));
            let (am, bm) = (MatRef::row_major(0, m, k), MatRef::row_major(0, k, n));
            let want = reference::matmul(&a, am, &b, bm);
            let lhs = Operand::new(&a, &Layout::contiguous(&[m, k]), 1);
            let rhs = Operand::new(&b, &Layout::contiguous(&[k, n]), 1);
            close(&batched(&threads, &lhs, &rhs), &want, k);
            // Both operands transposed in place: a stored as [k, m], b as [n, k].
            let (at, bt) = (data(m * k, 3), data(k * n, 4));
            let (atm, btm) = (
                MatRef::row_major(0, k, m).t(),
                MatRef::row_major(0, n, k).t(),
            );
            let want = reference::matmul(&at, atm, &bt, btm);
            let t = |d: [usize; 2]| Layout {
                dims: [d[1], d[0]][..].into(),
                strides: [1, d[1]][..].into(),
                offset: 0,
            };
            let lhs = Operand::new(&at, &t([k, m]), 1);
            let rhs = Operand::new(&bt, &t([n, k]), 1);
            close(&batched(&threads, &lhs, &rhs), &want, k);
        }
    }

    #[test]
    fn batched_with_shared_and_offset_operands() {
        let threads = Threads::always_parallel(2);
        let (batch, m, k, n) = (3, 33, 65, 47);
        let a = data(7 + batch * m * k, 5);
        let b = data(k * n, 6);
        let a_layout = Layout {
            offset: 7,
            ..Layout::contiguous(&[batch, m, k])
        };
        let lhs = Operand::new(&a, &a_layout, batch);
        let rhs = Operand::new(&b, &Layout::contiguous(&[k, n]), batch);
        let got = batched(&threads, &lhs, &rhs);
        for p in 0..batch {
            let want = reference::matmul(
                &a,
                MatRef::row_major(7 + p * m * k, m, k),
                &b,
                MatRef::row_major(0, k, n),
            );
            close(&got[p * m * n..(p + 1) * m * n], &want, k);
        }
    }

    #[test]
    fn row_dots_match_the_reference_and_do_not_depend_on_blocking() {
        for (m, k, n) in [(1, 1, 1), (4, 8, 2), (5, 13, 3), (8, 1024, 72), (9, 257, 7)] {
            let (a, b) = (data(m * k, 9), data(n * k, 10));
            let want = reference::matmul(
                &a,
                MatRef::row_major(0, m, k),
                &b,
                MatRef::row_major(0, n, k).t(),
            );
            let mut got = vec![0.0; m * n];
            row_dots(&mut got, &a, &b, (m, k, n), false);
            close(&got, &want, k);
            // Row i alone gives the bits it got inside a 4 × 2 block.
            for i in 0..m {
                let mut row = vec![0.0; n];
                row_dots(&mut row, &a[i * k..(i + 1) * k], &b, (1, k, n), false);
                assert!(row
                    .iter()
                    .zip(&got[i * n..])
                    .all(|(x, y)| x.to_bits() == y.to_bits()));
            }
            row_dots(&mut got, &a, &b, (m, k, n), true);
            close(&got, &want.iter().map(|w| 2.0 * w).collect::<Vec<_>>(), k);
        }
    }

    #[test]
    fn bits_do_not_depend_on_threads_or_runs() {
        let (m, k, n) = (515, 300, 260);
        let (a, b) = (data(m * k, 7), data(k * n, 8));
        let lhs = Operand::new(&a, &Layout::contiguous(&[m, k]), 1);
        let rhs = Operand::new(&b, &Layout::contiguous(&[k, n]), 1);
        let first = batched(&Threads::new(1).unwrap(), &lhs, &rhs);
        for threads in [2, 3, 4] {
            let threads = Threads::always_parallel(threads);
            for _ in 0..10 {
                let again = batched(&threads, &lhs, &rhs);
                assert!(first
                    .iter()
                    .zip(&again)
                    .all(|(x, y)| x.to_bits() == y.to_bits()));
            }
        }
    }
}
