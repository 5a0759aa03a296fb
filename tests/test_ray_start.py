"""How the Ray executors start their actors on a cluster they start themselves."""

import os

import psutil
import pytest
import ray

import omnigraph as og
from omnigraph.executors import make_executor
from omnigraph.executors.ray_common import core_layout

from conftest import GRAPHS

pytestmark = pytest.mark.slow
os.environ.setdefault("RAY_AUTH_MODE", "disabled")


def test_actors_start_with_their_environment_and_placement_names_their_processes(monkeypatch):
    """On a cluster the executor starts, an actor's environment arrives only as an argument (no runtime_env of
    its own, so it takes a worker Ray prestarted): each actor is pinned to its own cores by it before the first
    step, and ``placement`` (what ``placement.jsonl`` records) names each actor's process."""
    if ray.is_initialized():        # a module before this one left Ray running: this test needs its own
        ray.shutdown()
    monkeypatch.delenv("LD_PRELOAD", raising=False)      # an earlier in-process vLLM engine sets it
    plan = og.compile(og.load(GRAPHS / "synthetic_one_step_off.yaml", ["schedule.iterations=2",
                                                                       "runtime.pin_cpus=true"]))
    cores = core_layout(plan, plan.graph.spec)
    ex = make_executor(plan, "ray")
    ex.start()
    try:
        assert ex._fresh_workers                 # the actors have no runtime_env
        placed = ex.placement()
        assert sorted(placed) == sorted(plan.actors) and len({a["pid"] for a in placed.values()}) == len(placed)
        for name, a in placed.items():
            assert a["pid"] == ex.pids()[name] != os.getpid()
            if cores:
                assert sorted(psutil.Process(a["pid"]).cpu_affinity()) == sorted(cores[name])
        assert len(list(ex.steps())) == plan.steps
    finally:
        ex.stop()
    assert not ray.is_initialized()
