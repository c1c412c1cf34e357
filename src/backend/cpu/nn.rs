//! Neural-network kernels of the CPU backend, on packed row-major slices.
//! Rows (softmax, layer norm) and images or planes (convolution, pooling)
//! are split over the backend's threads; convolution is im2col + GEMM.
//! Sums across rows or images add fixed blocks' partials in block order,
//! so the bits never depend on the thread count.

use super::elementwise::{max_lanes, sum_lanes, sum_lanes_of, vectorized};
use super::math::exp;
use super::matmul::{gemm_into, row_dots, MatRef, PARALLEL_MIN_FLOPS};
use super::parallel::{
    SharedMut, Threads, ELEMENTWISE_CHUNK, PARALLEL_MIN_HEAVY_ELEMENTS as HEAVY,
};
use crate::error::{Error, Result};
use std::ops::Range;

use crate::ops::Window2d;

/// Rows per piece of row-wise work on rows of `len`.
fn rows_per_piece(len: usize) -> usize {
    (ELEMENTWISE_CHUNK / len.max(1)).max(1)
}

/// Softmax (or log-softmax) over the middle axis of `(outer, len, inner)`.
pub fn softmax(
    threads: &Threads,
    x: &[f32],
    (_outer, len, inner): (usize, usize, usize),
    log: bool,
) -> Vec<f32> {
    let mut out = vec![0.0; x.len()];
    if inner == 1 {
        let rows = rows_per_piece(len);
        threads.for_each_chunk(&mut out, rows * len.max(1), HEAVY, |i, piece| {
            let first = i * rows;
            for (r, out) in piece.chunks_mut(len.max(1)).enumerate() {
                let row = &x[(first + r) * len..(first + r + 1) * len];
                softmax_row(row, out, log);
            }
        });
        return out;
    }
    threads.for_each_chunk(&mut out, len * inner, HEAVY, |o, out| {
        let x = &x[o * len * inner..(o + 1) * len * inner];
        for i in 0..inner {
            let at = |l: usize| l * inner + i;
            let max = (0..len).map(|l| x[at(l)]).fold(f32::NEG_INFINITY, f32::max);
            let sum: f32 = (0..len).map(|l| exp(x[at(l)] - max)).sum();
            for l in 0..len {
                let shifted = x[at(l)] - max;
                out[at(l)] = if log {
                    shifted - sum.ln()
                } else {
                    exp(shifted) / sum
                };
            }
        }
    });
    out
}

fn softmax_row(row: &[f32], out: &mut [f32], log: bool) {
    vectorized(|| {
        let max = max_lanes(row);
        for (o, &v) in out.iter_mut().zip(row) {
            *o = exp(v - max);
        }
        let sum = sum_lanes(out);
        if log {
            let log_sum = sum.ln();
            for (o, &v) in out.iter_mut().zip(row) {
                *o = (v - max) - log_sum;
            }
        } else {
            for o in out.iter_mut() {
                *o /= sum;
            }
        }
    })
}

/// Gradient of softmax (`y` its output) or log-softmax (`y` its output).
pub fn softmax_backward(
    threads: &Threads,
    grad: &[f32],
    y: &[f32],
    (_outer, len, inner): (usize, usize, usize),
    log: bool,
) -> Vec<f32> {
    let mut out = vec![0.0; y.len()];
    if inner == 1 {
        let rows = rows_per_piece(len);
        threads.for_each_chunk(&mut out, rows * len.max(1), HEAVY, |i, piece| {
            let first = i * rows;
            for (r, out) in piece.chunks_mut(len.max(1)).enumerate() {
                let span = (first + r) * len..(first + r + 1) * len;
                let (g, y) = (&grad[span.clone()], &y[span]);
                vectorized(|| {
                    if log {
                        // d/dx log_softmax: g - softmax(x) * Σg
                        let total = sum_lanes(g);
                        for ((o, &g), &y) in out.iter_mut().zip(g).zip(y) {
                            *o = g - exp(y) * total;
                        }
                    } else {
                        // d/dx softmax: y * (g - Σ g·y)
                        for ((o, &g), &y) in out.iter_mut().zip(g).zip(y) {
                            *o = g * y;
                        }
                        let dot = sum_lanes(out);
                        for ((o, &g), &y) in out.iter_mut().zip(g).zip(y) {
                            *o = y * (g - dot);
                        }
                    }
                })
            }
        });
        return out;
    }
    threads.for_each_chunk(&mut out, len * inner, HEAVY, |o, out| {
        let span = o * len * inner..(o + 1) * len * inner;
        let (grad, y) = (&grad[span.clone()], &y[span]);
        for i in 0..inner {
            let at = |l: usize| l * inner + i;
            if log {
                let total: f32 = (0..len).map(|l| grad[at(l)]).sum();
                for l in 0..len {
                    out[at(l)] = grad[at(l)] - exp(y[at(l)]) * total;
                }
            } else {
                let dot: f32 = (0..len).map(|l| grad[at(l)] * y[at(l)]).sum();
                for l in 0..len {
                    out[at(l)] = y[at(l)] * (grad[at(l)] - dot);
                }
            }
        }
    });
    out
}

