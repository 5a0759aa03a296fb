"""How the Ray executors start their actors on a cluster they start themselves."""

import hashlib
import json
import os

import psutil
import pytest
import ray

import omnigraph as og
from omnigraph.executors import make_executor
from omnigraph.executors.ray.placement import core_layout

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


# -- warm workers (omnigraph.executors.ray.warm) -----------------------------------

def _tiny(extra=()):
    return og.compile(og.load(GRAPHS / "grpo_one_step_off.yaml", ["schedule.iterations=3", "checkpoint.every=null",
                                                                  "nodes.generate.eval_every=0",
                                                                  "runtime.executor=ray", *extra]))


def _fresh_ray(monkeypatch):
    if ray.is_initialized():
        ray.shutdown()
    monkeypatch.delenv("LD_PRELOAD", raising=False)


def test_warm_workers_are_forks_of_one_server_that_loaded_torch_and_the_nodes_code(monkeypatch):
    """On a cluster the executor starts, every actor is a fork of the warm server, which imported torch, the
    backends' modules and the model's architecture code before any actor existed; the actors still get their
    own cores. Stopping the executor stops the server and removes its socket."""
    _fresh_ray(monkeypatch)
    plan = _tiny(["runtime.pin_cpus=true"])
    cores = core_layout(plan, plan.graph.spec)
    ex = make_executor(plan, "ray")
    ex.start()
    try:
        server = psutil.Process(ex.warm.proc.pid)
        assert {"torch", "transformers", "nodes"} <= set(ex.warm_info["modules"]) and not ex.warm_info["failed"]
        for name, a in ex.placement().items():
            assert a["warm"], name
            assert psutil.Process(a["pid"]).ppid() == server.pid
            assert os.getpgid(a["pid"]) == a["pid"]            # its own process group: Ray's clean-up kills only it
            if cores:
                assert sorted(psutil.Process(a["pid"]).cpu_affinity()) == sorted(cores[name])
        assert len(list(ex.steps())) == plan.steps
        folder = ex.warm.folder
    finally:
        ex.stop()
    assert not server.is_running() or server.status() == psutil.STATUS_ZOMBIE
    assert not os.path.exists(folder) and not ray.is_initialized()


def test_warm_and_cold_workers_train_the_same_weights(monkeypatch, tmp_path):
    """A fork is a fresh process to the nodes: the same graph trains bit-identical weights and rewards with warm
    workers and with workers that start cold."""
    _fresh_ray(monkeypatch)
    out = {}
    for warm in (True, False):
        plan = _tiny([f"runtime.warm_workers={str(warm).lower()}", "runtime.pin_cpus=true"])
        res = og.run(plan, run_dir=tmp_path / str(warm), progress=False)
        placement = [json.loads(line) for line in (res.run_dir / "placement.jsonl").read_text().splitlines()]
        assert all(a["warm"] == warm for a in placement[0]["actors"].values())
        weights = (res.run_dir / "final" / "model.safetensors").read_bytes()
        out[warm] = ([r.get("reward_mean") for r in res.metrics], hashlib.sha256(weights).hexdigest())
    assert out[True] == out[False]


def test_a_killed_warm_worker_is_seen_and_the_restart_forks_new_ones(monkeypatch, tmp_path):
    """A warm actor that dies like ``kill -9`` in the middle of a step is a NodeFailure as for any actor; the
    supervised restart starts a new cluster whose actors are warm again, and the run ends."""
    _fresh_ray(monkeypatch)
    monkeypatch.setenv("OMNIGRAPH_INJECT", "update@1:exit")
    plan = _tiny(["runtime.max_restarts=1"])
    res = og.run(plan, run_dir=tmp_path, progress=False)
    assert res.metrics[-1]["step"] == plan.steps - 1 and res.summary["restarts"]
    restarts = [json.loads(line) for line in (res.run_dir / "restarts.jsonl").read_text().splitlines()]
    assert any(r.get("event") == "restart" and r["node"] == "update" for r in restarts)
    attempts = [json.loads(line) for line in (res.run_dir / "placement.jsonl").read_text().splitlines()]
    assert [a["attempt"] for a in attempts] == [0, 1]
    assert all(a["warm"] for attempt in attempts for a in attempt["actors"].values())


def test_the_warm_server_ends_with_a_driver_that_is_killed(tmp_path):
    """The server's stdin is a pipe from the driver: when the driver dies without stopping it (``kill -9``),
    the server sees the pipe close and exits instead of lingering."""
    script = tmp_path / "driver.py"
    script.write_text(
        "import os, sys, time\n"
        f"sys.path.insert(0, {str(GRAPHS.parent)!r})\n"
        "from omnigraph.executors.ray.warm import WarmServer\n"
        "w = WarmServer({'modules': ['json'], 'hooks': [], 'model_dir': None})\n"
        "assert w.ready(60)\n"
        "print(w.proc.pid, flush=True)\n"
        "time.sleep(600)\n")
    import subprocess
    import sys
    import time
    driver = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    server = psutil.Process(int(driver.stdout.readline()))
    assert server.is_running()
    driver.kill()
    driver.wait()
    deadline = time.monotonic() + 10
    while server.is_running() and server.status() != psutil.STATUS_ZOMBIE and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not server.is_running() or server.status() == psutil.STATUS_ZOMBIE
