//! The eager API: autograd against finite differences for every op, and
//! training under a budget equal to the unbounded run, bit for bit.

use dtr::eager::{nn, optim, Session, Tensor};
use dtr::{Config, CpuBackend, RestoreMode, Window2d};
use rand::{rngs::StdRng, Rng, SeedableRng};

type T = Tensor<CpuBackend>;
type Build = dyn Fn(&Session<CpuBackend>, &[T]) -> dtr::Result<T>;

fn session() -> Session<CpuBackend> {
    Session::new(CpuBackend::new(), Config::default()).unwrap()
}

fn random(rng: &mut StdRng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.gen_range(-1.0..1.0)).collect()
}

/// `Σ f(inputs) · w` for a fixed random `w`, so every output element matters.
fn weighted_loss(s: &Session<CpuBackend>, f: &Build, inputs: &[T]) -> dtr::Result<T> {
    let out = f(s, inputs)?;
    let n: usize = out.dims().iter().product();
    let mut rng = StdRng::seed_from_u64(99);
    let w = s.tensor(&random(&mut rng, n), out.dims())?;
    out.mul(&w)?.reshape(&[n])?.sum(0, false)
}

/// Autograd gradients of every input equal central differences.
fn check(name: &str, inputs: &[(Vec<f32>, Vec<usize>)], f: &Build) {
    let s = session();
    let params: Vec<_> = inputs
        .iter()
        .map(|(data, dims)| s.param(data, dims).unwrap())
        .collect();
    let values: Vec<T> = params.iter().map(|p| p.value()).collect();
    weighted_loss(&s, f, &values).unwrap().backward().unwrap();
    for (k, (data, dims)) in inputs.iter().enumerate() {
        let analytic = params[k]
            .grad()
            .unwrap_or_else(|| panic!("{name}: no gradient for input {k}"))
            .to_vec()
            .unwrap();
        let h = 1e-2f32;
        for i in 0..data.len() {
            let at = |delta: f32| {
                let s = session();
                let tensors: Vec<T> = inputs
                    .iter()
                    .enumerate()
                    .map(|(j, (d, ds))| {
                        let mut d = d.clone();
                        if j == k {
                            d[i] += delta;
                        }
                        s.tensor(&d, ds).unwrap()
                    })
                    .collect();
                weighted_loss(&s, f, &tensors).unwrap().item().unwrap() as f64
            };
            let numeric = (at(h) - at(-h)) / (2.0 * h as f64);
            let error = (analytic[i] as f64 - numeric).abs();
            assert!(
                error <= 2e-2 * (1.0 + numeric.abs()),
                "{name}: d/dinput{k}[{i}] (dims {dims:?}): autograd {} vs numeric {numeric}",
                analytic[i]
            );
        }
    }
}

