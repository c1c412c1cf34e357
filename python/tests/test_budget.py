"""dtr.torch.budget on real PyTorch: training under a budget equals stock PyTorch, bit for bit."""

import copy
import threading

import pytest

torch = pytest.importorskip("torch")
import dtr  # noqa: E402  (built by `pip install ./python`; a missing build fails, not skips)
import dtr.torch as dtr_torch  # noqa: E402

MiB = 2**20


def train(model, make_optimizer, batches, loss_fn, limit="stock", seed=0, mark_steps=False,
          session=None, heuristic="dtr"):
    """Trains a copy of `model` one step per batch (ending each with
    `mark_step` when `mark_steps`), under `session` if given, else under a
    budget of `limit`; returns the losses, the gradients of every step, the
    final parameters, the session (or None) and the next numbers of the
    global generator."""
    model = copy.deepcopy(model)
    optimizer = make_optimizer(model.parameters())
    losses, grads = [], []

    def steps():
        for batch in batches:
            loss = loss_fn(model, batch)
            loss.backward()
            # Host copies, kept as numpy arrays until the session ends: on
            # CPU a torch tensor made from them (`torch.from_numpy`, which
            # dispatches `lift_fresh`) would be adopted into the budget, and
            # the harness would crowd it a little more each step.
            grads.append([p.grad.numpy().copy() for p in model.parameters()])
            optimizer.step()
            optimizer.zero_grad()
            losses.append(loss.detach().numpy().copy())
            if mark_steps:
                import gc; gc.collect()
                session.mark_step()

    torch.manual_seed(seed)
    if session is None and limit == "stock":
        assert not mark_steps
        steps()
    else:
        with session or dtr_torch.budget(limit, heuristic=heuristic) as session:
            steps()
            session.check()
    after = torch.rand(4)  # where the global generator was left
    params = [p.detach().clone() for p in model.parameters()]
    losses = [torch.from_numpy(loss) for loss in losses]
    grads = [[torch.from_numpy(g) for g in step] for step in grads]
    return losses, grads, params, session, after


def assert_bitwise(expected, actual):
    e_losses, e_grads, e_params, _, e_after = expected
    a_losses, a_grads, a_params, _, a_after = actual
    for step, (e, a) in enumerate(zip(e_losses, a_losses)):
        assert torch.equal(e, a), f"step {step}: loss {e.item()} != {a.item()}"
    for step, (es, as_) in enumerate(zip(e_grads, a_grads)):
        for k, (e, a) in enumerate(zip(es, as_)):
            assert torch.equal(e, a), f"step {step}: gradient {k} differs"
    for e, a in zip(e_params, a_params):
        assert torch.equal(e, a)
    assert torch.equal(e_after, a_after), "the global generator was left elsewhere"


def mlp():
    torch.manual_seed(0)
    layers = []
    for _ in range(24):
        layers += [torch.nn.Linear(32, 32), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers, torch.nn.Linear(32, 10))
    batches = [(torch.randn(2048, 32), torch.randint(0, 10, (2048,))) for _ in range(2)]
    loss = lambda m, b: torch.nn.functional.cross_entropy(m(b[0]), b[1])  # noqa: E731
    return model, lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9), batches, loss


def convnet():
    torch.manual_seed(0)
    def block(c_in, c_out):
        return [torch.nn.Conv2d(c_in, c_out, 3, padding=1, bias=False),
                torch.nn.BatchNorm2d(c_out), torch.nn.ReLU(inplace=True)]
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3, padding=1),
        *[layer for _ in range(6) for layer in block(16, 16)], torch.nn.MaxPool2d(2),
        *block(16, 32), *block(32, 32), *block(32, 32), torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(), torch.nn.Linear(32, 10))
    batches = [(torch.randn(32, 3, 16, 16), torch.randint(0, 10, (32,))) for _ in range(2)]
    loss = lambda m, b: torch.nn.functional.cross_entropy(m(b[0]), b[1])  # noqa: E731
    return model, lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9), batches, loss


def transformer():
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[
        torch.nn.TransformerEncoderLayer(32, 4, 64, dropout=0.1, batch_first=True)
        for _ in range(4)])
    batches = [torch.randn(16, 96, 32) for _ in range(2)]
    loss = lambda m, x: m(x).square().mean()  # noqa: E731
    return model, lambda p: torch.optim.AdamW(p, lr=1e-3), batches, loss


class LanguageModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(100, 32)
        self.lstm = torch.nn.LSTM(32, 48, num_layers=4, batch_first=True, dropout=0.1)
        self.head = torch.nn.Linear(48, 100)

    def forward(self, tokens):
        hidden, _ = self.lstm(self.embed(tokens))
        return self.head(hidden)


def lstm():
    torch.manual_seed(0)
    model = LanguageModel()
    batches = [torch.randint(0, 100, (96, 40)) for _ in range(2)]

    def loss(m, tokens):
        logits = m(tokens[:, :-1])
        return torch.nn.functional.cross_entropy(logits.reshape(-1, 100), tokens[:, 1:].reshape(-1))
    return model, lambda p: torch.optim.Adam(p, lr=1e-3), batches, loss


MODELS = {"mlp": mlp, "convnet": convnet, "transformer": transformer, "lstm": lstm}


def check_under_ratios(model, make_optimizer, batches, loss, ratios):
    """Trains stock, tracked without a limit, then under each ratio of the
    tracked peak: every run bitwise equal to stock, within its budget, and
    evicting and recomputing."""
    stock = train(model, make_optimizer, batches, loss)
    tracked = train(model, make_optimizer, batches, loss, limit=None)
    assert_bitwise(stock, tracked)
    peak = tracked[3].stats()["peak_bytes"]
    assert peak > 0
    for ratio in ratios:
        budget = int(peak * ratio)
        run = train(model, make_optimizer, batches, loss, limit=budget)
        assert_bitwise(stock, run)
        stats = run[3].stats()
        assert stats["peak_bytes"] <= budget, (ratio, stats)
        assert stats["evictions"] > 0 and stats["rematerializations"] > 0, (ratio, stats)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_training_under_a_budget_is_bitwise_equal(name):
    check_under_ratios(*MODELS[name](), ratios=(0.5, 0.3))


def test_budgets_do_not_nest_and_the_outer_one_still_trains_bitwise():
    # Two sessions that both evict would recompute each other's evicted
    # storages from stale buffers: entering the second is refused.
    model, make_optimizer, batches, loss = mlp()
    stock = train(model, make_optimizer, batches, loss)
    peak = train(model, make_optimizer, batches, loss, limit=None)[3].stats()["peak_bytes"]
    with dtr_torch.budget(int(peak * 0.5)) as outer:
        with pytest.raises(RuntimeError, match="do not nest"):
            with dtr_torch.budget(int(peak * 0.4)):
                pass
        with dtr_torch.budget(None) as watching:  # tracking only: allowed
            run = train(model, make_optimizer, batches, loss)
    assert_bitwise(stock, run)
    assert outer.stats()["evictions"] > 0 and outer.stats()["rematerializations"] > 0
    assert watching.stats()["evictions"] >= 0


def test_a_session_runs_on_a_thread_other_than_its_makers():
    """On CUDA, PyTorch runs the backward pass on its own device thread and
    the session's dispatch mode follows it there, so the engine is called
    from a thread that did not make it. Here the whole run is on another
    thread: made on this one, trained on a worker, under half the peak."""
    model, make_optimizer, batches, loss = MODELS["mlp"]()
    stock = train(model, make_optimizer, batches, loss)
    peak = train(model, make_optimizer, batches, loss, limit=None)[3].stats()["peak_bytes"]
    budget = int(peak * 0.5)
    session = dtr_torch.budget(budget)
    outcome = {}

    def worker():
        try:
            outcome["run"] = train(model, make_optimizer, batches, loss, session=session)
        except BaseException as error:  # a Rust panic arrives as a BaseException
            outcome["error"] = error

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()
    assert "error" not in outcome, repr(outcome.get("error"))
    assert_bitwise(stock, outcome["run"])
    stats = session.stats()
    assert stats["peak_bytes"] <= budget and stats["rematerializations"] > 0, stats


@pytest.mark.parametrize("name", ["mlp", "convnet"])
def test_without_storage_data_swaps_rematerialisation_copies(name, monkeypatch):
    """PyTorch releases without `UntypedStorage._swap_data_ptr_` (2.11 has
    none) get a rematerialised storage's data by a copy: still bitwise equal."""
    from dtr.torch import _session

    def missing(*_):
        raise AttributeError("'torch.storage.UntypedStorage' object has no attribute "
                             "'_swap_data_ptr_'")

    monkeypatch.setattr(torch.UntypedStorage, "_swap_data_ptr_", missing, raising=False)
    monkeypatch.setattr(_session, "_SWAPS_DATA_PTR", False)
    model, make_optimizer, batches, loss = MODELS[name]()
    stock = train(model, make_optimizer, batches, loss)
    peak = train(model, make_optimizer, batches, loss, limit=None)[3].stats()["peak_bytes"]
    run = train(model, make_optimizer, batches, loss, limit=int(peak * 0.4))
    assert_bitwise(stock, run)
    assert run[3].stats()["rematerializations"] > 0