/// Layer norm over rows of length `d`: returns `(y, mean, rstd)`.
pub fn layer_norm(
    threads: &Threads,
    x: &[f32],
    gamma: &[f32],
    beta: &[f32],
    d: usize,
    eps: f32,
) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let rows = x.len() / d;
    let mut stats = vec![(0.0f32, 0.0f32); rows];
    let per_piece = rows_per_piece(d);
    threads.for_each_chunk(&mut stats, per_piece, HEAVY / d.max(1), |i, piece| {
        for (r, stat) in piece.iter_mut().enumerate() {
            let row = &x[(i * per_piece + r) * d..(i * per_piece + r + 1) * d];
            let mean = vectorized(|| sum_lanes(row)) / d as f32;
            let var = vectorized(|| sum_lanes_of(row, |v| (v - mean) * (v - mean))) / d as f32;
            *stat = (mean, 1.0 / (var + eps).sqrt());
        }
    });
    let mut y = vec![0.0; x.len()];
    threads.for_each_chunk(&mut y, per_piece * d, HEAVY, |i, piece| {
        for (r, out) in piece.chunks_mut(d).enumerate() {
            let row_index = i * per_piece + r;
            let row = &x[row_index * d..(row_index + 1) * d];
            let (mean, rstd) = stats[row_index];
            vectorized(|| {
                for (((o, &v), &g), &b) in out.iter_mut().zip(row).zip(gamma).zip(beta) {
                    *o = (v - mean) * rstd * g + b;
                }
            });
        }
    });
    let (means, rstds) = stats.into_iter().unzip();
    (y, means, rstds)
}

/// Rows whose parameter gradients one task sums before the blocks' partial
/// sums are added in order.
const LAYER_NORM_ROW_BLOCK: usize = 128;

/// Gradients of layer norm: `(dx, dgamma, dbeta)`.
pub fn layer_norm_backward(
    threads: &Threads,
    dy: &[f32],
    x: &[f32],
    gamma: &[f32],
    mean: &[f32],
    rstd: &[f32],
    d: usize,
) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let rows = x.len() / d;
    let mut dx = vec![0.0; x.len()];
    let dx_ptr = SharedMut::new(dx.as_mut_ptr());
    let blocks = rows.div_ceil(LAYER_NORM_ROW_BLOCK);
    let partials = threads.map(blocks, x.len(), HEAVY, |block| {
        let (mut dgamma, mut dbeta) = (vec![0.0f32; d], vec![0.0f32; d]);
        let (mut xhat, mut dxhat) = (vec![0.0f32; d], vec![0.0f32; d]);
        let start = block * LAYER_NORM_ROW_BLOCK;
        for r in start..(start + LAYER_NORM_ROW_BLOCK).min(rows) {
            let (x, dy) = (&x[r * d..(r + 1) * d], &dy[r * d..(r + 1) * d]);
            // SAFETY: row r of dx belongs to this block's task alone.
            let dx = unsafe { std::slice::from_raw_parts_mut(dx_ptr.get().add(r * d), d) };
            let (m, s) = (mean[r], rstd[r]);
            vectorized(|| {
                for j in 0..d {
                    xhat[j] = (x[j] - m) * s;
                    dxhat[j] = dy[j] * gamma[j];
                    dgamma[j] += dy[j] * xhat[j];
                    dbeta[j] += dy[j];
                }
                let mean_dxhat = sum_lanes(&dxhat) / d as f32;
                // dxhat·xhat, staged in dx's row to sum it in lane order.
                for ((o, &a), &b) in dx.iter_mut().zip(&xhat).zip(&dxhat) {
                    *o = a * b;
                }
                let mean_dxhat_xhat = sum_lanes(dx) / d as f32;
                for j in 0..d {
                    dx[j] = s * (dxhat[j] - mean_dxhat - xhat[j] * mean_dxhat_xhat);
                }
            });
        }
        (dgamma, dbeta)
    });
    let (mut dgamma, mut dbeta) = (vec![0.0f32; d], vec![0.0f32; d]);
    for (pg, pb) in partials {
        dgamma.iter_mut().zip(&pg).for_each(|(a, b)| *a += b);
        dbeta.iter_mut().zip(&pb).for_each(|(a, b)| *a += b);
    }
    (dx, dgamma, dbeta)
}

