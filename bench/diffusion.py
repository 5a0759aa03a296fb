"""FlowGRPO on the embedded image model: synchronous separate pools vs the asynchronous graph, in one run.

Both rows run the same model (``tiny-flow``), task, batch (8 prompt groups x 8 images), sampler (10 SDE
steps), learning rate and number of steps, on the same two 1-CPU pools (``ray`` executor), one after the
other:

1. ``graphs/flowgrpo_sync.yaml``: generate, score, train and sync take turns (on-policy; one pool idles
   while the other works);
2. ``graphs/flowgrpo_async.yaml``: generation runs up to 2 batches ahead (a buffer of 2), weights go to the
   rollout every 4 updates, the bound 5 is proven by the compiler and checked on every batch.

Figures (last JSON line): ``s_per_step_sync_separate`` and ``s_per_step_async`` (steady state: the median
step time after the first steps, from each run's ``summary.json``), ``speedup`` (their ratio),
``ideal_speedup`` (the async row's pools' busy time per step, summed, over the busier pool's: what
perfect overlap of its work would give; the measured ``speedup`` also gains from syncing every 4th step), ``reward_first`` / ``reward_last`` (the async row's first and last training reward, means of
5 steps) beside the sync row's, and ``ratio_max_abs_dev_on_policy``: the largest ``|exp(trainer logprob -
sampler logprob) - 1|`` over every trained transition of the sync row (staleness 0: the same weights on
both sides, so 1 up to float order).

What differs between the rows: only the schedule (and so the staleness of what is trained on).

    python bench/diffusion.py [--quick]      # --quick: 30 steps per row instead of 60
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
ROLLOUT = ("generate", "reward")
TRAINER = ("old_logprob", "update")


def run(graph: str, steps: int, out: Path) -> tuple[dict, list[dict]]:
    cmd = [sys.executable, "-m", "omnigraph.cli", "run", str(ROOT / "graphs" / graph),
           f"schedule.iterations={steps}", f"runtime.run_dir={out}", "checkpoint.every=null"]
    print("$", " ".join(cmd[2:]), flush=True)
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"{graph} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    run_dir = Path(next(line.split(": ", 1)[1] for line in proc.stdout.splitlines()
                        if line.startswith("run directory: ")).strip())
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    summary = json.loads((run_dir / "summary.json").read_text())
    print(f"  {summary['s_per_step']:.3f} s/step, reward {summary['reward_first']:.3f} -> "
          f"{summary['reward_last']:.3f}, staleness max {summary['observed_max_staleness']} "
          f"(bound {summary['staleness_bound']}); pictures in {run_dir}", flush=True)
    return summary, rows


def med(rows: list[dict], key: str) -> float:
    vals = [r[key] for r in rows[2:] if key in r]
    return statistics.median(vals) if vals else 0.0


def rewards(rows: list[dict]) -> tuple[float, float]:
    r = [row["reward_mean"] for row in rows if "reward_mean" in row]
    return statistics.fmean(r[:5]), statistics.fmean(r[-5:])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="30 steps per row instead of 60")
    import record
    record.add_arguments(ap)
    args = ap.parse_args()
    steps = 30 if args.quick else 60
    load = os.getloadavg()[0]
    print(f"diffusion benchmark: tiny-flow, {steps} steps per row, load average {load:.2f} on {os.cpu_count()} CPUs",
          flush=True)
    with tempfile.TemporaryDirectory(prefix="omnigraph-diffusion-") as tmp:
        sync, sync_rows = run("flowgrpo_sync.yaml", steps, Path(tmp))
        asyn, async_rows = run("flowgrpo_async.yaml", steps, Path(tmp))
        kept = ROOT / "runs" / "bench-diffusion"
        kept.mkdir(parents=True, exist_ok=True)
        for name, s in (("sync", sync), ("async", asyn)):     # the pictures outlive the temporary folder
            for pic in ("samples_first.png", "samples_last.png", "reward.png"):
                src = Path(s["run_dir"]) / pic
                if src.exists():
                    (kept / f"{name}_{pic}").write_bytes(src.read_bytes())
    rollout = sum(med(async_rows, f"timing_s/{n}") for n in ROLLOUT)
    trainer = sum(med(async_rows, f"timing_s/{n}") for n in TRAINER) + med(async_rows, "timing_s/sync") / 4
    first, last = rewards(async_rows)
    sync_first, sync_last = rewards(sync_rows)
    dev = max(r["behav_ratio_dev_max"] for r in sync_rows if "behav_ratio_dev_max" in r)
    result = {
        "ratio_max_abs_dev_on_policy": dev,
        "reward_first": round(first, 4), "reward_last": round(last, 4),
        "sync_reward_first": round(sync_first, 4), "sync_reward_last": round(sync_last, 4),
        "s_per_step_sync_separate": sync["s_per_step"], "s_per_step_async": asyn["s_per_step"],
        "speedup": round(sync["s_per_step"] / asyn["s_per_step"], 3),
        "ideal_speedup": round((rollout + trainer) / max(rollout, trainer), 3),
        "node_s": {"rollout": round(rollout, 4), "trainer": round(trainer, 4)},
        "staleness_bound_async": asyn["staleness_bound"], "staleness_max_async": asyn["observed_max_staleness"],
        "steps": steps, "batch": {"prompts": 8, "samples_per_prompt": 8}, "pictures": str(kept.relative_to(ROOT)),
        "load_avg": round(load, 2)}
    print(f"sync separate {sync['s_per_step']:.3f} s/step, async {asyn['s_per_step']:.3f} s/step: x{result['speedup']:.2f} "
          f"(ideal x{result['ideal_speedup']:.2f}); on-policy |ratio - 1| <= {dev:.2e}", flush=True)
    record.emit("diffusion", result, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
