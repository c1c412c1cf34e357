"""``dtr.torch.record`` and ``python -m dtr.torch.record``: traces of real
training steps, checked event by event and replayed with ``dtr replay``."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import dtr.torch

ROOT = Path(__file__).resolve().parents[2]
DTR = ROOT / "target" / "release" / "dtr"


def read(path):
    events = [json.loads(line) for line in Path(path).read_text().splitlines()]
    assert events[0] == {"format": "dtr-trace", "version": 4}
    assert events[-1] == {"event": "end", "events": len(events) - 2}
    return events[1:-1]


def applies(events):
    return [e for e in events if e["event"] == "apply"]


def peaks(events):
    """Replays a trace's memory with no budget, checking it is well formed:
    (peak bytes in use, peak of the bytes beyond the puts before the first op)."""
    bytes_of, in_use, peak, base, started = {}, 0, 0, 0, False
    for e in events:
        kind = e["event"]
        if kind == "put":
            assert e["id"] not in bytes_of
            bytes_of[e["id"]] = e["bytes"]
            in_use += e["bytes"]
            if not started:
                base += e["bytes"]
        elif kind == "apply":
            started = True
            for i in e["inputs"]:
                assert i in bytes_of, f"input {i} of {e['op']} is not live"
            for out in e["outputs"]:
                assert "alias_of" not in out, "one tensor per storage: no views"
                bytes_of[out["id"]] = out["bytes"]
                in_use += out["bytes"]
        elif kind == "del":
            in_use -= bytes_of.pop(e["id"])
        else:
            assert e["id"] in bytes_of, f"{kind} of dead id {e['id']}"
        peak = max(peak, in_use)
    return peak, peak - base


def replay(path, ratio):
    if not DTR.exists():
        pytest.skip(f"{DTR} is not built (cargo build --release)")
    result = subprocess.run([str(DTR), "replay", str(path), "--ratio", str(ratio), "--json"],
                            capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))


def test_ops_carry_costs_and_modules_and_state_is_put_first(tmp_path):
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x, y = torch.randn(16, 32), torch.randint(0, 10, (16,))
    torch.nn.functional.cross_entropy(model(x), y).backward()
    optimizer.step()  # momentum buffers exist from here on
    with dtr.torch.record(tmp_path / "t.jsonl", model, optimizer):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        loss.item()
    events = read(tmp_path / "t.jsonl")
    state = [p for p in model.parameters()] + [
        s["momentum_buffer"] for s in optimizer.state.values()]
    assert all(e["event"] == "put" for e in events[:len(state)])
    assert sorted(e["bytes"] for e in events[:len(state)]) == sorted(
        t.untyped_storage().nbytes() for t in state), "parameters and momentum, put first"
    ops = applies(events)
    assert all(e["cost"] > 0 for e in ops)
    forward = [(e["op"], e.get("module")) for e in ops[:3]]
    assert forward == [("aten.addmm.default", "Sequential.0"), ("aten.relu.default", "Sequential.1"),
                       ("aten.addmm.default", "Sequential.2")]
    assert any(e.get("module") == "Sequential.0" and e["op"] == "aten.mm.default" for e in ops), \
        "backward ops name their module too"
    loss_id = next(e for e in ops if e["op"] == "aten.nll_loss_forward.default")["outputs"][0]["id"]
    assert {"event": "get", "id": loss_id} in events, "loss.item() reads the loss"


def test_an_op_costs_the_least_time_measured_for_its_op_and_sizes(tmp_path):
    # Timings of small ops are mostly noise; DTR's choices then flip from
    # run to run. The same op on the same sizes is charged the least time
    # measured for it so far, so its recorded costs never rise.
    torch.manual_seed(0)
    w = torch.randn(32, 32) / 8
    h = torch.randn(4, 32)
    with dtr.torch.record(tmp_path / "t.jsonl", w, h):
        for _ in range(60):
            h = torch.tanh(h @ w)
    ops = applies(read(tmp_path / "t.jsonl"))
    by_signature = {}
    for e in ops:
        signature = (e["op"], tuple(o["bytes"] for o in e["outputs"]), len(e["inputs"]))
        by_signature.setdefault(signature, []).append(e["cost"])
    repeated = [costs for costs in by_signature.values() if len(costs) >= 50]
    assert len(repeated) == 2, f"mm and tanh, 60 times each: {by_signature.keys()}"
    for costs in repeated:
        assert all(later <= earlier for earlier, later in zip(costs, costs[1:])), costs


def test_lazily_created_optimizer_state_counts_from_its_creation(tmp_path):
    model = mlp()
    optimizer = torch.optim.AdamW(model.parameters())
    with dtr.torch.record(tmp_path / "t.jsonl", model):
        torch.nn.functional.cross_entropy(model(torch.randn(16, 32)),
                                          torch.randint(0, 10, (16,))).backward()
        optimizer.step()
    events = read(tmp_path / "t.jsonl")
    made = {o["id"]: e["op"] for e in applies(events) for o in e["outputs"]}
    detached = [e["id"] for e in events if e["event"] == "detach"]
    zeros = [t for t in detached if made.get(t) == "aten.zeros_like.default"]
    assert len(zeros) == 2 * len(list(model.parameters())), "exp_avg and exp_avg_sq per parameter"
    assert not any(e["event"] == "del" and e["id"] in zeros for e in events), "state persists"


def test_in_place_writes_under_grad_are_new_versions_and_frees_are_dels(tmp_path):
    x = torch.randn(64, 64, requires_grad=True)
    with dtr.torch.record(tmp_path / "t.jsonl", x):
        a = x.sin()
        a.add_(1.0)  # sin saved x, not a: a may change
        b = a.exp()  # exp saves its result: b outlives `del b`
        total = b.sum()
        del a, b
        total.backward()
        del total
    events = read(tmp_path / "t.jsonl")
    ops = {}
    for e in applies(events):
        ops.setdefault(e["op"], e)  # the first of each
    sin, add, exp = ops["aten.sin.default"], ops["aten.add_.Tensor"], ops["aten.exp.default"]
    old = sin["outputs"][0]["id"]
    assert add["inputs"] == [old] and add["outputs"][0]["bytes"] == 64 * 64 * 4
    assert events[events.index(add) + 1] == {"event": "del", "id": old}, "the old version goes"
    b_id = exp["outputs"][0]["id"]
    freed = events.index({"event": "del", "id": b_id})
    assert freed > events.index(ops["aten.mul.Tensor"]), "autograd held exp's result until backward"
    peak, _ = peaks(events)
    assert peak < 6 * 64 * 64 * 4


def _pytorch_peak(step):
    """PyTorch's CPU allocator, as its profiler reports it: the peak of bytes
    allocated minus freed during ``step``."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    events.sort(key=lambda e: e.start_ns())
    running = peak = 0
    for e in events:
        running += e.nbytes()
        peak = max(peak, running)
    return peak