/// Sizes of one convolution: input `[n, c, h, w]`, weight `[o, c, kh, kw]`,
/// output `[n, o, oh, ow]`.
pub struct ConvGeometry {
    n: usize,
    c: usize,
    h: usize,
    w: usize,
    o: usize,
    kh: usize,
    kw: usize,
    oh: usize,
    ow: usize,
    window: Window2d,
}

/// Images whose weight gradients one task sums (in order) before the
/// groups' partial sums are added in order: at most this many groups.
const CONV_WEIGHT_GROUPS: usize = 8;

impl ConvGeometry {
    pub fn new(
        input: &[usize],
        weight: &[usize],
        output: &[usize],
        window: &Window2d,
    ) -> ConvGeometry {
        ConvGeometry {
            n: input[0],
            c: input[1],
            h: input[2],
            w: input[3],
            o: weight[0],
            kh: weight[2],
            kw: weight[3],
            oh: output[2],
            ow: output[3],
            window: *window,
        }
    }

    /// Rows of an image's im2col matrix: one per (channel, tap).
    fn taps(&self) -> usize {
        self.c * self.kh * self.kw
    }

    /// Output pixels per image: the im2col matrix's columns.
    fn pixels(&self) -> usize {
        self.oh * self.ow
    }

    fn image_len(&self) -> usize {
        self.c * self.h * self.w
    }

    /// Flops of one image's product.
    fn image_flops(&self) -> usize {
        2 * self.o * self.taps() * self.pixels()
    }

    /// A 1×1 kernel at stride 1 without padding: the image is its own im2col.
    fn is_pointwise(&self) -> bool {
        self.kh == 1
            && self.kw == 1
            && self.window.stride == [1, 1]
            && self.window.padding == [0, 0]
            && self.oh == self.h
            && self.ow == self.w
    }

    /// Output positions `o` along `axis` whose input position
    /// `o * stride + tap - pad` lies inside the image.
    fn inside(&self, axis: usize, tap: usize) -> std::ops::Range<usize> {
        let (stride, pad) = (self.window.stride[axis], self.window.padding[axis]);
        let (len, out_len) = if axis == 0 {
            (self.h, self.oh)
        } else {
            (self.w, self.ow)
        };
        let first = pad.saturating_sub(tap).div_ceil(stride).min(out_len);
        let end = (len + pad)
            .checked_sub(tap)
            .map_or(0, |span| span.div_ceil(stride))
            .min(out_len);
        first..end.max(first)
    }

    /// Stride 1 and as many output as input columns: a tap's valid output
    /// rows read consecutive input rows with the same pitch, so they are
    /// one shifted block of the input plane.
    fn is_shift(&self) -> bool {
        self.window.stride == [1, 1] && self.ow == self.w
    }

    /// Visits each tap (row of the im2col matrix) as `(tap, channel, ky,
    /// kx, rows, columns)`, with the output rows and columns that read
    /// inside the image.
    #[inline(always)]
    fn for_each_tap(
        &self,
        mut visit: impl FnMut(usize, usize, usize, usize, Range<usize>, Range<usize>),
    ) {
        for c in 0..self.c {
            for ky in 0..self.kh {
                let rows = self.inside(0, ky);
                for kx in 0..self.kw {
                    let tap = (c * self.kh + ky) * self.kw + kx;
                    visit(tap, c, ky, kx, rows.clone(), self.inside(1, kx));
                }
            }
        }
    }

    /// Input offset (within channel `c`'s plane) read by output `(oy, ox)`
    /// at tap `(ky, kx)`, which must be inside.
    #[inline(always)]
    fn source(&self, (oy, ox): (usize, usize), (ky, kx): (usize, usize)) -> usize {
        let y = oy * self.window.stride[0] + ky - self.window.padding[0];
        let x = ox * self.window.stride[1] + kx - self.window.padding[1];
        y * self.w + x
    }

