"""``schedule.on_stale: wait`` on the real hf backend and every executor: a batch staler than
``max_staleness`` is generated again on the trainer with its current weights, checked again, and trained;
no prompt group is lost or trained twice."""

import json
import os

import pytest

import omnigraph as og
from omnigraph.runtime import run
from omnigraph.runtime.ledger import read

from conftest import GRAPHS

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
OVER = ["schedule.ahead=3", "schedule.max_staleness=1", "schedule.on_stale=wait", "schedule.iterations=8",
        "checkpoint.every=null"]


def wait_run(tmp_path, executor):
    plan = og.compile(GRAPHS / "grpo_async.yaml", overrides=OVER)
    assert plan.bound == 3 and any("will regenerate" in w for w in plan.warnings), plan.warnings
    return run(plan, run_dir=tmp_path / executor, executor=executor, progress=False)


def ledger_lines(run_dir):
    return [json.loads(x) for x in (run_dir / "ledger.jsonl").read_text().splitlines()]


def check(res):
    s = res.summary
    assert s["observed_max_staleness"] <= 1 and s["staleness_bound"] == 3, s
    assert s["groups_lost"] == 0 and s["groups_trained_twice"] == 0 and s["groups_trained"] == 8 * 16, s
    assert s["regenerated_samples"] > 0 and s["regenerate_s"] > 0, s
    ledger = read(res.run_dir)
    assert ledger.ok and set(ledger.staleness) <= {0, 1} and ledger.regenerated > 0
    events = ledger_lines(res.run_dir)
    trained = {e["group"]: e for e in events if e["event"] == "trained"}
    for e in (e for e in events if e["event"] == "regenerated"):     # sampled with the weights it trains on
        assert e["version"] == trained[e["group"]]["version"] and trained[e["group"]]["staleness"] == 0
    rows = [r for r in res.metrics if r.get("regenerated")]
    assert rows and all(r["timing_s/update"] >= r["regenerate_s"] > 0 for r in rows)
    return [(e["event"], e["group"], e.get("version"), e.get("staleness")) for e in events]


def test_wait_regenerates_stale_groups_on_the_local_executor(tmp_path):
    check(wait_run(tmp_path, "local"))


@pytest.mark.slow
def test_wait_regenerates_the_same_way_on_every_executor(ray_session, tmp_path):
    """The same ledger on local, ray and ray-tasks: which groups were regenerated, with which version,
    trained at which staleness."""
    local = check(wait_run(tmp_path, "local"))
    assert check(wait_run(tmp_path, "ray")) == local
    assert check(wait_run(tmp_path, "ray-tasks")) == local
