"""Learning benchmark: does RL through omnigraph make a real model better on held-out reasoning-gym items?

Trains SmolLM2-135M-Instruct (LoRA, one step off-policy, vLLM sampling) on the reasoning-gym task of
``graphs/smollm2_reasoning_gym.yaml`` and measures the greedy accuracy (score 1.0 from the dataset's own
``score_answer``) on the same held-out items (questions training never sees) before the first update and
after the last: the run's own evaluations at step 0 and at its last step, with the weights the rollout
held then. Nothing else is tuned for the benchmark: it is the shipped graph with ``schedule.iterations``
set.

    python bench/learn.py [--quick] [--iterations N] [--seeds N] [--eval-items N] [--dataset NAME] [key.path=value ...]

``--quick``: 18 iterations from 2 seeds, 128 held-out items (about 13 minutes a seed on a 2-core CPU without
AMX; less with it). The held-out items are the same for every seed; the seeds change the adapters'
initialisation and the sampling. Needs the ``vllm`` extra. Prints the per-evaluation accuracies, then one JSON
line (last) with ``task``, ``model``, ``eval_before`` and ``eval_after`` (means over the seeds), ``gains`` (per
seed), ``steps``, ``minutes``, ``dtype`` and the held-out mean scores, and saves it under bench/results/
(``bench/record.py``). Scored as reasoning-gym's own pipeline scores (``extract_answer``, then the dataset's
``score_answer``).
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


def one_seed(og, run, overrides: list[str], seed: int, tmp: str) -> dict:
    plan = og.compile(GRAPH, overrides=[*overrides, f"runtime.seed={seed}"])
    t0 = time.perf_counter()
    res = run(plan, run_dir=tmp, progress=True)
    evals = [(r["step"], r["eval_accuracy"], r["eval_reward"], int(r["eval_version"]))
             for r in res.metrics if "eval_accuracy" in r]
    for step, acc, mean, version in evals:
        print(f"  seed {seed} step {step:3d} (weights v{version}): greedy accuracy {acc:.3f}, mean score {mean:.3f}",
              flush=True)
    rewards = [r["reward_mean"] for r in res.metrics if "reward_mean" in r]
    dtype = next(iter(plan.dtypes.values())).dtype if plan.dtypes else plan.graph.spec.model.dtype
    return {"seed": seed, "eval_before": evals[0][1], "eval_after": evals[-1][1], "eval_mean_before": evals[0][2],
            "eval_mean_after": evals[-1][2], "reward_first": rewards[0], "reward_last": sum(rewards[-3:]) / 3,
            "s_per_step": res.summary.get("s_per_step"), "minutes": (time.perf_counter() - t0) / 60, "dtype": dtype,
            "evals": [{"step": s, "accuracy": a, "mean": round(m, 4)} for s, a, m, _ in evals]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="18 iterations, 2 seeds, 128 held-out items")
    ap.add_argument("--iterations", type=int, default=None, help="training steps (default 18 quick, the graph's 24 full)")
    ap.add_argument("--seeds", type=int, default=None, help="training runs from seeds 0..N-1 (default 2 quick, 3)")
    ap.add_argument("--eval-items", type=int, default=None, help="held-out items (default 128 quick, 256)")
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
    seeds = list(range(args.seeds or (2 if args.quick else 3)))
    items = args.eval_items or (128 if args.quick else 256)
    overrides = [f"schedule.iterations={iterations}", "checkpoint.every=null", f"task.eval_prompts={items}"]
    overrides += args.overrides
    if args.dataset:
        overrides += [f"task.options.dataset={args.dataset}", "task.options.config={}"]
    spec = og.load(GRAPH, overrides)
    print(f"learn: {spec.model.path} on reasoning-gym {spec.task.options['dataset']} {spec.task.options.get('config', {})}, {iterations} steps "
          f"of {spec.task.prompts} x {spec.task.samples_per_prompt}, seeds {seeds}, greedy eval on "
          f"{spec.task.eval_prompts} held-out items (the same for every seed) at the first and last step", flush=True)
    runs = []
    for seed in seeds:
        with tempfile.TemporaryDirectory() as tmp:
            runs.append(one_seed(og, run, overrides, seed, tmp))
    mean = lambda k: sum(r[k] for r in runs) / len(runs)  # noqa: E731
    before, after = mean("eval_before"), mean("eval_after")
    out = {"task": f"reasoning_gym:{spec.task.options['dataset']}", "model": spec.model.path, "backend": "vllm",
           "reward_fn": spec.nodes["reward"].fn, "seeds": seeds,
           "eval_before": round(before, 4), "eval_after": round(after, 4), "gain": round(after - before, 4),
           "gains": [round(r["eval_after"] - r["eval_before"], 4) for r in runs],
           "eval_mean_before": round(mean("eval_mean_before"), 4), "eval_mean_after": round(mean("eval_mean_after"), 4),
           "eval_items": spec.task.eval_prompts, "steps": iterations, "minutes": round(sum(r["minutes"] for r in runs), 2),
           "s_per_step": round(mean("s_per_step"), 3), "dtype": runs[0]["dtype"],
           "reward_first": round(mean("reward_first"), 4), "reward_last": round(mean("reward_last"), 4),
           "runs": [{k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items()} for r in runs]}
    print(f"eval accuracy {before:.3f} -> {after:.3f} ({after - before:+.3f}; per seed "
          f"{', '.join(f'{g:+.3f}' for g in out['gains'])}) in {iterations} steps, {out['minutes']:.1f} min", flush=True)
    record.emit("learn", out, args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
