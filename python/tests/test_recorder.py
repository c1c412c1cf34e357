"""Tests of the PyTorch recorder. They need PyTorch; where it is not
installed, every test here is skipped (pytest says so in its summary)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed: the recorder tests need it")

from dtr_record import TraceRecorder, record_training  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def applies(events, aten_only=True):
    return [e for e in events if e.get("event") == "apply" and (not aten_only or e["op"].startswith("aten."))]


def unbounded_peak(events):
    """Replays a trace's memory with no budget: the peak bytes in use, and
    the peak of the bytes its ops allocated (puts, which existed before, left
    out). Also checks that the trace is well formed."""
    storage_of, refs, bytes_of = {}, {}, {}
    in_use = peak = puts = allocated_peak = 0

    def define(tid, storage):
        assert tid not in storage_of, f"id {tid} defined twice"
        storage_of[tid] = storage
        refs[storage] = refs.get(storage, 0) + 1

    for e in events[1:]:
        kind = e["event"]
        if kind == "put":
            define(e["id"], e["id"])
            bytes_of[e["id"]] = e["bytes"]
            in_use += e["bytes"]
            puts += e["bytes"]
        elif kind == "apply":
            for i in e["inputs"]:
                assert i in storage_of, f"input {i} of {e['op']} is not live"
            for out in e["outputs"]:
                if "alias_of" in out:
                    define(out["id"], storage_of[e["inputs"][out["alias_of"]]])
                else:
                    define(out["id"], out["id"])
                    bytes_of[out["id"]] = out["bytes"]
                    in_use += out["bytes"]
        elif kind == "del":
            storage = storage_of.pop(e["id"])
            refs[storage] -= 1
            if refs[storage] == 0:
                in_use -= bytes_of[storage]
        else:
            assert e["id"] in storage_of, f"{kind} of dead id {e['id']}"
        peak = max(peak, in_use)
        allocated_peak = max(allocated_peak, in_use - puts)
    return peak, allocated_peak


def test_records_each_aten_op_with_shapes_and_costs():
    x = torch.randn(4, 8)
    w = torch.randn(8, 3)
    with TraceRecorder() as rec:
        y = (x @ w).relu()
        y.sum().item()
    ops = [e["op"] for e in applies(rec.events)]
    assert ops == ["aten.mm.default", "aten.relu.default", "aten.sum.default"]
    mm = applies(rec.events)[0]
    assert mm["outputs"][0]["dims"] == [4, 3]
    assert mm["outputs"][0]["bytes"] == 4 * 3 * 4
    assert mm["outputs"][0]["dtype"] == "f32"
    assert all(e["cost"] > 0 for e in applies(rec.events))
    puts = [e for e in rec.events if e.get("event") == "put"]
    assert [p["dims"] for p in puts] == [[4, 8], [8, 3]]
    total = applies(rec.events)[2]["outputs"][0]["id"]
    assert {"event": "get", "id": total} in rec.events, "item() reads the sum"


class _Counter(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if any(isinstance(o, torch.Tensor) for o in torch.utils._pytree.tree_flatten(out)[0]):
            self.count += 1
        return out


def _small_step(model, optimizer, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(64, 32, generator=g)
    y = torch.randint(0, 10, (64,), generator=g)
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.item()


def _small_model():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    return model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


def test_op_count_matches_an_independent_count():
    model, optimizer = _small_model()
    _small_step(model, optimizer, 0)
    with _Counter() as counter:
        _small_step(model, optimizer, 1)
    with TraceRecorder() as rec:
        _small_step(model, optimizer, 2)
    assert counter.count > 20
    # In-place ops return their argument: a tensor output, recorded as one apply.
    assert len(applies(rec.events)) == counter.count


def test_views_are_aliases_of_their_input():
    x = torch.randn(6, 4)
    with TraceRecorder() as rec:
        v = x.view(24)
        t = x.t()
        c = t.contiguous()
        del v, t, c
    view, transpose, copy = applies(rec.events)
    assert view["outputs"][0] == {"id": view["outputs"][0]["id"], "bytes": 0, "alias_of": 0, "dims": [24], "dtype": "f32"}
    assert transpose["outputs"][0]["alias_of"] == 0 and transpose["outputs"][0]["bytes"] == 0
    assert "alias_of" not in copy["outputs"][0] and copy["outputs"][0]["bytes"] == 96


def test_releases_follow_pytorch_freeing_tensors():
    x = torch.randn(16, 16, requires_grad=True)
    with TraceRecorder() as rec:
        a = x.exp()  # saved by exp's backward (its result), so it outlives `del a`
        b = a.sum()
        released_before_backward = {e["id"] for e in rec.events if e.get("event") == "del"}
        del a
        deleted_after_del_a = {e["id"] for e in rec.events if e.get("event") == "del"}
        b.backward()
        del b
    exp = next(e for e in applies(rec.events) if e["op"] == "aten.exp.default")
    a_id = exp["outputs"][0]["id"]
    # Autograd saves exp's result as a detached alias of it.
    saved = next(e for e in applies(rec.events)
                 if e["op"] == "aten.detach.default" and e["inputs"] == [a_id])
    saved_id = saved["outputs"][0]["id"]
    assert a_id not in released_before_backward
    assert a_id in deleted_after_del_a, "the user's tensor goes with `del a`"
    assert saved_id not in deleted_after_del_a, "autograd still holds the storage"
    backward = next(i for i, e in enumerate(rec.events) if e.get("op") == "aten.mul.Tensor")
    assert saved["inputs"] == [a_id] and rec.events.index({"event": "del", "id": saved_id}) > backward
    peak, _ = unbounded_peak(rec.events)
    tensor = 16 * 16 * 4
    assert 3 * tensor <= peak < 4 * tensor, "x, exp's result and x's gradient, no more"


def test_inplace_ops_are_copy_on_write_and_rebind_views():
    x = torch.zeros(8)
    with TraceRecorder() as rec:
        v = x[2:4]
        x.add_(1.0)
        v.mul_(3.0)
        assert v.tolist() == [3.0, 3.0]
    add = next(e for e in applies(rec.events) if e["op"] == "aten.add_.Tensor")
    version = add["outputs"][0]
    assert version["bytes"] == 32 and version["dims"] == [8], "a new version of x's storage"
    after = rec.events[rec.events.index(add) + 1:]
    assert after[0] == {"event": "detach", "id": version["id"]}, "x was a put: the version stays a root"
    rebinds = [e for e in after if e.get("op") == "alias" and e["inputs"] == [version["id"]]]
    assert len(rebinds) == 2, "x and its view v are re-made on the new version"
    mul = next(e for e in applies(rec.events) if e["op"] == "aten.mul_.Tensor")
    assert mul["inputs"][0] in {r["outputs"][0]["id"] for r in rebinds}, "v was rebound"
    assert "dims" not in mul["outputs"][0], "v does not cover its storage"
    peak, allocated = unbounded_peak(rec.events)
    assert peak == 64 and allocated == 32, "copy-on-write holds both versions while the op runs"


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


def test_recorded_peak_matches_the_pytorch_allocator_within_10_percent():
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512), torch.nn.ReLU(),
        torch.nn.Linear(512, 10),
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    def batch(step):
        g = torch.Generator().manual_seed(step)
        return torch.randn(512, 256, generator=g), torch.randint(0, 10, (512,), generator=g)

    def step(seed):
        x, y = batch(seed)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        loss.item()

    step(0)  # optimiser state exists from here on, as in the recorded step
    expected = _pytorch_peak(lambda: step(1))
    rec = record_training(model, batch, torch.nn.functional.cross_entropy, optimizer, None, steps=1)
    # The trace counts what existed before the step (parameters, momentum) as
    # puts; the profiler counts only what the step allocates.
    _, recorded = unbounded_peak(rec.events)
    assert expected > 1_000_000
    print(f"recorded peak {recorded} B, PyTorch's {expected} B")
    assert abs(recorded - expected) <= 0.10 * expected, (recorded, expected)


def test_command_line_records_a_torchvision_model(tmp_path):
    pytest.importorskip("torchvision", reason="torchvision is not installed")
    out = tmp_path / "resnet18.jsonl"
    env = dict(os.environ, PYTHONPATH=str(ROOT / "python"))
    result = subprocess.run(
        [sys.executable, "-m", "dtr_record", "--model", "torchvision:resnet18", "--batch", "2",
         "--image", "32", "--classes", "10", "--warmup", "0", "--out", str(out)],
        env=env, capture_output=True, text=True, check=False,
    )
    assert result.returncode == 0, result.stderr
    import json

    events = [json.loads(line) for line in out.read_text().splitlines()]
    assert events[0] == {"format": "dtr-trace", "version": 2}
    ops = {e["op"] for e in applies(events)}
    assert "aten.convolution.default" in ops and "aten.convolution_backward.default" in ops
    unbounded_peak(events)
    dtr = ROOT / "target" / "release" / "dtr"
    if dtr.exists():
        replay = subprocess.run([str(dtr), "replay", str(out), "--ratio", "0.9"],
                                capture_output=True, text=True, check=False)
        assert replay.returncode == 0, replay.stderr


def test_command_line_names_a_bad_model():
    env = dict(os.environ, PYTHONPATH=str(ROOT / "python"))
    result = subprocess.run(
        [sys.executable, "-m", "dtr_record", "--model", "resnet50", "--out", "x.jsonl"],
        env=env, capture_output=True, text=True, check=False,
    )
    assert result.returncode != 0
    assert "expected MODULE:NAME" in result.stderr