#[test]
fn every_op_differentiates_like_finite_differences() {
    let mut rng = StdRng::seed_from_u64(1);
    let mut r = |dims: &[usize]| (random(&mut rng, dims.iter().product()), dims.to_vec());
    let positive =
        |(d, dims): (Vec<f32>, Vec<usize>)| (d.iter().map(|x| x.abs() + 0.5).collect(), dims);
    check("add (broadcast)", &[r(&[2, 3]), r(&[3])], &|_, x| {
        x[0].add(&x[1])
    });
    check("sub (broadcast)", &[r(&[2, 3]), r(&[2, 1])], &|_, x| {
        &x[0] - &x[1]
    });
    check("mul", &[r(&[2, 3]), r(&[2, 3])], &|_, x| &x[0] * &x[1]);
    check("div", &[r(&[2, 3]), positive(r(&[3]))], &|_, x| {
        &x[0] / &x[1]
    });
    check("scalars", &[r(&[4])], &|_, x| {
        x[0].mul_scalar(3.0)?.add_scalar(1.0)
    });
    check("pow", &[positive(r(&[4]))], &|_, x| x[0].pow(3.0));
    check("exp", &[r(&[4])], &|_, x| x[0].exp());
    check("log", &[positive(r(&[4]))], &|_, x| x[0].log());
    check("sqrt", &[positive(r(&[4]))], &|_, x| x[0].sqrt());
    check("relu", &[r(&[6])], &|_, x| x[0].relu());
    check("gelu", &[r(&[6])], &|_, x| x[0].gelu());
    check("tanh", &[r(&[6])], &|_, x| x[0].tanh());
    check("sigmoid", &[r(&[6])], &|_, x| x[0].sigmoid());
    check("matmul", &[r(&[2, 3]), r(&[3, 4])], &|_, x| {
        x[0].matmul(&x[1])
    });
    check(
        "batched matmul",
        &[r(&[2, 2, 3]), r(&[2, 3, 2])],
        &|_, x| x[0].matmul(&x[1]),
    );
    check(
        "batch × 2-D matmul",
        &[r(&[2, 2, 3]), r(&[3, 2])],
        &|_, x| x[0].matmul(&x[1]),
    );
    check("transposed matmul", &[r(&[3, 2]), r(&[3, 4])], &|_, x| {
        x[0].transpose(0, 1)?.matmul(&x[1])
    });
    check("reshape", &[r(&[2, 3])], &|_, x| {
        x[0].reshape(&[3, 2])?.exp()
    });
    check("sum", &[r(&[2, 3])], &|_, x| x[0].sum(1, false));
    check("mean", &[r(&[2, 3])], &|_, x| x[0].mean(0, true));
    check("softmax", &[r(&[2, 4])], &|_, x| x[0].softmax(-1));
    check("log_softmax", &[r(&[2, 4])], &|_, x| x[0].log_softmax(-1));
    check("layer_norm", &[r(&[3, 4]), r(&[4]), r(&[4])], &|_, x| {
        x[0].layer_norm(&x[1], &x[2], 1e-5)
    });
    let window = Window2d {
        stride: [1, 1],
        padding: [1, 1],
    };
    check(
        "conv2d",
        &[r(&[1, 2, 4, 4]), r(&[3, 2, 3, 3])],
        &move |_, x| x[0].conv2d(&x[1], window),
    );
    let pool = Window2d {
        stride: [2, 2],
        padding: [0, 0],
    };
    check("max_pool2d", &[r(&[1, 2, 4, 4])], &move |_, x| {
        x[0].max_pool2d([2, 2], pool)
    });
    check("avg_pool2d", &[r(&[1, 2, 4, 4])], &move |_, x| {
        x[0].avg_pool2d([2, 2], pool)
    });
    check("embedding", &[r(&[5, 3])], &|s, x| {
        x[0].embedding(&s.tensor(&[4.0, 0.0, 4.0, 2.0], &[2, 2])?)
    });
    check("cross_entropy", &[r(&[3, 4])], &|s, x| {
        x[0].cross_entropy(&s.tensor(&[1.0, 3.0, 0.0], &[3])?)
    });
}

#[test]
fn gradients_accumulate_until_cleared_and_backward_runs_once() {
    let s = session();
    let p = s.param(&[1.0, 2.0], &[2]).unwrap();
    for _ in 0..2 {
        let loss = p.value().mul(&p.value()).unwrap().sum(0, false).unwrap();
        loss.backward().unwrap();
    }
    assert_eq!(p.grad().unwrap().to_vec().unwrap(), vec![4.0, 8.0]);
    p.zero_grad();
    assert!(p.grad().is_none());
    let loss = p.value().exp().unwrap().sum(0, false).unwrap();
    loss.backward().unwrap();
    assert!(
        loss.backward().is_err(),
        "the graph's saved tensors are gone"
    );
    let constant = s.tensor(&[1.0], &[1]).unwrap();
    assert!(constant.backward().is_err(), "nothing to differentiate");
    assert!(p.value().backward().is_err(), "not one element");
}

/// A small GPT-style decoder trained with Adam.
fn train_transformer(budget: Option<u64>, steps: usize) -> (Vec<f32>, u64, dtr::Stats, usize) {
    train_transformer_marking(budget, steps, false)
}

/// [`train_transformer`], marking the end of each step when `mark_steps`.
fn train_transformer_marking(
    budget: Option<u64>,
    steps: usize,
    mark_steps: bool,
) -> (Vec<f32>, u64, dtr::Stats, usize) {
    let config = Config::default().with_budget(budget.into());
    try_train_transformer(config, steps, mark_steps).unwrap()
}