    /// One image `[c, h, w]` unfolded to `[c·kh·kw, oh·ow]` (zeros where
    /// the window reads padding).
    fn im2col(&self, image: &[f32], col: &mut [f32]) {
        let (pixels, ow, plane) = (self.pixels(), self.ow, self.h * self.w);
        self.for_each_tap(|tap, c, ky, kx, rows, columns| {
            let out = &mut col[tap * pixels..(tap + 1) * pixels];
            let image = &image[c * plane..(c + 1) * plane];
            if rows.is_empty() || columns.is_empty() {
                out.fill(0.0);
                return;
            }
            out[..rows.start * ow].fill(0.0);
            out[rows.end * ow..].fill(0.0);
            if self.is_shift() {
                // One copy of the valid block; the columns it wraps into
                // (padding) are zeroed after.
                let first = rows.start * ow + columns.start;
                let end = (rows.end - 1) * ow + columns.end;
                let src = self.source((rows.start, columns.start), (ky, kx));
                out[first..end].copy_from_slice(&image[src..src + (end - first)]);
                for x in (0..columns.start).chain(columns.end..ow) {
                    for oy in rows.clone() {
                        out[oy * ow + x] = 0.0;
                    }
                }
                return;
            }
            let stride = self.window.stride[1];
            for oy in rows {
                let row = &mut out[oy * ow..(oy + 1) * ow];
                row[..columns.start].fill(0.0);
                row[columns.end..].fill(0.0);
                let src = self.source((oy, columns.start), (ky, kx));
                for (j, o) in row[columns.clone()].iter_mut().enumerate() {
                    *o = image[src + j * stride];
                }
            }
        });
    }

    /// Adds an im2col-shaped gradient back onto its image (`[c, h, w]`),
    /// taps and pixels in a fixed order. Clobbers `col`'s padding entries.
    fn col2im(&self, col: &mut [f32], image: &mut [f32]) {
        let (pixels, ow, plane) = (self.pixels(), self.ow, self.h * self.w);
        let stride = self.window.stride[1];
        vectorized(|| {
            self.for_each_tap(|tap, c, ky, kx, rows, columns| {
                let col = &mut col[tap * pixels..(tap + 1) * pixels];
                let image = &mut image[c * plane..(c + 1) * plane];
                if rows.is_empty() || columns.is_empty() {
                    return;
                }
                if self.is_shift() {
                    // Zero the entries that read padding, then add the valid
                    // block in one pass: the zeros land on the neighbouring
                    // row's edge pixels and change nothing.
                    for x in (0..columns.start).chain(columns.end..ow) {
                        for oy in rows.clone() {
                            col[oy * ow + x] = 0.0;
                        }
                    }
                    let first = rows.start * ow + columns.start;
                    let end = (rows.end - 1) * ow + columns.end;
                    let dst = self.source((rows.start, columns.start), (ky, kx));
                    let dst = &mut image[dst..dst + (end - first)];
                    dst.iter_mut()
                        .zip(&col[first..end])
                        .for_each(|(d, &s)| *d += s);
                    return;
                }
                for oy in rows {
                    let src = &col[oy * ow + columns.start..oy * ow + columns.end];
                    let first = self.source((oy, columns.start), (ky, kx));
                    if stride == 1 {
                        let dst = &mut image[first..first + src.len()];
                        dst.iter_mut().zip(src).for_each(|(d, &s)| *d += s);
                    } else {
                        for (j, &s) in src.iter().enumerate() {
                            image[first + j * stride] += s;
                        }
                    }
                }
            })
        });
    }

    /// Work on `images` from which image-parallel loops use the pool.
    fn parallel_min_images(&self) -> usize {
        PARALLEL_MIN_FLOPS.div_ceil(self.image_flops().max(1))
    }
}

/// `weight [o, c·kh·kw]` times each image's im2col matrix, images over threads.
pub fn conv2d(threads: &Threads, x: &[f32], weight: &[f32], g: &ConvGeometry) -> Vec<f32> {
    let (taps, pixels) = (g.taps(), g.pixels());
    let mut out = vec![0.0; g.n * g.o * pixels];
    let per_image = (g.o * pixels).max(1);
    let min = g.parallel_min_images() * per_image;
    threads.for_each_chunk(&mut out, per_image, min, |n, out| {
        let image = &x[n * g.image_len()..(n + 1) * g.image_len()];
        let lhs = (weight, MatRef::row_major(0, g.o, taps));
        if g.is_pointwise() {
            gemm_into(
                out,
                pixels,
                lhs,
                (image, MatRef::row_major(0, taps, pixels)),
                false,
            );
            return;
        }
        threads.with_scratch(taps * pixels, |col| {
            g.im2col(image, col);
            gemm_into(
                out,
                pixels,
                lhs,
                (col, MatRef::row_major(0, taps, pixels)),
                false,
            );
        });
    });
    out
}

