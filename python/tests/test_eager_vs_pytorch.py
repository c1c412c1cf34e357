"""``python/benchmarks/eager_vs_pytorch.py`` runs the Rust examples beside PyTorch.

It needs the examples built (``cargo build --release --examples``; ``cargo
test --release`` builds them too): without them the tests skip, except under
``CI``, where they must run.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "python" / "benchmarks" / "eager_vs_pytorch.py"

if not (REPO / "target" / "release" / "examples" / "mlp").exists():
    if os.environ.get("CI"):
        raise RuntimeError("target/release/examples/mlp is missing: build the examples first")
    pytest.skip("needs `cargo build --release --examples`", allow_module_level=True)


def bench(*flags: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--models", "mlp", "--threads", "1", *flags],
        capture_output=True, text=True, timeout=300, check=False)


def rows(stdout: str) -> list[dict]:
    return json.loads(stdout[stdout.index("["):])


def test_cpu_rows_compare_dtr_with_pytorch_and_match_losses_bitwise():
    done = bench("--json")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "dtr on cpu, PyTorch on cpu" in done.stdout
    (row,) = rows(done.stdout)
    assert row["model"] == "mlp" and row["backend"] == "cpu" and row["torch_device"] == "cpu"
    assert row["losses_match"], row
    assert row["dtr_steps_per_s"] > 0 and row["torch_steps_per_s"] > 0
    assert row["dtr_over_torch_step_time"] == pytest.approx(
        row["torch_steps_per_s"] / row["dtr_steps_per_s"])


def test_the_wgpu_backend_runs_beside_pytorch_on_the_device_asked_for():
    done = bench("--backend", "wgpu", "--torch-device", "cpu", "--json")
    if "no GPU adapter found" in done.stdout + done.stderr and not os.environ.get("DTR_REQUIRE_GPU"):
        pytest.skip("no GPU adapter (install a Vulkan driver, such as Mesa's lavapipe)")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "| losses within 1e-4 |" in done.stdout
    (row,) = rows(done.stdout)
    assert row["backend"] == "wgpu" and row["torch_device"] == "cpu" and row["losses_match"]


def test_pytorch_without_cuda_is_a_clear_error():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    done = bench("--backend", "wgpu")
    assert done.returncode != 0
    assert "PyTorch sees no CUDA device" in done.stdout + done.stderr
