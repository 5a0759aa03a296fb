"""The Ray executors: the same results as the local executor, and clean failures.

Ray starts once per module for the in-process tests (``ray_session``); the failure tests run
the real ``omnigraph`` command in a subprocess and check that it leaves no
process behind.
"""

import os
import signal
import time

import pytest
from hypothesis import HealthCheck, given, settings

import omnigraph as og
from omnigraph.executors import make_executor
from omnigraph.runtime import run
from omnigraph.testing import canonical_spec

from cli_process import omnigraph
from conftest import GRAPHS
from test_properties import graphs

pytestmark = pytest.mark.slow
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
COMPARED = ("batch", "staleness_max", "staleness_mean", "version", "weights_version", "reward_mean",
            "trained_groups", "generated_groups", "loss", "dropped")


def trace(plan, executor):
    """Every node run's outcome, keyed by (node, actor, step): what must not depend on the executor."""
    ex = make_executor(plan, executor)
    ex.start()
    try:
        out = {}
        for step in ex.steps():
            for r in step.records:
                if r.get("kind", "run") == "run":
                    out[(r["node"], r["actor"], r["step"])] = {k: r[k] for k in COMPARED if k in r}
        return out
    finally:
        ex.stop()


@settings(deadline=None, max_examples=5, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(graphs())
def test_local_ray_and_ray_tasks_give_identical_versions_staleness_and_outputs(ray_session, raw):
    """The same plan on every executor: the same per-batch versions, staleness and outputs."""
    raw["schedule"]["iterations"] = min(raw["schedule"]["iterations"], 6)
    plan = og.compile(og.GraphSpec.model_validate(raw))
    local = trace(plan, "local")
    assert trace(plan, "ray") == local
    assert trace(plan, "ray-tasks") == local


def test_compiled_one_step_off_overlaps_generation_with_training(ray_session):
    costs = {"generate": 0.3, "reward": 0.0, "old_logprob": 0.05, "update": 0.2, "sync": 0.0}
    times = {}
    for mode in ("sync", "one_step_off"):
        plan = og.compile(canonical_spec(mode, iterations=6, costs=costs))
        ex = make_executor(plan, "ray")
        ex.start()
        stamps = [time.perf_counter() for _ in ex.steps()]
        ex.stop()
        steady = stamps[plan.fill + 1: len(stamps) - plan.fill]
        times[mode] = (steady[-1] - steady[0]) / (len(steady) - 1)
    assert times["sync"] == pytest.approx(0.55, rel=0.15)
    assert times["one_step_off"] == pytest.approx(0.30, rel=0.15)


def run_cli(args, env_extra=None, timeout=180, interrupt_when=None):
    """Run ``omnigraph``; return (code, stderr, the descendants it had that are still alive, all it had). With
    ``interrupt_when``, SIGINT goes out as soon as ``interrupt_when()`` is true; the run must end 60 s after it."""
    code, _, err, _, alive, seen = omnigraph(args, [(interrupt_when, signal.SIGINT)] if interrupt_when else [],
                                             env_extra, timeout, after_signal_s=60)
    return code, err, alive, seen


SYNTH = str(GRAPHS / "synthetic_one_step_off.yaml")


@pytest.mark.parametrize("node", ["generate", "reward", "old_logprob", "update", "sync"])
def test_an_exception_in_each_node_kind_stops_with_one_message(node, tmp_path):
    code, err, alive, seen = run_cli(["run", SYNTH, "schedule.iterations=4", "--quiet", "--run-dir", str(tmp_path)],
                                     {"OMNIGRAPH_INJECT": f"{node}@2:raise"})
    assert code == 1
    (d,) = tmp_path.iterdir()
    assert err.strip().splitlines()[-1] == (f"error: node {node} failed at iteration 2: RuntimeError: injected "
                                            f"fault in {node} at step 2 (traceback: {d / 'errors.log'})")
    assert "Traceback" not in err
    log = (d / "errors.log").read_text()            # the actor's traceback came back with its failure
    assert f"  step 2  node {node}  attempt 1 ===" in log and "Traceback (most recent call last):" in log
    assert seen and not alive, f"left behind: {alive}"


def test_a_hanging_node_is_reported_after_its_timeout(tmp_path):
    t0 = time.monotonic()
    code, err, alive, _ = run_cli(["run", SYNTH, "runtime.step_timeout_s=3", "--quiet", "--run-dir", str(tmp_path)],
                                  {"OMNIGRAPH_INJECT": "update@2:hang"})
    assert code == 1
    assert "error: node update failed at iteration 2: did not finish within runtime.step_timeout_s = 3 s" in err
    assert "Traceback" not in err and not alive
    assert time.monotonic() - t0 < 60


def test_ctrl_c_tears_down_cleanly(tmp_path):
    """SIGINT once the first step is written (however long this machine takes to start), into a run that
    cannot end by itself within the test's limits (10000 steps of >= 0.2 s): it stops at a step boundary."""
    def stepping() -> bool:
        return any(p.read_text().count("\n") >= 1 for p in tmp_path.glob("*/metrics.jsonl"))
    code, err, alive, seen = run_cli(["run", SYNTH, "schedule.iterations=10000", "--quiet", "--run-dir",
                                      str(tmp_path)], interrupt_when=stepping, timeout=400)
    assert code == 75, err                          # preempted, with its checkpoint (tests/test_preempt.py)
    assert "interrupt: SIGINT: finishing the steps in flight, then a checkpoint" in err
    (run_dir,) = tmp_path.iterdir()
    assert f"continue with: omnigraph run --resume {run_dir}" in err and "Traceback" not in err
    assert seen and not alive, f"left behind: {alive}"
    steps = (run_dir / "metrics.jsonl").read_text().count("\n")
    assert steps >= 1
    assert [p.name for p in (run_dir / "checkpoints").iterdir()] == [f"step-{steps - 1:08d}"]


def test_a_killed_actor_is_restarted_and_the_run_resumes_from_its_checkpoint(tmp_path):
    code, err, alive, _ = run_cli(["run", SYNTH, "schedule.iterations=10", "checkpoint.every=3",
                                   "runtime.max_restarts=1", "--quiet", "--run-dir", str(tmp_path)],
                                  {"OMNIGRAPH_INJECT": "update@5:exit"})
    assert code == 0, err
    (d,) = tmp_path.iterdir()
    restarts = (d / "restarts.jsonl").read_text()
    assert "node update failed at iteration 5: actor trainer.0 died" in restarts
    from omnigraph.runtime.ledger import read
    s = read(d)
    assert s.ok and s.generated == s.trained_once == 10 * 8
    assert not alive


@pytest.mark.parametrize("fault", ["generate@5:exit", "update@5:exit", "generate@4:raise", "reward@4:raise",
                                   "old_logprob@4:raise", "update@4:raise", "sync@4:raise"])
def test_supervised_runs_survive_each_fault_with_the_undisturbed_ledger(ray_session, tmp_path, monkeypatch, fault):
    """kill -9-like exits of the rollout (mid-generation) and trainer (mid-update), and a raise in each node kind:
    the run restarts from its checkpoint and ends with every prompt group trained exactly once."""
    from omnigraph.runtime.ledger import read
    over = ["schedule.iterations=8", "checkpoint.every=3", "runtime.max_restarts=1", "nodes.generate.cost=0.02"]
    monkeypatch.setenv("OMNIGRAPH_INJECT", fault)
    res = run(og.compile(GRAPHS / "synthetic_one_step_off.yaml", overrides=over), run_dir=tmp_path, executor="ray",
              progress=False)
    assert len(res.summary["restarts"]) == 1 and fault.split("@")[0] in res.summary["restarts"][0]["cause"]
    s = read(res.run_dir)
    assert s.ok and s.generated == s.trained_once == 8 * 8


@pytest.mark.slow
def test_the_shipped_graph_colocated_by_pools_alone_trains_on_ray(ray_session, tmp_path):
    """Every node of graphs/grpo_one_step_off.yaml on one pool (one actor, 2 CPUs): the same bound, a warning
    that one pool cannot overlap, and it trains with every group once."""
    over = [f"nodes.{n}.pool=trainer" for n in ("generate", "reward", "old_logprob", "update", "sync")]
    plan = og.compile(GRAPHS / "grpo_one_step_off.yaml", overrides=over + ["pools.trainer.cpus=2",
                                                                          "schedule.iterations=20"])
    assert plan.bound == 1 and any("no overlap" in w for w in plan.warnings)
    res = run(plan, run_dir=tmp_path, executor="ray", progress=False)
    s = res.summary
    assert s["groups_lost"] == 0 and s["groups_trained_twice"] == 0 and s["observed_max_staleness"] == 1
    assert s["reward_last"] > s["reward_first"] + 0.2, s