/// `weightᵀ × dy` per image, folded back onto the image (col2im).
pub fn conv2d_backward_data(
    threads: &Threads,
    dy: &[f32],
    weight: &[f32],
    g: &ConvGeometry,
) -> Vec<f32> {
    let (taps, pixels) = (g.taps(), g.pixels());
    let mut dx = vec![0.0; g.n * g.image_len()];
    let per_image = g.image_len().max(1);
    let min = g.parallel_min_images() * per_image;
    threads.for_each_chunk(&mut dx, per_image, min, |n, dx| {
        let wt = (weight, MatRef::row_major(0, g.o, taps).t());
        let dy = (dy, MatRef::row_major(n * g.o * pixels, g.o, pixels));
        if g.is_pointwise() {
            gemm_into(dx, pixels, wt, dy, false);
            return;
        }
        threads.with_scratch(taps * pixels, |col| {
            gemm_into(col, pixels, wt, dy, false);
            g.col2im(col, dx);
        });
    });
    dx
}

/// Outputs per image from which a weight gradient's per-image product
/// `dyₙ × im2col(xₙ)ᵀ` (a long sum over the pixels into a small output)
/// runs as [`row_dots`] rather than GEMM, which tiles that output poorly
/// (measured on the ResNet example's shapes).
const ROW_DOTS_MIN_PIXELS: usize = 256;

/// `Σₙ dyₙ × im2col(xₙ)ᵀ`: images in at most [`CONV_WEIGHT_GROUPS`] fixed
/// groups, each summed in order by one task, the groups then in order.
pub fn conv2d_backward_weight(
    threads: &Threads,
    dy: &[f32],
    x: &[f32],
    g: &ConvGeometry,
) -> Vec<f32> {
    let (taps, pixels) = (g.taps(), g.pixels());
    let group = g.n.div_ceil(CONV_WEIGHT_GROUPS).max(1);
    let groups = g.n.div_ceil(group);
    let accumulate = |dw: &mut [f32], n: usize, cols: &[f32], again: bool| {
        let dy_n = &dy[n * g.o * pixels..(n + 1) * g.o * pixels];
        if pixels >= ROW_DOTS_MIN_PIXELS {
            row_dots(dw, dy_n, cols, (g.o, pixels, taps), again);
        } else {
            gemm_into(
                dw,
                taps,
                (dy_n, MatRef::row_major(0, g.o, pixels)),
                (cols, MatRef::row_major(0, taps, pixels).t()),
                again,
            );
        }
    };
    let partials = threads.map(groups, g.n * g.image_flops(), PARALLEL_MIN_FLOPS, |i| {
        let mut dw = vec![0.0f32; g.o * taps];
        let images = i * group..((i + 1) * group).min(g.n);
        if g.is_pointwise() {
            for (k, n) in images.enumerate() {
                let image = &x[n * g.image_len()..(n + 1) * g.image_len()];
                accumulate(&mut dw, n, image, k > 0);
            }
            return dw;
        }
        threads.with_scratch(taps * pixels, |col| {
            for (k, n) in images.enumerate() {
                g.im2col(&x[n * g.image_len()..(n + 1) * g.image_len()], col);
                accumulate(&mut dw, n, col, k > 0);
            }
        });
        dw
    });
    let mut partials = partials.into_iter();
    let mut dw = partials.next().unwrap_or_else(|| vec![0.0; g.o * taps]);
    for partial in partials {
        dw.iter_mut().zip(&partial).for_each(|(a, b)| *a += b);
    }
    dw
}

/// Sizes of one pooling: input `[n, c, h, w]`, output `[n, c, oh, ow]`.
pub struct PoolGeometry {
    planes: usize,
    h: usize,
    w: usize,
    oh: usize,
    ow: usize,
    kernel: [usize; 2],
    window: Window2d,
}

impl PoolGeometry {
    pub fn new(
        input: &[usize],
        output: &[usize],
        kernel: [usize; 2],
        window: &Window2d,
    ) -> PoolGeometry {
        PoolGeometry {
            planes: input[0] * input[1],
            h: input[2],
            w: input[3],
            oh: output[2],
            ow: output[3],
            kernel,
            window: *window,
        }
    }