def test_recorded_peak_matches_the_pytorch_allocator_within_10_percent(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512), torch.nn.ReLU(),
        torch.nn.Linear(512, 10),
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    def step(seed):
        g = torch.Generator().manual_seed(seed)
        x, y = torch.randn(512, 256, generator=g), torch.randint(0, 10, (512,), generator=g)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        loss.item()

    step(0)  # optimizer state exists from here on, as in the recorded step
    expected = _pytorch_peak(lambda: step(1))
    with dtr.torch.record(tmp_path / "t.jsonl", model, optimizer):
        step(1)
    # The profiler counts what the step allocates; the trace also puts
    # what existed before it (parameters, momentum).
    _, recorded = peaks(read(tmp_path / "t.jsonl"))
    assert expected > 1_000_000
    assert abs(recorded - expected) <= 0.10 * expected, (recorded, expected)


class LanguageModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(100, 32)
        self.lstm = torch.nn.LSTM(32, 48, num_layers=2, batch_first=True)
        self.head = torch.nn.Linear(48, 100)

    def forward(self, tokens):
        return self.head(self.lstm(self.embed(tokens))[0])


def test_a_language_model_step_replays_under_budget_with_dtr(tmp_path):
    torch.manual_seed(0)
    model = LanguageModel()
    optimizer = torch.optim.AdamW(model.parameters())
    tokens = torch.randint(0, 100, (16, 40))
    with dtr.torch.record(tmp_path / "lm.jsonl", model, optimizer):
        for _ in range(2):
            logits = model(tokens[:, :-1])
            loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            del logits, loss
    events = read(tmp_path / "lm.jsonl")
    assert any(e.get("module") == "LanguageModel.lstm" for e in applies(events))
    peak, _ = peaks(events)
    report = replay(tmp_path / "lm.jsonl", 0.9)
    assert report["status"] == "ok", report
    assert report["peak_bytes"] <= 0.9 * report["baseline_peak_bytes"] + 1
    assert abs(report["baseline_peak_bytes"] - peak) <= 0.01 * peak


def test_a_step_taking_the_gradient_of_its_input_records(tmp_path):
    # An input-gradient penalty: `autograd.grad` with respect to a leaf
    # that a module reads. PyTorch's own module tracker fails on it ("A
    # leaf node was passed to _will_engine_execute_node"); stock PyTorch,
    # and the recorder, do not.
    model = mlp()
    x = torch.randn(16, 32, requires_grad=True)

    def step():
        y = model(x).square().sum()
        (grad,) = torch.autograd.grad(y, x, create_graph=True)
        (y + grad.square().sum()).backward()

    step()  # warm-up: first calls' times are not the op's
    with dtr.torch.record(tmp_path / "penalty.jsonl", model):
        step()
    events = read(tmp_path / "penalty.jsonl")
    ops = applies(events)
    assert [e.get("module") for e in ops[:3]] == ["Sequential.0", "Sequential.1", "Sequential.2"]
    peak, _ = peaks(events)  # well formed
    report = replay(tmp_path / "penalty.jsonl", 1.0)
    assert report["status"] == "ok" and report["baseline_peak_bytes"] == peak, report


