"""Multi-turn benchmark: does a model learn to use a tool through omnigraph's episodes, and is the tool's
latency hidden behind generation?

Trains SmolLM2-135M-Instruct (LoRA, one step off-policy, vLLM sampling) on ``graphs/smollm2_calculator.yaml``:
3-digit multiplications it cannot do alone, with a calculator environment whose every step first waits
``latency_s`` (a modelled slow tool, 0.5 s by default). The reward is the environment's: 1.0 for the right
``<answer>``. Reported from the run's own metrics:

- ``reward_first``: mean reward of the batches sampled by the initial weights; ``reward_last``: the last
  three steps'; ``turns_mean`` and ``tool_calls_per_episode``: the last three steps' (``*_first``: the
  initial weights'); means over the seeds, with ``gains`` per seed and each seed's figures in ``runs``;
- ``behav_vs_old_logprob_maxdiff_max``: the largest gap between the sampler's log-prob of a token and the
  trainer's (a rollout serving other weights than the trainer's shows here first); ``weights_packed_layers``:
  layers vLLM computed from omnigraph's refilled AMX layout (``options.packed_weights``; 0: vLLM's own);
- ``env_latency_s``: mean seconds per environment step; ``env_overlap_efficiency``: the share of the
  episode loop's wall time not spent blocked on the environment (ideal, the time generation alone takes,
  over measured), averaged over the steps; ``env_s`` / ``env_wait_s``: environment seconds per step
  summed over the episodes, and the part of them the rollout waited for.

    python bench/multiturn.py [--quick] [--iterations N] [--seeds N] [key.path=value ...]

``--quick``: 20 iterations from 2 seeds (3 full). Needs the ``vllm`` extra (``nodes.generate.backend=hf`` runs without it). Prints
one JSON line last and saves it under bench/results/ (``bench/record.py``).
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

GRAPH = ROOT / "graphs" / "smollm2_calculator.yaml"


def _mean(rows: list[dict], key: str) -> float:
    vals = [r[key] for r in rows if key in r]
    return round(sum(vals) / max(len(vals), 1), 4)


def one_seed(og, run, overrides: list[str], seed: int) -> dict:
    from omnigraph.testing import initial_reward
    plan = og.compile(GRAPH, overrides=[*overrides, f"runtime.seed={seed}"])
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        res = run(plan, run_dir=tmp, progress=True)
    rows = [r for r in res.metrics if "turns_mean" in r]
    scored = [r for r in res.metrics if "reward_mean" in r]
    first = [r for r in rows if r.get("weights_version") == 0]
    last = rows[-3:]
    evals = [(r["step"], r["eval_accuracy"]) for r in res.metrics if "eval_accuracy" in r]
    gaps = [r["behav_vs_old_logprob_maxdiff_max"] for r in res.metrics if "behav_vs_old_logprob_maxdiff_max" in r]
    return {"seed": seed, "reward_first": initial_reward(res.metrics),
            "reward_last": sum(r["reward_mean"] for r in scored[-3:]) / 3,
            "turns_mean": _mean(last, "turns_mean"), "turns_mean_first": _mean(first, "turns_mean"),
            "tool_calls_per_episode": _mean(last, "tool_calls_per_episode"),
            "tool_calls_per_episode_first": _mean(first, "tool_calls_per_episode"),
            "env_latency_s": _mean(rows, "env_latency_s"), "env_overlap_efficiency": _mean(rows, "env_overlap_efficiency"),
            "env_s": _mean(rows, "env_s"), "env_wait_s": _mean(rows, "env_wait_s"),
            "eval_before": evals[0][1] if evals else None, "eval_after": evals[-1][1] if evals else None,
            "behav_vs_old_logprob_maxdiff_max": max(gaps, default=None),
            "weights_packed_layers": max((r.get("weights_packed_layers", 0) for r in res.metrics), default=0),
            "minutes": (time.perf_counter() - t0) / 60, "s_per_step": res.summary.get("s_per_step")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="20 iterations, 2 seeds")
    ap.add_argument("--iterations", type=int, default=None, help="training steps (default 20 quick, 30 full)")
    ap.add_argument("--seeds", type=int, default=None, help="training runs from seeds 0..N-1 (default 2 quick, 3)")
    ap.add_argument("overrides", nargs="*", help="key.path=value overrides of the graph")
    import record
    record.add_arguments(ap)
    args = ap.parse_args()
    import omnigraph as og
    from omnigraph.runtime import run

    iterations = args.iterations or (20 if args.quick else 30)
    seeds = list(range(args.seeds or (2 if args.quick else 3)))
    overrides = [f"schedule.iterations={iterations}", "checkpoint.every=null", *args.overrides]
    spec = og.load(GRAPH, overrides)
    gen = spec.nodes["generate"]
    if gen.backend == "vllm" and importlib.util.find_spec("vllm") is None:
        sys.exit("bench/multiturn.py needs the vllm extra (pip install -e '.[vllm]'), or nodes.generate.backend=hf")
    print(f"multiturn: {spec.model.path} on {spec.task.name} with the {gen.env.name} environment "
          f"(latency {gen.env.options.get('latency_s', 0)} s per step, {gen.env.waves} waves), {iterations} steps of "
          f"{spec.task.prompts} x {spec.task.samples_per_prompt} episodes, seeds {seeds}", flush=True)
    runs = [one_seed(og, run, overrides, seed) for seed in seeds]
    mean = lambda k: round(sum(r[k] for r in runs) / len(runs), 4) if all(r[k] is not None for r in runs) else None  # noqa: E731
    out = {"task": f"{spec.task.name}+{gen.env.name}", "model": spec.model.path, "backend": gen.backend,
           "packed_weights": bool(gen.options.get("packed_weights", False)), "seeds": seeds,
           **{k: mean(k) for k in ("reward_first", "reward_last", "turns_mean", "turns_mean_first",
                                   "tool_calls_per_episode", "tool_calls_per_episode_first", "env_latency_s",
                                   "env_overlap_efficiency", "env_s", "env_wait_s", "eval_before", "eval_after",
                                   "s_per_step")},
           "gains": [round(r["reward_last"] - r["reward_first"], 4) for r in runs],
           "behav_vs_old_logprob_maxdiff_max": max((r["behav_vs_old_logprob_maxdiff_max"] or 0) for r in runs),
           "weights_packed_layers": max(r["weights_packed_layers"] for r in runs),
           "waves": gen.env.waves, "steps": iterations, "minutes": round(sum(r["minutes"] for r in runs), 2),
           "episodes_per_step": spec.task.prompts * spec.task.samples_per_prompt,
           "runs": [{k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items()} for r in runs]}
    print(f"reward {out['reward_first']:.3f} -> {out['reward_last']:.3f} (per seed "
          f"{', '.join(f'{g:+.3f}' for g in out['gains'])}), tool calls per episode "
          f"{out['tool_calls_per_episode_first']:.2f} -> {out['tool_calls_per_episode']:.2f}, environment overlap "
          f"{out['env_overlap_efficiency']:.3f}, {out['minutes']:.1f} min", flush=True)
    record.emit("multiturn", out, args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