    /// Calls `f(output_index, inside)` per output of one plane with the
    /// input indices of its window that lie inside, both within the plane.
    fn for_each_window(&self, mut f: impl FnMut(usize, &mut dyn Iterator<Item = usize>)) {
        for oy in 0..self.oh {
            for ox in 0..self.ow {
                let y0 = (oy * self.window.stride[0]) as isize - self.window.padding[0] as isize;
                let x0 = (ox * self.window.stride[1]) as isize - self.window.padding[1] as isize;
                let mut inside = (0..self.kernel[0]).flat_map(move |ky| {
                    (0..self.kernel[1]).filter_map(move |kx| {
                        let (y, x) = (y0 + ky as isize, x0 + kx as isize);
                        let ok = y >= 0 && x >= 0 && (y as usize) < self.h && (x as usize) < self.w;
                        ok.then(|| y as usize * self.w + x as usize)
                    })
                });
                f(oy * self.ow + ox, &mut inside);
            }
        }
    }

    fn window_area(&self) -> f32 {
        (self.kernel[0] * self.kernel[1]) as f32
    }

    fn in_plane(&self) -> usize {
        self.h * self.w
    }

    fn out_plane(&self) -> usize {
        self.oh * self.ow
    }
}

pub fn max_pool2d(threads: &Threads, x: &[f32], g: &PoolGeometry) -> Vec<f32> {
    let mut out = vec![0.0; g.planes * g.out_plane()];
    threads.for_each_chunk(&mut out, g.out_plane().max(1), HEAVY, |p, out| {
        let x = &x[p * g.in_plane()..(p + 1) * g.in_plane()];
        g.for_each_window(|o, inside| {
            out[o] = inside.map(|i| x[i]).fold(f32::NEG_INFINITY, f32::max)
        });
    });
    out
}

pub fn max_pool2d_backward(threads: &Threads, dy: &[f32], x: &[f32], g: &PoolGeometry) -> Vec<f32> {
    let mut dx = vec![0.0; x.len()];
    threads.for_each_chunk(&mut dx, g.in_plane().max(1), HEAVY, |p, dx| {
        let x = &x[p * g.in_plane()..(p + 1) * g.in_plane()];
        let dy = &dy[p * g.out_plane()..(p + 1) * g.out_plane()];
        g.for_each_window(|o, inside| {
            // The first maximum in window order receives the gradient.
            let mut best: Option<usize> = None;
            for i in inside {
                if best.is_none_or(|b| x[i] > x[b]) {
                    best = Some(i);
                }
            }
            if let Some(b) = best {
                dx[b] += dy[o];
            }
        });
    });
    dx
}

pub fn avg_pool2d(threads: &Threads, x: &[f32], g: &PoolGeometry) -> Vec<f32> {
    let mut out = vec![0.0; g.planes * g.out_plane()];
    let area = g.window_area();
    threads.for_each_chunk(&mut out, g.out_plane().max(1), HEAVY, |p, out| {
        let x = &x[p * g.in_plane()..(p + 1) * g.in_plane()];
        g.for_each_window(|o, inside| out[o] = inside.map(|i| x[i]).sum::<f32>() / area);
    });
    out
}

pub fn avg_pool2d_backward(threads: &Threads, dy: &[f32], g: &PoolGeometry) -> Vec<f32> {
    let mut dx = vec![0.0; g.planes * g.in_plane()];
    let area = g.window_area();
    threads.for_each_chunk(&mut dx, g.in_plane().max(1), HEAVY, |p, dx| {
        let dy = &dy[p * g.out_plane()..(p + 1) * g.out_plane()];
        g.for_each_window(|o, inside| inside.for_each(|i| dx[i] += dy[o] / area));
    });
    dx
}

/// Converts an f32 that should hold a class or row index.
fn index(value: f32, limit: usize, what: &str) -> Result<usize> {
    if value.fract() != 0.0 || value < 0.0 || value >= limit as f32 {
        return Err(Error::backend(
            "cpu",
            format!("{what} {value} is not an integer in 0..{limit}"),
        ));
    }
    Ok(value as usize)
}

pub fn embedding(weight: &[f32], indices: &[f32], d: usize) -> Result<Vec<f32>> {
    let vocab = weight.len() / d.max(1);
    let mut out = Vec::with_capacity(indices.len() * d);
    for &v in indices {
        let row = index(v, vocab, "embedding index")?;
        out.extend_from_slice(&weight[row * d..(row + 1) * d]);
    }
    Ok(out)
}