/// [`train_transformer_marking`] under any config, failing as the session does.
fn try_train_transformer(
    config: Config,
    steps: usize,
    mark_steps: bool,
) -> dtr::Result<(Vec<f32>, u64, dtr::Stats, usize)> {
    let s = Session::new(CpuBackend::new(), config)?;
    let mut rng = s.rng(3);
    let (vocab, dim, time, batch) = (11, 16, 16, 16);
    let embed = nn::Embedding::new(&s, vocab, dim, &mut rng)?;
    let blocks: Vec<_> = (0..6)
        .map(|_| nn::DecoderBlock::new(&s, dim, 2, &mut rng))
        .collect::<dtr::Result<_>>()?;
    let norm = nn::LayerNorm::new(&s, dim)?;
    let head = nn::Linear::new(&s, dim, vocab, &mut rng)?;
    let mut params = embed.params();
    for b in &blocks {
        params.extend(b.params());
    }
    params.extend(norm.params());
    params.extend(head.params());
    let mut adam = optim::Adam::new(1e-2);
    let mask = nn::causal_mask(&s, time)?;
    let tokens: Vec<f32> = (0..batch * (time + 1))
        .map(|i| ((i * 7) % vocab) as f32)
        .collect();
    let inputs: Vec<f32> = (0..batch)
        .flat_map(|b| tokens[b * (time + 1)..][..time].to_vec())
        .collect();
    let targets: Vec<f32> = (0..batch)
        .flat_map(|b| tokens[b * (time + 1) + 1..][..time].to_vec())
        .collect();
    let x = s.tensor(&inputs, &[batch, time])?;
    let y = s.tensor(&targets, &[batch * time])?;
    let mut losses = Vec::new();
    for _ in 0..steps {
        let mut h = embed.forward(&x)?;
        for b in &blocks {
            h = b.forward(&h, &mask)?;
        }
        let logits = head
            .forward(&norm.forward(&h)?)?
            .reshape(&[batch * time, vocab])?;
        let loss = logits.cross_entropy(&y)?;
        losses.push(loss.item()?);
        loss.backward()?;
        adam.step(&params)?;
        if mark_steps {
            s.mark_step()?;
        }
    }
    let (peak, stats) = (s.memory().peak_bytes, s.stats());
    drop((embed, blocks, norm, head, params, adam, mask, x, y));
    let left = s.with_interpreter(|dtr| dtr.tracked_tensors());
    Ok((losses, peak, stats, left))
}

#[test]
fn repeated_steps_follow_the_last_steps_plan_bitwise_like_unbounded() {
    let steps = 6;
    let (baseline, peak, _, _) = train_transformer(None, steps);
    for ratio in [0.5, 0.3] {
        let budget = (peak as f64 * ratio) as u64;
        let (losses, budgeted_peak, stats, left) =
            train_transformer_marking(Some(budget), steps, true);
        assert!(budgeted_peak <= budget, "ratio {ratio}");
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&losses), bits(&baseline), "ratio {ratio}");
        assert_eq!(left, 0);
        assert_eq!(stats.steps, steps as u64);
        // The first marked step records; every later one repeats it.
        assert_eq!(
            stats.planned_steps,
            steps as u64 - 2,
            "ratio {ratio}: {stats:?}"
        );
        assert!(stats.rematerializations > 0, "ratio {ratio} recomputes");
    }
}

#[test]
fn a_transformer_trains_under_a_budget_bitwise_like_unbounded() {
    let (baseline, peak, _, left) = train_transformer(None, 4);
    assert_eq!(left, 0, "every tensor released once the handles are gone");
    assert!(baseline[3] < baseline[0], "it learns: {baseline:?}");
    for ratio in [0.5, 0.3] {
        let budget = (peak as f64 * ratio) as u64;
        let (losses, budgeted_peak, stats, left) = train_transformer(Some(budget), 4);
        assert!(budgeted_peak <= budget, "ratio {ratio}");
        assert!(stats.rematerializations > 0, "ratio {ratio} recomputes");
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&losses), bits(&baseline), "ratio {ratio}");
        assert_eq!(left, 0);
    }
}

/// Under `hybrid`, the parameters and Adam's moments (constants: no history
/// recomputes them) may leave for host memory, so training runs under a
/// budget at which dropping alone runs out of memory, bit for bit like the
/// unbounded run.
#[test]
fn parameters_and_optimiser_state_swap_below_what_dropping_allows() {
    let steps = 3;
    let (baseline, peak, _, _) = train_transformer(None, steps);
    let budget = (peak as f64 * 0.12) as u64;
    let config = |restore| {
        Config::default()
            .with_budget_bytes(budget)
            .with_restore(restore)
    };
    let dropped = try_train_transformer(config(RestoreMode::Drop), steps, false);
    assert!(matches!(dropped, Err(dtr::Error::OutOfMemory { .. })));
    let (losses, budgeted_peak, stats, left) =
        try_train_transformer(config(RestoreMode::Hybrid), steps, false).unwrap();
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&losses), bits(&baseline));
    assert!(budgeted_peak <= budget);
    assert!(
        stats.swap_outs > 0 && stats.swap_ins + stats.prefetches > 0,
        "{stats:?}"
    );
    assert_eq!(left, 0);
}