@pytest.mark.parametrize("name", ["mlp", "transformer"])
def test_marked_steps_train_bitwise_like_stock(name):
    model, make_optimizer, batches, loss = MODELS[name]()
    batches = batches * 2  # the same shapes again: a repeating step
    stock = train(model, make_optimizer, batches, loss)
    peak = train(model, make_optimizer, batches[:2], loss, limit=None)[3].stats()["peak_bytes"]
    budget = int(peak * 0.5)
    run = train(model, make_optimizer, batches, loss, limit=budget, mark_steps=True)
    assert_bitwise(stock, run)
    stats = run[3].stats()
    assert stats["peak_bytes"] <= budget, stats
    assert stats["steps"] == len(batches), stats
    # The first marked step is recorded; every later one repeats its ops and
    # follows its plan. The memory each step starts from is the same, so
    # the plans need no repair.
    assert stats["planned_steps"] == len(batches) - 2, stats
    assert stats["plan_repairs"] == 0, stats


def test_dtr_next_looks_ahead_from_the_last_marked_step():
    """Under `dtr-next` a marked step foresees when each tensor is next read
    from the step before: the third step runs the policy so, and the steps
    after it follow its plan (a plan made without foresight is not)."""
    model, make_optimizer, batches, loss = MODELS["lstm"]()
    batches = batches * 3
    stock = train(model, make_optimizer, batches, loss)
    peak = train(model, make_optimizer, batches[:2], loss, limit=None)[3].stats()["peak_bytes"]
    budget = int(peak * 0.5)
    run = train(model, make_optimizer, batches, loss, limit=budget, mark_steps=True,
                heuristic="dtr-next")
    assert_bitwise(stock, run)
    stats = run[3].stats()
    assert stats["peak_bytes"] <= budget, stats
    assert stats["rematerializations"] > 0, stats
    assert stats["planned_steps"] == len(batches) - 3, stats


def test_a_step_whose_memory_grows_repairs_its_plan_and_keeps_following():
    """Tensors kept from every step (here host copies of the gradients, which
    on CPU the budget adopts) leave less room each step than the plan had:
    the steps repair the plan where it falls short and keep following it."""
    model, make_optimizer, batches, loss_fn = MODELS["mlp"]()
    batches = batches * 3
    peak = train(model, make_optimizer, batches[:2], loss_fn, limit=None)[3].stats()["peak_bytes"]
    budget = int(peak * 0.5)
    optimizer = make_optimizer(model.parameters())
    kept = []
    with dtr_torch.budget(budget) as session:
        for batch in batches:
            loss_fn(model, batch).backward()
            kept += [torch.from_numpy(p.grad.numpy().copy()) for p in model.parameters()]
            optimizer.step()
            optimizer.zero_grad()
            session.mark_step()
        session.check()
    stats = session.stats()
    assert stats["peak_bytes"] <= budget, stats
    assert stats["planned_steps"] == len(batches) - 2, stats
    assert stats["plan_repairs"] > 0, stats


