"""Pipeline benchmark: sync vs one-step-off on Ray Compiled Graphs, and what compilation buys.

Synthetic nodes on separate 1-CPU actors with configured costs, in two variants
measured in the same run: ``wait`` (the cost is a sleep: accelerator time, host
idle) and ``burn`` (the cost spins one CPU thread). Then the control overhead
of the 5-node graph with trivial nodes on ``ray`` (compiled) and ``ray-tasks``
(classic calls), and the CPU the waiters use while idle, with omnigraph's
sleeping waiters and with Compiled Graphs' own busy-polling.

    python bench/pipeline.py [--quick]

Prints a table, then one JSON line (last).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("RAY_AUTH_MODE", "disabled")     # a local, loopback-only cluster

import psutil  # noqa: E402
import record  # noqa: E402

import omnigraph as og  # noqa: E402
from omnigraph.executors import make_executor  # noqa: E402
from omnigraph.testing import canonical_spec  # noqa: E402

COSTS = {"generate": 0.5, "reward": 0.05, "old_logprob": 0.1, "update": 0.35, "sync": 0.02}
ROLLOUT, TRAINER = ("generate", "reward"), ("old_logprob", "update", "sync")


def cpu_s(p: psutil.Process) -> float:
    t = p.cpu_times()
    return t.user + t.system


def measure(mode: str, cost_mode: str, iterations: int, costs: dict, executor: str = "ray",
            samples: tuple[int, int] = (16, 8), **options) -> dict:
    """Run one graph; return steady-state s/step, staleness, and CPU% of actors and driver."""
    spec = canonical_spec(mode, iterations=iterations, cost_mode=cost_mode, costs=costs, max_staleness=1)
    spec.task.prompts, spec.task.samples_per_prompt = samples
    plan = og.compile(spec)
    ex = make_executor(plan, executor, **options)
    ex.start()
    procs = {a: psutil.Process(pid) for a, pid in ex.pids().items()}
    me = psutil.Process()
    first, last_steady = plan.fill + 1, plan.steps - plan.fill - 1     # skip warm-up, fill and drain
    dts, stale, last = [], 0, time.perf_counter()
    cpu0 = None
    try:
        for r in ex.steps():
            now = time.perf_counter()
            if first <= r.step <= last_steady:
                dts.append(now - last)
            if r.step == first - 1:
                cpu0 = ({a: cpu_s(p) for a, p in procs.items()}, cpu_s(me), now)
            if r.step == last_steady:
                cpu1 = ({a: cpu_s(p) for a, p in procs.items()}, cpu_s(me), now)
            stale = max([stale] + [x["staleness_max"] for x in r.records if "staleness_max" in x])
            last = now
    finally:
        ex.stop()
    wall = cpu1[2] - cpu0[2]
    return {"s_per_step": statistics.mean(dts), "median_s": statistics.median(dts),
            "observed_max_staleness": stale, "static_bound": plan.bound, "predicted_s": plan.prediction.step_s,
            "actor_cpu_pct": {a: 100 * (cpu1[0][a] - cpu0[0][a]) / wall for a in procs},
            "driver_cpu_pct": 100 * (cpu1[1] - cpu0[1]) / wall}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer iterations (under 2 minutes)")
    record.add_arguments(ap)
    args = ap.parse_args()
    n = 8 if args.quick else 20
    load = os.getloadavg()[0]
    import ray
    ray.init(address="local", include_dashboard=False, logging_level="ERROR", configure_logging=False)
    try:
        res = {}
        for variant in ("wait", "burn"):
            for mode in ("sync", "one_step_off"):
                res[variant, mode] = measure(mode, variant, n, COSTS)
        idle_costs = {"generate": 0.25, "reward": 0.0, "old_logprob": 0.0, "update": 0.0, "sync": 0.0}
        idle = measure("sync", "wait", 3 * n, idle_costs)
        idle_spin = measure("sync", "wait", 3 * n, idle_costs, waits=False)
        trivial = {k: 0.0 for k in COSTS}
        # trivial nodes on a one-sample batch: what remains is the cost of control
        over = {ex: measure("sync", "wait", 25 * n, trivial, executor=ex, samples=(1, 1)) for ex in ("ray", "ray-tasks")}
        over_spin = measure("sync", "wait", 25 * n, trivial, waits=False, samples=(1, 1))
    finally:
        ray.shutdown()

    serial = sum(COSTS.values())
    ideal_step = max(sum(COSTS[k] for k in ROLLOUT), sum(COSTS[k] for k in TRAINER))
    w_sync, w_off = res["wait", "sync"]["s_per_step"], res["wait", "one_step_off"]["s_per_step"]
    c_sync, c_off = res["burn", "sync"]["s_per_step"], res["burn", "one_step_off"]["s_per_step"]
    compiled_ms, tasks_ms = 1000 * over["ray"]["median_s"], 1000 * over["ray-tasks"]["median_s"]

    print(f"pipeline benchmark ({'quick' if args.quick else 'full'}: {n} iterations per run; "
          f"load average at start {load:.2f} on {os.cpu_count()} CPUs)")
    print(f"node costs (s): {COSTS}; serial {serial:.3f} s, ideal one-step-off {ideal_step:.3f} s")
    print(f"{'variant':<8} {'mode':<13} {'s/step':>8} {'predicted':>9} {'staleness':>9} {'bound':>5}  actor CPU %")
    for (variant, mode), r in res.items():
        cpu = ", ".join(f"{a} {p:.0f}" for a, p in r["actor_cpu_pct"].items())
        print(f"{variant:<8} {mode:<13} {r['s_per_step']:8.3f} {r['predicted_s']:9.3f} "
              f"{r['observed_max_staleness']:9d} {r['static_bound']:5d}  {cpu}")
    print(f"control overhead per step, trivial nodes: compiled {compiled_ms:.2f} ms, classic calls {tasks_ms:.2f} ms "
          f"(x{tasks_ms / compiled_ms:.1f}); compiled with busy-polling waiters "
          f"{1000 * over_spin['median_s']:.2f} ms")
    idle_actor = idle["actor_cpu_pct"]["trainer.0"]
    print(f"idle CPU (trainer waits for a 0.25 s generate): sleeping waiters: trainer {idle_actor:.1f}%, "
          f"driver {idle['driver_cpu_pct']:.1f}%; Compiled Graphs' own waiting: trainer "
          f"{idle_spin['actor_cpu_pct']['trainer.0']:.1f}%, driver {idle_spin['driver_cpu_pct']:.1f}%")
    out = {
        "sync_s_per_step": round(w_sync, 4), "one_step_off_s_per_step": round(w_off, 4),
        "speedup": round(w_sync / w_off, 4), "ideal_speedup": round(serial / ideal_step, 4),
        "efficiency": round(ideal_step / w_off, 4),
        "cpu_sync_s_per_step": round(c_sync, 4), "cpu_one_step_off_s_per_step": round(c_off, 4),
        "cpu_speedup": round(c_sync / c_off, 4), "cpu_efficiency": round(ideal_step / c_off, 4),
        "compiled_overhead_ms": round(compiled_ms, 3), "tasks_overhead_ms": round(tasks_ms, 3),
        "overhead_ratio": round(tasks_ms / compiled_ms, 2),
        "compiled_overhead_spinning_ms": round(1000 * over_spin["median_s"], 3),
        "idle_actor_cpu_pct": round(idle_actor, 2), "driver_cpu_pct": round(idle["driver_cpu_pct"], 2),
        "idle_actor_cpu_pct_spinning": round(idle_spin["actor_cpu_pct"]["trainer.0"], 2),
        "driver_cpu_pct_spinning": round(idle_spin["driver_cpu_pct"], 2),
        "observed_max_staleness": {m: res["wait", m]["observed_max_staleness"] for m in ("sync", "one_step_off")},
        "static_bound": {m: res["wait", m]["static_bound"] for m in ("sync", "one_step_off")},
        "load_avg_start": round(load, 2),
    }
    record.emit("pipeline", out, args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