pub fn embedding_backward(dy: &[f32], indices: &[f32], vocab: usize, d: usize) -> Result<Vec<f32>> {
    let mut dw = vec![0.0; vocab * d];
    for (k, &v) in indices.iter().enumerate() {
        let row = index(v, vocab, "embedding index")?;
        dw[row * d..(row + 1) * d]
            .iter_mut()
            .zip(&dy[k * d..(k + 1) * d])
            .for_each(|(w, &g)| *w += g);
    }
    Ok(dw)
}

fn log_sum_exp(row: &[f32]) -> f32 {
    let max = max_lanes(row);
    max + sum_lanes_of(row, |v| exp(v - max)).ln()
}

pub fn cross_entropy(logits: &[f32], targets: &[f32], classes: usize) -> Result<f32> {
    let n = targets.len();
    let mut total = 0.0f32;
    for (r, &t) in targets.iter().enumerate() {
        let row = &logits[r * classes..(r + 1) * classes];
        let target = index(t, classes, "target class")?;
        total += vectorized(|| log_sum_exp(row)) - row[target];
    }
    Ok(total / n.max(1) as f32)
}

pub fn cross_entropy_backward(
    grad: f32,
    logits: &[f32],
    targets: &[f32],
    classes: usize,
) -> Result<Vec<f32>> {
    let n = targets.len().max(1) as f32;
    let mut out = vec![0.0; logits.len()];
    for (r, &t) in targets.iter().enumerate() {
        let row = &logits[r * classes..(r + 1) * classes];
        let target = index(t, classes, "target class")?;
        let out = &mut out[r * classes..(r + 1) * classes];
        let lse = vectorized(|| log_sum_exp(row));
        vectorized(|| {
            for (o, &v) in out.iter_mut().zip(row) {
                *o = grad * exp(v - lse) / n;
            }
        });
        out[target] = grad * (exp(row[target] - lse) - 1.0) / n;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The old scalar convolution: every multiply-add visited in
    /// (n, o, oy, ox, c, ky, kx) order.
    fn for_each_tap(g: &ConvGeometry, mut f: impl FnMut(usize, usize, usize)) {
        for n in 0..g.n {
            for o in 0..g.o {
                for oy in 0..g.oh {
                    for ox in 0..g.ow {
                        let out = ((n * g.o + o) * g.oh + oy) * g.ow + ox;
                        for c in 0..g.c {
                            for ky in 0..g.kh {
                                for kx in 0..g.kw {
                                    let y = (oy * g.window.stride[0] + ky)
                                        .checked_sub(g.window.padding[0]);
                                    let x = (ox * g.window.stride[1] + kx)
                                        .checked_sub(g.window.padding[1]);
                                    if let (Some(y), Some(x)) = (y, x) {
                                        if y < g.h && x < g.w {
                                            let input = ((n * g.c + c) * g.h + y) * g.w + x;
                                            let weight = ((o * g.c + c) * g.kh + ky) * g.kw + kx;
                                            f(input, weight, out);
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }

    fn data(n: usize, seed: usize) -> Vec<f32> {
        (0..n)
            .map(|i| ((i * 7919 + seed * 104_729) % 1009) as f32 / 1009.0 - 0.5)
            .collect()
    }

    fn close(what: &str, got: &[f32], want: &[f64], terms: usize) {
        assert_eq!(got.len(), want.len(), "{what}");
        let tol = 2e-6 * (terms.max(1) as f64).sqrt() + 1e-6;
        for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
            assert!(
                (g as f64 - w).abs() <= tol * w.abs().max(1.0),
                "{what} at {i}: {g} vs {w}"
            );
        }
    }

    fn bitwise(a: &[f32], b: &[f32]) -> bool {
        a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
    }

    /// Input `[n, c, h, w]`, weight `[o, c, k.0, k.1]`, stride, padding.
    type Case = ([usize; 4], [usize; 2], usize, [usize; 2], [usize; 2]);

    #[test]
    fn convolution_and_its_gradients_match_the_scalar_reference() {
        let cases: [Case; 9] = [
            ([1, 1, 1, 1], [1, 1], 1, [1, 1], [0, 0]),
            ([2, 3, 5, 7], [3, 3], 4, [1, 1], [1, 1]),
            ([3, 2, 7, 5], [3, 2], 5, [2, 3], [1, 0]),
            ([1, 5, 11, 13], [1, 1], 3, [1, 1], [0, 0]),
            ([4, 3, 9, 9], [5, 5], 2, [2, 2], [2, 2]),
            ([2, 8, 16, 16], [3, 3], 16, [2, 2], [1, 1]),
            ([9, 4, 8, 8], [3, 3], 8, [1, 1], [1, 1]),
            ([1, 2, 3, 3], [3, 3], 1, [3, 3], [0, 0]),
            // Enough pixels for the weight gradient's row-dot kernel.
            ([3, 3, 20, 17], [3, 3], 5, [1, 1], [1, 1]),
        ];
        for ([n, c, h, w], [kh, kw], o, stride, padding) in cases {
            let window = Window2d { stride, padding };
            let oh = window.output_len(0, h, kh).unwrap();
            let ow = window.output_len(1, w, kw).unwrap();
            let g = ConvGeometry::new(&[n, c, h, w], &[o, c, kh, kw], &[n, o, oh, ow], &window);
            let (x, weight, dy) = (
                data(n * c * h * w, 1),
                data(o * c * kh * kw, 2),
                data(n * o * oh * ow, 3),
            );
            let (mut y_ref, mut dx_ref, mut dw_ref) = (
                vec![0.0f64; dy.len()],
                vec![0.0f64; x.len()],
                vec![0.0f64; weight.len()],
            );
            for_each_tap(&g, |i, k, out| {
                y_ref[out] += x[i] as f64 * weight[k] as f64;
                dx_ref[i] += dy[out] as f64 * weight[k] as f64;
                dw_ref[k] += dy[out] as f64 * x[i] as f64;
            });
            let one = Threads::new(1).unwrap();
            let what = format!("{:?}", (n, c, h, w, kh, kw, o, stride, padding));
            let y = conv2d(&one, &x, &weight, &g);
            let dx = conv2d_backward_data(&one, &dy, &weight, &g);
            let dw = conv2d_backward_weight(&one, &dy, &x, &g);
            close(&format!("conv {what}"), &y, &y_ref, c * kh * kw);
            close(&format!("dx {what}"), &dx, &dx_ref, o * kh * kw);
            close(&format!("dw {what}"), &dw, &dw_ref, n * oh * ow);
            for threads in [2, 3] {
                let threads = Threads::always_parallel(threads);
                for _ in 0..3 {
                    assert!(bitwise(&conv2d(&threads, &x, &weight, &g), &y));
                    assert!(bitwise(
                        &conv2d_backward_data(&threads, &dy, &weight, &g),
                        &dx
                    ));
                    assert!(bitwise(&conv2d_backward_weight(&threads, &dy, &x, &g), &dw));
                }
            }
        }
    }

    #[test]
    fn row_kernels_repeat_bitwise_across_thread_counts() {
        let (rows, d) = (700, 96);
        let (x, dy) = (data(rows * d, 4), data(rows * d, 5));
        let (gamma, beta) = (data(d, 6), data(d, 7));
        let one = Threads::new(1).unwrap();
        let (y, mean, rstd) = layer_norm(&one, &x, &gamma, &beta, d, 1e-5);
        let back = layer_norm_backward(&one, &dy, &x, &gamma, &mean, &rstd, d);
        let soft = softmax(&one, &x, (rows, d, 1), false);
        let log_soft = softmax(&one, &x, (rows, d, 1), true);
        let soft_back = softmax_backward(&one, &dy, &soft, (rows, d, 1), false);
        for threads in [2, 4] {
            let t = Threads::always_parallel(threads);
            let (y2, mean2, rstd2) = layer_norm(&t, &x, &gamma, &beta, d, 1e-5);
            assert!(bitwise(&y, &y2) && bitwise(&mean, &mean2) && bitwise(&rstd, &rstd2));
            let back2 = layer_norm_backward(&t, &dy, &x, &gamma, &mean, &rstd, d);
            assert!(bitwise(&back.0, &back2.0) && bitwise(&back.1, &back2.1));
            assert!(bitwise(&back.2, &back2.2));
            assert!(bitwise(&soft, &softmax(&t, &x, (rows, d, 1), false)));
            assert!(bitwise(&log_soft, &softmax(&t, &x, (rows, d, 1), true)));
            let soft_back2 = softmax_backward(&t, &dy, &soft, (rows, d, 1), false);
            assert!(bitwise(&soft_back, &soft_back2));
        }
        // Softmax rows sum to one; layer norm rows have mean β̄-ish zero spread.
        for row in soft.chunks(d) {
            assert!((row.iter().sum::<f32>() - 1.0).abs() < 1e-5);
        }
        let m0 = x[..d].iter().map(|&v| v as f64).sum::<f64>() / d as f64;
        assert!((mean[0] as f64 - m0).abs() < 1e-6);
    }
}
