"""``python -m dtr.torch.bench --quick`` runs end to end, its dtr rows bitwise equal to stock,
with and without marked steps."""

import importlib.util
import json
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


def test_marked_steps_follow_plans_and_stay_bitwise(tmp_path):
    out = tmp_path / "rows.json"
    result = subprocess.run(
        [sys.executable, "-m", "dtr.torch.bench", "--quick", "--models", "lstm", "--steps", "3",
         "--ratios", "0.5", "--mark-steps", "--heuristic", "dtr-next", "--json", str(out)],
        capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    rows = {row["row"]: row for row in json.loads(out.read_text())["rows"]}
    budgeted = rows["dtr 0.5× peak"]
    assert budgeted["bitwise"], budgeted
    assert budgeted["heuristic"] == "dtr-next" and budgeted["mark_steps"]
    # Marked after the warm-up and each measured step: under dtr-next the
    # step after the recorded one looks ahead, and the last follows its plan.
    assert budgeted["planned_steps"] >= 1, budgeted
    assert budgeted["rematerializations"] > 0, budgeted


@pytest.mark.parametrize("args, message", [
    (["--ratios", "nan"], "--ratios must be fractions of the peak"),
    (["--ratios=-0.5"], "--ratios must be fractions of the peak"),
    (["--steps", "0"], "--steps must be at least 1"),
    (["--heuristic", "nonsense"], "unknown heuristic 'nonsense'"),
    (["--device", "nonsense"], "--device 'nonsense'"),
    (["--json", "/nonexistent/rows.json"], "its directory does not exist"),
])
def test_bad_arguments_are_refused_before_any_run(args, message):
    result = subprocess.run(
        [sys.executable, "-m", "dtr.torch.bench", "--quick", "--models", "lstm", *args],
        capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 2, result.stdout + result.stderr
    assert message in result.stderr and "Traceback" not in result.stderr, result.stderr
    assert "###" not in result.stdout, "nothing ran"
