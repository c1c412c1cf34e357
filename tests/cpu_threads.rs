//! The CPU backend's results do not depend on its thread count or on how
//! its threads are scheduled: a model large enough that every kernel splits
//! its work trains to bitwise the same losses and parameters on 1, 2 and 3
//! threads, repeatedly, unbounded and under a budget that forces
//! rematerialisation.

use dtr::eager::{nn, optim, Session};
use dtr::{Config, CpuBackend, Window2d};
use rand::Rng;

/// A few SGD steps through convolutions (im2col + GEMM, both backward
/// ops), pooling, matmuls with transposed operands, layer norm, softmax,
/// GELU, tanh, reductions and broadcasts, each over at least tens of
/// thousands of elements. Returns the losses' and final parameters' bits,
/// the peak memory and the rematerialisation count.
fn train(
    threads: usize,
    budget_ratio: Option<f64>,
    peak: Option<u64>,
) -> (Vec<u32>, Vec<u32>, u64, u64) {
    let config = Config {
        budget: budget_ratio
            .zip(peak)
            .map(|(r, p)| (p as f64 * r) as u64)
            .into(),
        ..Config::default()
    };
    let backend = CpuBackend::with_threads(threads).unwrap();
    let s = Session::new(backend, config).unwrap();
    let mut rng = s.rng(5);
    // Sizes past the backend's parallel thresholds (4 Mflop per product,
    // 32k elements for softmax and layer norm).
    let (n, side, width, hidden, classes) = (8, 32, 16, 128, 10);
    let stem = nn::Conv2d::new(&s, 3, width, 3, 1, &mut rng).unwrap();
    let body = nn::Conv2d::new(&s, width, width, 3, 1, &mut rng).unwrap();
    let down = nn::Conv2d::new(&s, width, width, 3, 2, &mut rng).unwrap();
    let flat = width * 8 * 8;
    let proj = nn::Linear::new(&s, flat, hidden, &mut rng).unwrap();
    let norm = nn::LayerNorm::new(&s, hidden).unwrap();
    let mix = nn::Linear::new(&s, hidden, hidden, &mut rng).unwrap();
    let head = nn::Linear::new(&s, hidden, classes, &mut rng).unwrap();
    let mut params = stem.params();
    params.extend(body.params());
    params.extend(down.params());
    params.extend(proj.params());
    params.extend(norm.params());
    params.extend(mix.params());
    params.extend(head.params());
    let images: Vec<f32> = (0..n * 3 * side * side)
        .map(|_| rng.gen_range(-1.0..1.0))
        .collect();
    let labels: Vec<f32> = (0..n).map(|i| (i % classes) as f32).collect();
    let x = s.tensor(&images, &[n, 3, side, side]).unwrap();
    let y = s.tensor(&labels, &[n]).unwrap();
    // A second, wider batch through the MLP part alone, so its matmuls,
    // layer norm and softmax are large too.
    let rows = 256;
    let wide: Vec<f32> = (0..rows * hidden)
        .map(|_| rng.gen_range(-1.0..1.0))
        .collect();
    let wide = s.tensor(&wide, &[rows, hidden]).unwrap();
    let wide_labels: Vec<f32> = (0..rows).map(|i| (i * 7 % classes) as f32).collect();
    let wide_y = s.tensor(&wide_labels, &[rows]).unwrap();
    let pool = Window2d::new(2, 0);
    let sgd = optim::Sgd::new(0.05);
    let mut losses = Vec::new();
    for _ in 0..3 {
        let h = stem.forward(&x).unwrap().relu().unwrap();
        let h = body.forward(&h).unwrap().relu().unwrap();
        let h = h.max_pool2d([2, 2], pool).unwrap();
        let h = down.forward(&h).unwrap().tanh().unwrap();
        let h = h.reshape(&[n, flat]).unwrap();
        let h = norm
            .forward(&proj.forward(&h).unwrap())
            .unwrap()
            .gelu()
            .unwrap();
        let conv_loss = head.forward(&h).unwrap().cross_entropy(&y).unwrap();
        let w = mix.forward(&wide).unwrap();
        let attention = w
            .matmul(&wide.transpose(0, 1).unwrap())
            .unwrap()
            .softmax(-1)
            .unwrap();
        let w = norm
            .forward(&attention.matmul(&w).unwrap())
            .unwrap()
            .sigmoid()
            .unwrap();
        let wide_loss = head.forward(&w).unwrap().cross_entropy(&wide_y).unwrap();
        let loss = conv_loss.add(&wide_loss).unwrap();
        losses.push(loss.item().unwrap().to_bits());
        loss.backward().unwrap();
        sgd.step(&params).unwrap();
    }
    let weights = params
        .iter()
        .flat_map(|p| p.value().to_vec().unwrap())
        .map(f32::to_bits)
        .collect();
    (
        losses,
        weights,
        s.memory().peak_bytes,
        s.stats().rematerializations,
    )
}

#[test]
fn bits_do_not_depend_on_thread_count_runs_or_budget() {
    let (losses, weights, peak, _) = train(1, None, None);
    for threads in [1, 2, 3] {
        for _ in 0..2 {
            let (l, w, _, _) = train(threads, None, None);
            assert_eq!(l, losses, "losses on {threads} threads");
            assert!(w == weights, "parameters on {threads} threads");
        }
        let (l, w, _, remats) = train(threads, Some(0.8), Some(peak));
        assert!(remats > 0, "the budget should force recomputation");
        assert_eq!(
            l, losses,
            "losses on {threads} threads under 0.8 of the peak"
        );
        assert!(
            w == weights,
            "parameters on {threads} threads under 0.8 of the peak"
        );
    }
}

#[test]
fn zero_threads_is_an_error() {
    assert!(CpuBackend::with_threads(0).is_err());
    assert_eq!(CpuBackend::with_threads(3).unwrap().threads(), 3);
    assert!(CpuBackend::new().threads() >= 1);
}
