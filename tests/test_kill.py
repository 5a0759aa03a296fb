"""An actor process SIGKILLed wherever the driver is in its loop is a restart, on both Ray executors.

The driver kills the actor itself, at a named point of its loop (``NODE@STEP/POINT:kill`` in
``OMNIGRAPH_INJECT``, :class:`omnigraph.executors.faults.DriverFaults`), so the kill lands where the test
means it to, every time:

- ``submit``: before step 5 is submitted, once Ray has seen the actor die (a compiled graph's monitor has torn
  the graph down: the submit finds its channel closed, the crash ``bench/faults.py`` met on a 2-core host);
- ``submitting``: the signal goes out and the driver submits at once (the kill lands as it writes);
- ``submitted``: right after the submit returned;
- ``collect``: once the actors have signalled the step done, before the driver reads its results;
- ``snapshot``: while a checkpoint's snapshot calls are out.

Each run restarts once, from its checkpoint, names the dead actor, and ends with every prompt group trained
exactly once.
"""

from __future__ import annotations

import pytest

import omnigraph as og
from omnigraph.executors.faults import DRIVER_POINTS, DriverFaults, parse
from omnigraph.runtime import run
from omnigraph.runtime.ledger import read

from conftest import GRAPHS

ITERATIONS = 10
OVER = [f"schedule.iterations={ITERATIONS}", "checkpoint.every=3", "runtime.max_restarts=1",
        "nodes.generate.cost=0.02"]
ACTOR = {"generate": "rollout.0", "update": "trainer.0"}
CASES = [("submit", "update"), ("submit", "generate"), ("submitting", "generate"), ("submitted", "update"),
         ("collect", "generate"), ("collect", "update"), ("snapshot", "update")]


def test_kill_items_are_the_drivers_and_need_a_driver_point(monkeypatch):
    assert parse("update@5/submit:kill") == {("update", None, 5, "submit", 1): "kill"}
    for bad in ("update@5:kill", "update@5/token:kill", "update@5/submit:raise"):
        with pytest.raises(ValueError, match="driver point"):
            parse(bad)
    monkeypatch.setenv("OMNIGRAPH_INJECT", "update@5/submit:kill, generate#1@3/collect:kill, update@2:raise")
    monkeypatch.setenv("OMNIGRAPH_ATTEMPT", "0")
    f = DriverFaults()
    assert f.due(5, "collect") is None and f.due(5, "submit") == ("update", 0)
    assert f.due(5, "submit") is None                      # once
    assert f.due(3, "collect") == ("generate", 1)
    monkeypatch.setenv("OMNIGRAPH_ATTEMPT", "1")            # a restart gets past them
    assert not DriverFaults().plan
    assert set(DRIVER_POINTS) == {p for p, _ in CASES}


@pytest.mark.slow
@pytest.mark.parametrize("executor", ["ray", "ray-tasks"])
@pytest.mark.parametrize("point,node", CASES)
def test_an_actor_killed_anywhere_in_the_drivers_loop_is_a_restart(ray_session, tmp_path, monkeypatch, executor,
                                                                   point, node):
    monkeypatch.setenv("OMNIGRAPH_INJECT", f"{node}@5/{point}:kill")
    plan = og.compile(GRAPHS / "synthetic_one_step_off.yaml", overrides=OVER)
    res = run(plan, run_dir=tmp_path, executor=executor, progress=False)
    restarts = res.summary["restarts"]
    assert len(restarts) == 1, restarts
    assert f"actor {ACTOR[node]} " in restarts[0]["cause"], restarts[0]["cause"]
    s = read(res.run_dir)
    assert s.ok and s.generated == s.trained_once == ITERATIONS * 8, s
