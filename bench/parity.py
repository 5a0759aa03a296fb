"""Parity benchmark: sync vs one-step-off GRPO from the same seed and config, on the CPU.

Both runs train the embedded tiny model on ``digits`` through the compiled
graph (``ray`` executor), rollout and trainer each on their own 1-CPU actor.
At staleness 1 the reward curve should match the synchronous baseline within
noise (what one asks of an asynchronous trainer), while each step takes
less wall time because generation overlaps training.

    python bench/parity.py [--quick]

Prints both reward curves and a table, then one JSON line (last).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("RAY_AUTH_MODE", "disabled")     # a local, loopback-only cluster

import omnigraph as og  # noqa: E402
import record  # noqa: E402
from omnigraph.runtime import run  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def train(graph: str, iterations: int, out: str) -> dict:
    plan = og.compile(ROOT / "graphs" / graph, overrides=[f"schedule.iterations={iterations}", "runtime.seed=0"])
    res = run(plan, run_dir=out, executor="ray", progress=False)
    rows = res.metrics
    rewards = [r["reward_mean"] for r in rows if "reward_mean" in r]
    steady = [r["step_s"] for r in rows[plan.fill + 2: len(rows) - plan.fill]]
    return {"rewards": rewards, "s_per_step": statistics.median(steady), "final": statistics.mean(rewards[-5:]),
            "first": statistics.mean(rewards[:5]), "wall_s": res.wall_s,
            "staleness_max": max((r.get("staleness_max", 0) for r in rows), default=0), "bound": plan.bound}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="30 steps instead of 60")
    record.add_arguments(ap)
    args = ap.parse_args()
    n = 30 if args.quick else 60
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        sync = train("grpo_sync.yaml", n, tmp)
        off = train("grpo_one_step_off.yaml", n, tmp)
    gap = [abs(a - b) for a, b in zip(sync["rewards"], off["rewards"])]
    print(f"parity benchmark: {n} steps each, same seed; load average at start {load:.2f} on {os.cpu_count()} CPUs")
    print("step  " + " ".join(f"{i:>5d}" for i in range(0, n, 5)))
    for name, r in (("sync", sync), ("1-off", off)):
        print(f"{name:<5} " + " ".join(f"{r['rewards'][i]:5.2f}" for i in range(0, n, 5)))
    print(f"{'mode':<13} {'s/step':>7} {'reward first5':>13} {'last5':>6} {'staleness':>9} {'bound':>5}")
    for name, r in (("sync", sync), ("one_step_off", off)):
        print(f"{name:<13} {r['s_per_step']:7.3f} {r['first']:13.3f} {r['final']:6.3f} {r['staleness_max']:9d} "
              f"{r['bound']:5d}")
    print(f"mean |reward gap| per step {statistics.mean(gap):.3f}, over the last 10 steps "
          f"{statistics.mean(gap[-10:]):.3f}")
    record.emit("parity", {
        "sync_s_per_step": round(sync["s_per_step"], 4), "one_step_off_s_per_step": round(off["s_per_step"], 4),
        "speedup": round(sync["s_per_step"] / off["s_per_step"], 4),
        "final_reward_sync": round(sync["final"], 4), "final_reward_one_step_off": round(off["final"], 4),
        "first_reward_sync": round(sync["first"], 4), "first_reward_one_step_off": round(off["first"], 4),
        "mean_abs_reward_gap": round(statistics.mean(gap), 4), "steps": n, "load_avg_start": round(load, 2)}, args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
