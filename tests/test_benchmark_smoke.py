"""The headline benchmark runs end to end on the CPU at CI size (numbers are not checked here)."""

import importlib.util
import json
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_lstm_benchmark_quick_cpu(tmp_path):
    out = tmp_path / "lstm.json"
    plot = importlib.util.find_spec("matplotlib") is not None  # the [bench] extra; not in [test]
    cmd = [sys.executable, "benchmarks/lstm.py", "--device", "cpu", "--quick", "--steps", "2", "--repeats", "1",
           "--json", str(out), "--out", str(tmp_path / "results")] + (["--plot", str(tmp_path / "lstm.png")] if plot else [])  # fmt: skip
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "| config | section | mode |" in r.stdout
    records = json.loads(out.read_text())
    modes = {(x["section"], x["mode"]) for x in records}
    assert {("step", "fusetree"), ("step", "fusetree-jit"), ("step", "numpy"), ("cell", "fusetree")} <= modes
    for x in records:
        assert x["rel_err"] <= 1e-5, x
        if x["mode"] == "fusetree" and x["section"] == "step":
            assert x["launches_per_step"] == 3
    assert (tmp_path / "results" / "lstm_cpu.md").read_text().count("| fusetree") >= 2  # written by default
    if plot:
        assert (tmp_path / "lstm.png").stat().st_size > 1000


def test_char_lstm_example_trains_on_the_cpu():
    """examples/char_lstm.py --device cpu: the loss falls (CI size; the seed's model, jit mode)."""
    cmd = [sys.executable, "examples/char_lstm.py", "--device", "cpu", "--steps", "60", "--hidden", "32",
           "--batch", "8", "--seq", "12", "--sample", "40"]  # fmt: skip
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    line = next(x for x in r.stdout.splitlines() if x.startswith("loss "))
    first, last = float(line.split()[1]), float(line.split()[3])
    assert last < first - 0.3, line
    assert "sample:" in r.stdout


def test_train_benchmark_runs_on_the_cpu(tmp_path):
    out = tmp_path / "train.json"
    cmd = [sys.executable, "benchmarks/train_lstm.py", "--device", "cpu", "--batch", "4", "--hidden", "16",
           "--seq", "6", "--steps", "2", "--repeats", "1", "--check", "3", "--modes", "fusetree,fusetree-jit",
           "--json", str(out)]  # fmt: skip
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    rows = json.loads(out.read_text())["rows"]
    eager, jit = rows
    assert eager["losses"] == jit["losses"]  # the same steps from the same start: the same losses
    assert eager["launches_per_time_step"] > 0
