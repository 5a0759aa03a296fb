"""Learning benchmark: does RL through omnigraph make a real model better on held-out reasoning-gym items?

Trains SmolLM2-135M-Instruct (LoRA, one step off-policy, vLLM sampling) on the reasoning-gym task of
``graphs/smollm2_reasoning_gym.yaml`` and measures the greedy accuracy (score 1.0 from the dataset's own
``score_answer``) on the same held-out items (questions training never sees) before the first update and
after the last: the run's own evaluations at step 0 and at its last step, with the weights the rollout
held then. Nothing else is tuned for the benchmark: it is the shipped graph with ``schedule.iterations``
set.

    python bench/learn.py [--quick] [--iterations N] [--dataset NAME] [key.path=value ...]

``--quick``: 18 iterations (about 13 minutes on a 2-core CPU without AMX; less with it). Needs the
``vllm`` extra. Prints the per-evaluation accuracies, then one JSON line (last) with ``task``, ``model``,
``eval_before``, ``eval_after``, ``steps``, ``minutes``, ``dtype`` and the held-out mean scores, and saves
it under bench/results/ (``bench/record.py``).
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

GRAPH = ROOT / "graphs" / "smollm2_reasoning_gym.yaml"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="18 iterations")
    ap.add_argument("--iterations", type=int, default=None, help="training steps (default 18 quick, the graph's 24 full)")
    ap.add_argument("--dataset", default=None, help="another reasoning-gym dataset (default: the graph's)")
    ap.add_argument("overrides", nargs="*", help="key.path=value overrides of the graph")
    import record
    record.add_arguments(ap)
    args = ap.parse_args()
    if importlib.util.find_spec("vllm") is None:
        sys.exit("bench/learn.py needs the vllm extra: pip install -e '.[vllm]'")
    import omnigraph as og
    from omnigraph.runtime import run

    iterations = args.iterations or (18 if args.quick else og.load(GRAPH).schedule.iterations)
    overrides = [f"schedule.iterations={iterations}", "checkpoint.every=null"]
    overrides += args.overrides
    if args.dataset:
        overrides += [f"task.dataset={args.dataset}", "task.config={}"]
    plan = og.compile(GRAPH, overrides=overrides)
    spec = plan.graph.spec
    print(f"learn: {spec.model.path} on reasoning-gym {spec.task.dataset} {spec.task.config}, {iterations} steps "
          f"of {spec.task.prompts} x {spec.task.samples_per_prompt}, greedy eval on {spec.task.eval_prompts} held-out "
          "items at the first and last step", flush=True)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        res = run(plan, run_dir=tmp, progress=True)
        dtype = next(iter(plan.dtypes.values())).dtype if plan.dtypes else spec.model.dtype
    minutes = (time.perf_counter() - t0) / 60
    evals = [(r["step"], r["eval_accuracy"], r["eval_reward"], int(r["eval_version"]))
             for r in res.metrics if "eval_accuracy" in r]
    for step, acc, mean, version in evals:
        print(f"  step {step:3d} (weights v{version}): greedy accuracy {acc:.3f}, mean score {mean:.3f}", flush=True)
    (_, before, before_mean, _), (last_step, after, after_mean, _) = evals[0], evals[-1]
    rewards = [r["reward_mean"] for r in res.metrics if "reward_mean" in r]
    out = {"task": f"reasoning_gym:{spec.task.dataset}", "model": spec.model.path, "backend": "vllm",
           "eval_before": round(before, 4), "eval_after": round(after, 4), "gain": round(after - before, 4),
           "eval_mean_before": round(before_mean, 4), "eval_mean_after": round(after_mean, 4),
           "eval_items": spec.task.eval_prompts, "steps": iterations, "minutes": round(minutes, 2),
           "s_per_step": res.summary.get("s_per_step"), "dtype": dtype,
           "reward_first": round(rewards[0], 4), "reward_last": round(sum(rewards[-3:]) / 3, 4),
           "evals": [{"step": s, "accuracy": a, "mean": round(m, 4)} for s, a, m, _ in evals]}
    print(f"eval accuracy {before:.3f} -> {after:.3f} ({after - before:+.3f}) in {iterations} steps, "
          f"{minutes:.1f} min", flush=True)
    record.emit("learn", out, args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