@pytest.mark.parametrize("heuristic", ["dtr", "dtr-next"])
def test_what_a_step_hands_to_the_next_is_state_not_history(heuristic):
    """A functional training loop (`torch.func`) replaces its parameters out
    of place: each step's parameters are results of the step before. At a
    mark they become constants, so no step's history reaches back: the
    engine's tracked tensors stay flat, and recomputations stay within the
    step (under `dtr-next` they ran back through earlier steps until the
    session gave up, at 0.75 of the peak)."""
    from torch.func import functional_call, grad_and_value

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 128), torch.nn.Tanh(),
                                torch.nn.Linear(128, 128), torch.nn.Tanh(),
                                torch.nn.Linear(128, 10))
    start = {name: p.detach().clone() for name, p in model.named_parameters()}
    batches = [(torch.randn(512, 32), torch.randint(0, 10, (512,))) for _ in range(3)]

    def loss_of(params, x, y):
        return torch.nn.functional.cross_entropy(functional_call(model, params, (x,)), y)

    def train_functionally(session=None, steps=9):
        params, losses, tracked = dict(start), [], []
        for step in range(steps):
            x, y = batches[step % len(batches)]
            grads, loss = grad_and_value(loss_of)(params, x, y)
            params = {name: params[name] - 0.05 * grads[name] for name in params}
            losses.append(loss.item())
            del grads, loss
            if session is not None:
                session.mark_step()
                tracked.append(session.stats()["tracked_tensors"])
        return losses, params, tracked

    expected_losses, expected_params, _ = train_functionally()
    with dtr_torch.budget(None) as session:
        train_functionally(session, steps=2)
    budget = int(session.stats()["peak_bytes"] * 0.75)
    with dtr_torch.budget(budget, heuristic=heuristic) as session:
        losses, params, tracked = train_functionally(session)
        session.check()
    assert losses == expected_losses
    for name in expected_params:
        assert torch.equal(expected_params[name], params[name]), name
    stats = session.stats()
    assert stats["peak_bytes"] <= budget and stats["evictions"] > 0, stats
    assert tracked[-1] == tracked[2], tracked


def test_a_repeating_step_follows_the_last_steps_plan():
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[layer for _ in range(24)
                                  for layer in (torch.nn.Linear(32, 32), torch.nn.ReLU())])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    x = torch.randn(2048, 32)

    def step():
        loss = model(x).square().mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return loss.item()

    with dtr_torch.budget(None) as session:
        step()
    budget = session.stats()["peak_bytes"] // 2
    with dtr_torch.budget(budget) as session:
        for _ in range(6):
            step()
            session.mark_step()
    stats = session.stats()
    assert stats["peak_bytes"] <= budget, stats
    # The first marked step is recorded; the later ones repeat it.
    assert stats["planned_steps"] >= 3, stats


def test_stats_have_the_documented_fields():
    with dtr_torch.budget("1GiB") as session:
        (torch.randn(100, requires_grad=True).exp().sum()).backward()
    stats = session.stats()
    for field in ("peak_bytes", "budget_bytes", "evictions", "rematerializations",
                  "remat_seconds", "ops", "constant_peak_bytes", "steps", "planned_steps",
                  "plan_repairs"):
        assert field in stats, field
    assert stats["budget_bytes"] == 2**30
    assert stats["ops"] > 0
    # Made inside the context, the leaf is recomputable like any result.
    assert stats["constant_peak_bytes"] == 0, stats
    weight = torch.randn(100, requires_grad=True)
    with dtr_torch.budget("1GiB") as session:
        weight.exp().sum().backward()
    # Made outside, it is a constant, and so is its gradient: 400 B each.
    assert session.stats()["constant_peak_bytes"] == 800


def test_every_heuristic_is_selectable():
    model, make_optimizer, batches, loss = mlp()
    stock = train(model, make_optimizer, batches[:1], loss)
    peak = train(model, make_optimizer, batches[:1], loss, limit=None)[3].stats()["peak_bytes"]
    for name, _ in dtr.heuristics():
        def run(limit):
            model_copy = copy.deepcopy(model)
            opt = make_optimizer(model_copy.parameters())
            torch.manual_seed(0)
            with dtr_torch.budget(limit, heuristic=name) as session:
                value = loss(model_copy, batches[0])
                value.backward()
                opt.step()
            assert session.stats()["evictions"] > 0, name
            return value.detach()
        # 0.7, not 0.5: at half the peak `size` (largest first) recomputes
        # about 4,400 ops for this step's 100, near the 50× limit on
        # recomputation, and measured op times sometimes put it past.
        assert torch.equal(run(int(peak * 0.7)), stock[0][0]), name
    with pytest.raises(ValueError, match="unknown heuristic"):
        dtr_torch.budget(None, heuristic="nope")


def test_sizes_parse_and_bad_ones_are_errors():
    assert dtr.parse_bytes("1.5GiB") == 3 * 2**29
    assert dtr.parse_bytes("800MB") == 800 * 10**6
    assert dtr.parse_bytes(4096) == 4096
    for bad in ("1.5 parsecs", "-1MB", "MiB", "nan GB"):
        with pytest.raises(ValueError):
            dtr.parse_bytes(bad)
    with pytest.raises(TypeError):
        dtr.parse_bytes(1.5)
