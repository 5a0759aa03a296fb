"""Start-up to the first step, warm workers against cold ones, side by side in one run.

The same graph (``graphs/grpo_one_step_off.yaml`` as shipped: the embedded tiny model, two 1-CPU pools,
the ``ray`` executor on a local cluster each run starts) runs ``--iterations`` steps, ``--repeats`` times
each way, alternating warm (``runtime.warm_workers=true``, :mod:`omnigraph.executors.ray.warm`) and cold
(``false``: every actor a fresh Python process that imports torch and the nodes' code itself). The model is
built once before any timing. ``startup_s`` is the run's own figure: from ``run()`` to the first step
begun (Ray, the actors, their imports and models, the compiled graph); the wall time of each whole run is
recorded too. Figures are medians; ``speedup`` is cold / warm.

    python bench/startup.py [--quick] [--repeats 3] [--no-save]

Last line: JSON, also kept under ``bench/results/`` (``bench/record.py``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
os.environ.setdefault("RAY_AUTH_MODE", "disabled")     # a local, loopback-only cluster

import record  # noqa: E402


def one_run(warm: bool, iterations: int, work: str) -> dict:
    import omnigraph as og
    from omnigraph.runtime import run
    plan = og.compile(og.load(ROOT / "graphs" / "grpo_one_step_off.yaml", [
        f"schedule.iterations={iterations}", "checkpoint.every=null", "nodes.generate.eval_every=0",
        "runtime.executor=ray", f"runtime.warm_workers={str(warm).lower()}"]))
    t0 = time.perf_counter()
    res = run(plan, run_dir=work, executor="ray", progress=False)
    return {"startup_s": res.summary["startup_s"], "wall_s": time.perf_counter() - t0,
            "reward_last": res.summary["reward_last"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="2 runs each way instead of 3")
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--iterations", type=int, default=4)
    record.add_arguments(ap)
    args = ap.parse_args()
    repeats = args.repeats or (2 if args.quick else 3)
    from nodes import zoo
    zoo.tiny(0)                            # built once, outside every timing
    load = os.getloadavg()[0]
    rows = {True: [], False: []}
    with tempfile.TemporaryDirectory(prefix="omnigraph-startup-") as work:
        for i in range(repeats):
            for warm in (True, False) if i % 2 == 0 else (False, True):
                r = one_run(warm, args.iterations, work)
                rows[warm].append(r)
                print(f"run {i + 1} {'warm' if warm else 'cold'}: start-up {r['startup_s']:.2f} s, "
                      f"whole run {r['wall_s']:.1f} s", flush=True)

    def med(warm, key):
        return round(statistics.median(r[key] for r in rows[warm]), 3)

    out = {"warm_startup_s": med(True, "startup_s"), "cold_startup_s": med(False, "startup_s"),
           "speedup": round(med(False, "startup_s") / med(True, "startup_s"), 3),
           "warm_wall_s": med(True, "wall_s"), "cold_wall_s": med(False, "wall_s"),
           "warm_runs_s": [round(r["startup_s"], 3) for r in rows[True]],
           "cold_runs_s": [round(r["startup_s"], 3) for r in rows[False]],
           "repeats": repeats, "iterations": args.iterations, "graph": "graphs/grpo_one_step_off.yaml",
           "load_avg_start": round(load, 2), "load_avg_end": round(os.getloadavg()[0], 2)}
    print(f"start-up to the first step: warm {out['warm_startup_s']:.2f} s, cold {out['cold_startup_s']:.2f} s "
          f"(x{out['speedup']:.2f}); median of {repeats} each, alternating")
    record.emit("startup", out, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
