"""Partial rollouts benchmark: the same long-tailed GRPO job with and without interruptible generation.

``graphs/grpo_partial.yaml`` on the tiny model, one step off-policy on the ``ray`` executor (rollout and
trainer on a core each). Most numbers have 3 or 4 digits, which the model learns to copy (the reward rises);
one in ten is long (5 to 30 digits) and its completions run on to 20-40 tokens while the others end within
about 14. Without partial rollouts every batch waits for its longest completion; with them a firing decodes
at most 16 new tokens per sample and the unfinished groups continue in the next firing on the new weights
(3 spans at most). Both runs use the same model, data, seeds, cores, threads, ``max_staleness`` (3: the
partial graph's bound) and checkpoints; they alternate (``--repeats`` pairs) and each one's first steps
(start-up, pipeline fill) are left out of its s/step (the median of its steady steps). What differs: the
``partial`` field, and therefore which tokens each firing samples.

Reported (last JSON line):

- ``s_per_step_full``, ``s_per_step_partial``, ``speedup`` (full / partial);
- ``tokens_per_s_full``, ``tokens_per_s_partial``: completion tokens trained per second of steady training;
- ``gen_s_full`` / ``gen_s_partial``: the rollout's seconds per firing; ``trainer_s``: the trainer's;
- learning, per run kind (median over the pairs): ``reward_first_*`` (the first 3 steps' mean reward) and
  ``reward_last_*`` (the last 5 steps'), ``reward_gain_*`` (their difference);
- ``observed_max_staleness``: the largest staleness of a trained sample (and of a token) in the partial runs,
  ``static_bound``: what the compiler proved before they ran (they must be equal: the bound is tight);
- ``resume_bit_exact_in_flight``: a partial run stopped by an injected fault and resumed from a checkpoint
  that holds unfinished samples (``in_flight_groups_at_checkpoint``, at least one: the fault is placed after
  a step that left groups in flight in the uninterrupted run) has the uninterrupted run's metrics and final
  weights, bit for bit, and its ledger has every group trained exactly once.

    python bench/partial.py [--quick] [--iterations N] [--repeats R] [key.path=value ...]

``--quick``: 20 iterations, one pair. Prints one JSON line last and saves it under bench/results/.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

GRAPH = ROOT / "graphs" / "grpo_partial.yaml"
KEYS = ("reward_mean", "staleness_max", "token_staleness_max", "carried_groups_out", "spans_max", "loss",
        "grad_norm", "version")


def _rows(d: Path) -> list[dict]:
    return [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]


def _steady(rows: list[dict], key: str) -> list[float]:
    return [r[key] for r in rows[2:] if key in r]


def _one(overrides: list[str], run_dir: Path, label: str) -> dict:
    import omnigraph as og
    from omnigraph.runtime import run
    plan = og.compile(GRAPH, overrides=overrides)
    t0 = time.perf_counter()
    res = run(plan, run_dir=run_dir, progress=False)
    rows = res.metrics
    s = res.summary
    tokens = statistics.mean(_steady(rows, "returned_tokens"))
    rewards = [r["reward_mean"] for r in rows if "reward_mean" in r]
    out = {"s_per_step": s["s_per_step"], "tokens_per_s": tokens / s["s_per_step"],
           "gen_s": statistics.median(_steady(rows, "timing_s/generate")),
           "trainer_s": statistics.median([a + b for a, b in zip(_steady(rows, "timing_s/old_logprob"),
                                                                 _steady(rows, "timing_s/update"))]),
           "observed": max(s["observed_max_staleness"], s.get("observed_max_token_staleness", 0)),
           "bound": plan.bound, "run_dir": res.run_dir, "ledger_ok": s["groups_lost"] == 0 and
           s["groups_trained_twice"] == 0 and s["groups_trained"] == s["groups_generated"],
           "reward_first": statistics.mean(rewards[:3]), "reward_last": statistics.mean(rewards[-5:]),
           "carried": [r.get("carried_groups_out", 0) for r in rows]}
    print(f"  {label}: {out['s_per_step']:.3f} s/step (rollout {out['gen_s']:.3f} s, trainer {out['trainer_s']:.3f} s "
          f"per step), {out['tokens_per_s']:.0f} tokens/s, staleness {out['observed']} (bound {out['bound']}), "
          f"reward {out['reward_first']:.3f} -> {out['reward_last']:.3f}, {time.perf_counter() - t0:.0f} s", flush=True)
    return out


def _fault_step(carried: list[int], iterations: int) -> int:
    """Where to interrupt: right after the step (of the middle third of the run, else any) that left the most
    prompt groups in flight in the uninterrupted run; with a checkpoint after every step, the resume then
    starts from a checkpoint that holds them."""
    steps = [s for s in range(2, iterations - 2) if carried[s] > 0] or [s for s in range(1, iterations - 1)]
    middle = [s for s in steps if iterations // 3 <= s <= 2 * iterations // 3] or steps
    return max(middle, key=lambda s: (carried[s], -s)) + 1


def _resume_check(overrides: list[str], whole: Path, tmp: Path, fault_step: int) -> tuple[bool, int]:
    """Interrupt a partial run at ``fault_step`` (checkpoints after every step), resume it; equal to ``whole``?
    And the groups in flight in the checkpoint it resumed from."""
    import omnigraph as og
    from omnigraph.errors import NodeFailure
    from omnigraph.runtime import run
    from omnigraph.runtime.ledger import read
    from safetensors.torch import load_file
    import torch
    os.environ["OMNIGRAPH_INJECT"] = f"update@{fault_step}:raise"
    try:
        run(og.compile(GRAPH, overrides=[*overrides, "checkpoint.every=1"]), run_dir=tmp, progress=False)
        raise SystemExit("the injected fault did not fire")
    except NodeFailure:
        pass
    finally:
        del os.environ["OMNIGRAPH_INJECT"]
    (d,) = tmp.iterdir()
    ckpt = sorted((d / "checkpoints").iterdir())[-1]
    snap = pickle.loads((ckpt / "rollout.0.pkl").read_bytes())
    in_flight = len(snap["in_flight"].get("generate", []))
    print(f"  interrupted at step {fault_step}; resuming from {ckpt.name} with {in_flight} groups in flight",
          flush=True)
    run(og.compile(d / "config.yaml"), resume=d, progress=False)
    same = [{k: r.get(k) for k in KEYS} for r in _rows(d)] == [{k: r.get(k) for k in KEYS} for r in _rows(whole)]
    a, b = load_file(whole / "final" / "model.safetensors"), load_file(d / "final" / "model.safetensors")
    same = same and a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    s = read(d)
    return same and s.ok and s.generated == s.trained_once, in_flight


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="20 iterations, one pair of runs")
    ap.add_argument("--iterations", type=int, default=None, help="training steps per run (default 20 quick, 30)")
    ap.add_argument("--repeats", type=int, default=None, help="pairs of runs, alternating (default 1 quick, 3)")
    ap.add_argument("overrides", nargs="*", help="key.path=value overrides of the graph (both runs)")
    import record
    record.add_arguments(ap)
    args = ap.parse_args()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    iterations = args.iterations or (20 if args.quick else 30)
    repeats = args.repeats or (1 if args.quick else 3)
    every = max(2, iterations // 3)
    base = [f"schedule.iterations={iterations}", f"checkpoint.every={every}", "runtime.executor=ray",
            "nodes.generate.eval_every=0", *args.overrides]
    full_over = [*base, "nodes.generate.partial=null"]
    import omnigraph as og
    spec = og.compile(GRAPH, overrides=base).graph.spec
    g = spec.nodes["generate"]
    print(f"partial: {spec.model.path}, {spec.task.prompts} x {spec.task.samples_per_prompt} samples of up to "
          f"{g.max_new_tokens} tokens, budget {g.partial.budget_tokens} tokens x {g.partial.max_spans} spans, "
          f"max_staleness {spec.schedule.max_staleness}, {iterations} steps, {repeats} pair(s)", flush=True)
    full, part = [], []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for i in range(repeats):
            full.append(_one(full_over, tmp / f"full{i}", "full   "))
            part.append(_one(base, tmp / f"partial{i}", "partial"))
        exact, in_flight = _resume_check(base, part[0]["run_dir"], tmp / "resume",
                                         fault_step=_fault_step(part[0]["carried"], iterations))
    med = lambda runs, k: statistics.median(r[k] for r in runs)  # noqa: E731
    out = {"model": spec.model.path, "executor": "ray", "iterations": iterations, "repeats": repeats,
           "samples_per_step": spec.task.prompts * spec.task.samples_per_prompt, "max_new_tokens": g.max_new_tokens,
           "budget_tokens": g.partial.budget_tokens, "max_spans": g.partial.max_spans,
           "max_staleness": spec.schedule.max_staleness,
           "s_per_step_full": round(med(full, "s_per_step"), 4), "s_per_step_partial": round(med(part, "s_per_step"), 4),
           "speedup": round(med(full, "s_per_step") / med(part, "s_per_step"), 3),
           "tokens_per_s_full": round(med(full, "tokens_per_s"), 1),
           "tokens_per_s_partial": round(med(part, "tokens_per_s"), 1),
           "gen_s_full": round(med(full, "gen_s"), 4), "gen_s_partial": round(med(part, "gen_s"), 4),
           "trainer_s_full": round(med(full, "trainer_s"), 4), "trainer_s_partial": round(med(part, "trainer_s"), 4),
           "observed_max_staleness": max(r["observed"] for r in part), "static_bound": part[0]["bound"],
           "static_bound_full": full[0]["bound"], "observed_max_staleness_full": max(r["observed"] for r in full),
           "ledger_ok": all(r["ledger_ok"] for r in full + part),
           "reward_first_partial": round(med(part, "reward_first"), 4), "reward_last_partial": round(med(part, "reward_last"), 4),
           "reward_first_full": round(med(full, "reward_first"), 4), "reward_last_full": round(med(full, "reward_last"), 4),
           "reward_gain_partial": round(med(part, "reward_last") - med(part, "reward_first"), 4),
           "reward_gain_full": round(med(full, "reward_last") - med(full, "reward_first"), 4),
           "resume_bit_exact_in_flight": exact, "in_flight_groups_at_checkpoint": in_flight}
    print(f"speedup x{out['speedup']:.2f} ({out['s_per_step_full']:.3f} -> {out['s_per_step_partial']:.3f} s/step), "
          f"staleness {out['observed_max_staleness']} = bound {out['static_bound']}, resume bit-exact with "
          f"{in_flight} groups in flight: {exact}", flush=True)
    record.emit("partial", out, args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
