"""``runtime.loggers: [tensorboard]``: every step's metrics as TensorBoard scalars, each step once after a restart."""

import json

import pytest

from omnigraph.cli import main
from omnigraph.planning import compile as og_compile
from omnigraph.errors import GraphError

from conftest import GRAPHS

SYNTH = str(GRAPHS / "synthetic_one_step_off.yaml")


def scalars(run_dir, tag):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    acc = EventAccumulator(str(run_dir / "tensorboard"))
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars(tag)]


def one_run(tmp_path, *overrides):
    assert main(["run", SYNTH, "nodes.generate.cost=0", "runtime.loggers=[tensorboard]", *overrides,
                 "--executor", "local", "--run-dir", str(tmp_path), "--quiet"]) == 0
    (run_dir,) = tmp_path.iterdir()
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return run_dir, rows


def test_every_numeric_metric_reaches_tensorboard(tmp_path):
    run_dir, rows = one_run(tmp_path, "schedule.iterations=6")
    want = [(r["step"], r["reward_mean"]) for r in rows if "reward_mean" in r]
    got = scalars(run_dir, "reward_mean")
    assert [s for s, _ in got] == [s for s, _ in want]
    assert all(abs(a - b) < 1e-5 for (_, a), (_, b) in zip(got, want))
    assert len(scalars(run_dir, "timing_s/update")) == sum("timing_s/update" in r for r in rows)


def test_a_restarted_run_shows_each_step_once(tmp_path, monkeypatch):
    monkeypatch.setenv("OMNIGRAPH_INJECT", "update@7:raise")
    run_dir, rows = one_run(tmp_path, "schedule.iterations=10", "checkpoint.every=4", "runtime.max_restarts=1")
    assert (run_dir / "restarts.jsonl").exists()
    steps = [s for s, _ in scalars(run_dir, "step_s")]
    assert steps == sorted(set(steps)) == [r["step"] for r in rows], steps


def test_a_logger_whose_package_is_missing_is_named(monkeypatch):
    from omnigraph.runtime import loggers
    monkeypatch.setattr(loggers.TensorBoard, "missing", staticmethod(lambda: "no_such_package_for_omnigraph"))
    with pytest.raises(GraphError) as e:
        og_compile(SYNTH, overrides=["runtime.loggers=[tensorboard]"])
    assert e.value.where == "runtime.loggers" and "pip install" in str(e.value)
