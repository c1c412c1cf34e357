"""``python -m dtr.torch.bench --quick`` runs end to end, its dtr rows bitwise equal to stock."""

import importlib.util
import subprocess
import sys

import pytest

pytest.importorskip("torch")


def test_quick_benchmark_runs_every_model_and_row():
    # Each model needs its library; the LSTM needs only torch.
    models = [name for name, library in (("resnet50", "torchvision"), ("gpt2", "transformers"),
                                         ("lstm", None))
              if library is None or importlib.util.find_spec(library) is not None]
    result = subprocess.run(
        [sys.executable, "-m", "dtr.torch.bench", "--quick", "--models", ",".join(models)],
        capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    for name in models:
        assert f"### {name}:" in result.stdout, result.stdout
    assert "bitwise" in result.stdout
    assert "added cost per ATen op under budget(None)" in result.stdout
    assert "a dispatch mode that only runs each op adds" in result.stdout
