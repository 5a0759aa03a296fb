"""``omnigraph plan --timings RUN_DIR``: a run's node times predict other schedules, and a real run agrees."""

import json
import os

import pytest

from omnigraph.cli import main
from omnigraph.planning.whatif import steady_medians

from conftest import GRAPHS

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
SYNTH = str(GRAPHS / "synthetic_one_step_off.yaml")
COSTS = {"generate": 0.2, "reward": 0.02, "old_logprob": 0.04, "update": 0.14, "sync": 0.01}


def run_dir(tmp_path, *args) -> str:
    parent = tmp_path / f"runs{len(list(tmp_path.iterdir()))}"
    assert main(["run", SYNTH, *args, "--run-dir", str(parent), "--quiet"]) == 0
    (d,) = parent.iterdir()
    return str(d)


def plan_json(capsys, *args) -> dict:
    capsys.readouterr()
    assert main(["plan", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_steady_medians_leave_out_the_fill_and_the_waits():
    rows = [{"step": t, "timing_s/a": v, "timing_s/gen": 5.0, "timing_s/update_weights": 5.0}
            for t, v in enumerate([9.0, 8.0, 1.0, 3.0, 2.0, 7.0])]
    assert steady_medians(rows, fill=1) == {"a": 2.0}      # steps 2..4: the fill (1) and step 1 left out, last 1


@pytest.mark.slow
def test_a_sync_run_predicts_the_step_of_a_real_one_step_off_run(tmp_path, capsys):
    """Node times from a sync run (local executor) predict one-step-off; a one-step-off run on Ray, with
    its rollout and trainer actors in parallel, measures within 25% of that."""
    sync = run_dir(tmp_path, "schedule.mode=sync", "schedule.iterations=12", "--executor", "local")
    report = plan_json(capsys, SYNTH, "--timings", sync)     # the graph file declares no delays: any mode
    timings = report["timings"]
    assert all(abs(timings[n] - c) < 0.5 * c + 0.01 for n, c in COSTS.items()), timings
    rows = {r["schedule"]: r for r in report["schedules"]}
    assert rows["sync"]["current"] and rows["sync"]["measured_s"] > 0
    assert [rows[k]["staleness_bound"] for k in ("sync", "one_step_off", "async ahead 2")] == [0, 1, 2]
    serial = sum(timings.values())
    assert rows["sync"]["predicted_s"] == pytest.approx(serial, rel=0.05)
    off = rows["one_step_off"]["predicted_s"]
    assert off < 0.8 * rows["sync"]["predicted_s"] and rows["one_step_off"]["speedup"] > 1.25
    real = run_dir(tmp_path, "schedule.iterations=12", "--executor", "ray")
    measured = plan_json(capsys, "--timings", real)["schedules"][0]
    assert measured["schedule"] == "one_step_off" and measured["current"]
    assert measured["measured_s"] == pytest.approx(off, rel=0.25), (measured, off)


def test_table_names_the_bottleneck_and_the_gap(tmp_path, capsys):
    d = run_dir(tmp_path, "schedule.iterations=5", "nodes.generate.cost=0.05", "--executor", "local")
    capsys.readouterr()
    assert main(["plan", "--timings", d]) == 0         # the run's own config.yaml
    out = capsys.readouterr().out
    assert "one_step_off (this run)" in out and "async ahead 2" in out and "bottleneck" in out
    assert "measured:" in out and "s/step the node times do not explain" in out


def test_custom_delays_are_predicted_as_declared_only(tmp_path, capsys):
    d = run_dir(tmp_path, "schedule.iterations=4", "--executor", "local")
    text = open(SYNTH).read().replace("schedule: {mode: one_step_off", "schedule: {mode: custom")
    text = text.replace("- reward -> old_logprob", "- reward -> old_logprob: {delay: 1}")
    text = text.replace("- sync -> generate", "- sync -> generate: {delay: 1}")
    (tmp_path / "custom.yaml").write_text(text)
    report = plan_json(capsys, str(tmp_path / "custom.yaml"), "--timings", d)
    assert [r["schedule"] for r in report["schedules"]] == ["custom (declared delays)"]


@pytest.mark.parametrize("make, where", [
    (lambda p: p, "no config.yaml"),                                       # an empty folder, no graph
    (lambda p: (p / "config.yaml").write_text(open(SYNTH).read()) and p, "no metrics.jsonl"),
])
def test_a_folder_that_is_no_run_is_one_clear_error(tmp_path, capsys, make, where):
    folder = make(tmp_path)
    assert main(["plan", "--timings", str(folder)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and where in err and "--timings" in err and "Traceback" not in err


def test_too_few_steps_say_so(tmp_path, capsys):
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 0, "timing_s/generate": 0.1}) + "\n")
    assert main(["plan", SYNTH, "--timings", str(tmp_path)]) == 1
    assert "too few" in capsys.readouterr().err