def test_a_trace_that_cannot_be_written_is_an_error_before_anything_runs(tmp_path):
    with pytest.raises(OSError, match="cannot write a trace"):
        with dtr.torch.record(tmp_path / "missing" / "t.jsonl"):
            pytest.fail("the body must not run")
    with pytest.raises(TypeError, match="not str"):
        dtr.torch.record(tmp_path / "t.jsonl", "model")


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "dtr.torch.record", *args],
                          capture_output=True, text=True, check=False)


def test_command_line_records_gpt2_for_dtr_replay(tmp_path):
    pytest.importorskip("transformers", reason="transformers is not installed")
    out = tmp_path / "gpt2.jsonl"
    result = run_cli("--model", "transformers:gpt2", "--config",
                     "n_layer=2,n_embd=64,n_head=4,vocab_size=256,n_positions=64",
                     "--batch", "4", "--seq", "64", "--out", str(out))
    assert result.returncode == 0, result.stderr
    events = read(out)
    assert any(e.get("module", "").startswith("GPT2LMHeadModel.transformer.h.1")
               for e in applies(events))
    peaks(events)
    report = replay(out, 0.8)
    assert report["status"] == "ok", report


def record_vision(tmp_path, name, image):
    """The applies of a torchvision model's step recorded by the CLI
    (batch 2, 10 classes, no warm-up)."""
    pytest.importorskip("torchvision", reason="torchvision is not installed")
    out = tmp_path / f"{name}.jsonl"
    result = run_cli("--model", f"torchvision:{name}", "--batch", "2", "--image", str(image),
                     "--classes", "10", "--warmup", "0", "--out", str(out))
    assert result.returncode == 0, result.stderr
    return applies(read(out))


def test_command_line_records_a_torchvision_model(tmp_path):
    ops = {e["op"] for e in record_vision(tmp_path, "resnet18", 32)}
    assert "aten.convolution.default" in ops and "aten.convolution_backward.default" in ops


def test_command_line_records_a_model_with_auxiliary_heads(tmp_path):
    # GoogLeNet returns a named tuple in training: every head counts.
    modules = {e.get("module", "") for e in record_vision(tmp_path, "googlenet", 64)}
    assert any(m.startswith("GoogLeNet.aux1.") for m in modules), sorted(modules)[:20]


def test_command_line_records_an_encoder_decoder_language_model(tmp_path):
    pytest.importorskip("transformers", reason="transformers is not installed")
    out = tmp_path / "t5.jsonl"
    result = run_cli("--model", "transformers:t5", "--config",
                     "num_layers=1,num_decoder_layers=1,d_model=32,d_ff=64,num_heads=2,"
                     "d_kv=16,vocab_size=128", "--batch", "2", "--seq", "16",
                     "--out", str(out))
    assert result.returncode == 0, result.stderr
    modules = {e.get("module", "") for e in applies(read(out))}
    assert any(".decoder." in m for m in modules), sorted(modules)[:20]
    report = replay(out, 0.8)
    assert report["status"] == "ok", report


def test_command_line_records_the_bench_lstm_language_model(tmp_path):
    out = tmp_path / "lstm.jsonl"
    result = run_cli("--model", "bench:lstm", "--quick", "--out", str(out))
    assert result.returncode == 0, result.stderr
    ops = {e["op"] for e in applies(read(out))}
    assert "aten.embedding.default" in ops and "aten.embedding_dense_backward.default" in ops
    report = replay(out, 0.8)
    assert report["status"] == "ok", report


@pytest.mark.parametrize("args, message", [
    (["--model", "resnet50"], "expected SOURCE:NAME"),
    (["--model", "bench:vgg"], "expected one of gpt2, lstm, resnet50"),
    (["--model", "torchvision:resnet51"], "resnet51"),
    (["--model", "transformers:gpt2", "--config", "n_layer"], "expected key=value"),
    (["--model", "torchvision:resnet18", "--batch", "0"], "--batch must be at least 1"),
    (["--model", "bench:lstm", "--device", "nonsense"], "--device 'nonsense'"),
    (["--model", "bench:lstm", "--out", "/nonexistent/x.jsonl"],
     "not a file in an existing directory"),
])
def test_command_line_names_bad_arguments(tmp_path, args, message):
    if "torchvision" in args[1]:
        pytest.importorskip("torchvision", reason="torchvision is not installed")
    if "transformers" in args[1]:
        pytest.importorskip("transformers", reason="transformers is not installed")
    if "--out" not in args:
        args = [*args, "--out", str(tmp_path / "x.jsonl")]
    result = run_cli(*args)
    assert result.returncode != 0
    assert message in result.stderr
