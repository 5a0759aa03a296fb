"""Image-text policy benchmark: pictures in the prompt, sync against one step off, learning on held-out pictures.

``graphs/vlm_sync.yaml`` (one pool of both CPUs: generation, scoring and training take turns) against
``graphs/vlm_one_step_off.yaml`` (rollout and trainer on a core each, overlapped), the embedded ``tiny-vl``
(LLaVA: a CLIP tower and a Qwen2 language model) on the ``shapes`` task (name the squares' colour), on the
``ray`` executor. Both use the same model, pictures, seeds, cores and threads; they alternate, one pair per
seed, and each run's first steps (start-up, pipeline fill) are left out of its s/step (the median of its steady
steps). What differs: the schedule and the layout (one pool of two CPUs against two pools of one).

Reported (last JSON line):

- ``s_per_step_sync``, ``s_per_step_one_step_off``, ``one_step_off_speedup`` (sync / one step off; medians
  over the seeds);
- learning: ``eval_before`` (the initial weights' greedy reward on the 64 held-out pictures, never trained
  on), ``eval_after`` (one step off's at its last step, mean over seeds), the same for sync, and ``eval_gap``:
  sync's held-out gain minus one step off's (mean over seeds; negative where one step off gained more);
  ``eval_after_by_seed`` for both;
- ``encoder_share``: the vision tower's share of a generation firing (its forward timed by hooks), median
  over one step off's steady steps, and ``encoder_s`` per firing;
- ``resume_bit_exact``: a one-step-off run stopped by an injected fault and resumed from its last checkpoint
  has the uninterrupted run's metrics and final weights, bit for bit, with
  ``in_flight_groups_at_checkpoint`` prompt groups (their pictures among them) generated and not yet trained
  in the checkpoint it resumed from; its ledger has every group trained exactly once.

    python bench/multimodal.py [--quick] [--iterations N] [--seeds S] [key.path=value ...]

``--quick``: 30 iterations, 2 seeds. Prints one JSON line last and saves it under bench/results/.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

GRAPHS = {"sync": ROOT / "graphs" / "vlm_sync.yaml", "one_step_off": ROOT / "graphs" / "vlm_one_step_off.yaml"}
KEYS = ("reward_mean", "staleness_max", "loss", "grad_norm", "version", "eval_reward")


def _rows(d: Path) -> list[dict]:
    return [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]


def _one(mode: str, overrides: list[str], run_dir: Path) -> dict:
    import omnigraph as og
    from omnigraph.runtime import run
    t0 = time.perf_counter()
    res = run(og.compile(GRAPHS[mode], overrides=overrides), run_dir=run_dir, progress=False)
    rows, s = res.metrics, res.summary
    evals = [r["eval_reward"] for r in rows if r.get("eval_reward") is not None]
    steady = rows[2:]
    out = {"s_per_step": s["s_per_step"], "eval_before": evals[0], "eval_after": evals[-1],
           "encoder_share": statistics.median(r["encoder_share"] for r in steady if "encoder_share" in r),
           "encoder_s": statistics.median(r["encoder_s"] for r in steady if "encoder_s" in r),
           "run_dir": res.run_dir, "ledger_ok": s["groups_lost"] == 0 and s["groups_trained_twice"] == 0}
    print(f"  {mode:12s}: {out['s_per_step']:.3f} s/step, held-out {out['eval_before']:.3f} -> "
          f"{out['eval_after']:.3f}, vision tower {100 * out['encoder_share']:.1f}% of generation, "
          f"{time.perf_counter() - t0:.0f} s", flush=True)
    return out


def _resume_check(overrides: list[str], whole: Path, tmp: Path, fault_step: int) -> tuple[bool, int]:
    """Interrupt a one-step-off run at ``fault_step`` (a checkpoint after every step), resume it: equal to
    ``whole``? And the groups held in flight by the checkpoint it resumed from."""
    import omnigraph as og
    import torch
    from omnigraph.errors import NodeFailure
    from omnigraph.executors.snapshot import held_groups
    from omnigraph.runtime import run
    from omnigraph.runtime.ledger import read
    from safetensors.torch import load_file
    os.environ["OMNIGRAPH_INJECT"] = f"update@{fault_step}:raise"
    try:
        run(og.compile(GRAPHS["one_step_off"], overrides=[*overrides, "checkpoint.every=1"]), run_dir=tmp,
            progress=False)
        raise SystemExit("the injected fault did not fire")
    except NodeFailure:
        pass
    finally:
        del os.environ["OMNIGRAPH_INJECT"]
    (d,) = tmp.iterdir()
    ckpt = sorted((d / "checkpoints").iterdir())[-1]
    in_flight = sum(len(held_groups(f.read_bytes()) or []) for f in ckpt.glob("*.pkl"))
    print(f"  interrupted at step {fault_step}; resuming from {ckpt.name} with {in_flight} groups in flight",
          flush=True)
    run(og.compile(d / "config.yaml"), resume=d, progress=False)
    pick = lambda rows: [{k: r.get(k) for k in KEYS} for r in rows]  # noqa: E731
    same = pick(_rows(d)) == pick(_rows(whole))
    a, b = load_file(whole / "final" / "model.safetensors"), load_file(d / "final" / "model.safetensors")
    same = same and a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    s = read(d)
    return same and s.ok and s.generated == s.trained_once, in_flight


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="30 iterations, 2 seeds")
    ap.add_argument("--iterations", type=int, default=None, help="training steps per run (default 30)")
    ap.add_argument("--seeds", type=int, default=None, help="pairs of runs, one per seed (default 2 quick, 3)")
    ap.add_argument("overrides", nargs="*", help="key.path=value overrides of both graphs")
    import record
    record.add_arguments(ap)
    args = ap.parse_args()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    iterations = args.iterations or 30
    seeds = args.seeds or (2 if args.quick else 3)
    base = [f"schedule.iterations={iterations}", f"nodes.generate.eval_every={iterations - 1}",
            "runtime.executor=ray", "checkpoint.every=null", *args.overrides]
    import omnigraph as og
    spec = og.compile(GRAPHS["one_step_off"], overrides=base).graph.spec
    print(f"multimodal: {spec.model.path}, task {spec.task.name}, {spec.task.prompts} x "
          f"{spec.task.samples_per_prompt} samples, {iterations} steps, {seeds} seed(s), sync vs one step off",
          flush=True)
    t0 = time.perf_counter()
    runs: dict[str, list[dict]] = {"sync": [], "one_step_off": []}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for seed in range(seeds):
            for mode in runs:
                runs[mode].append(_one(mode, [*base, f"runtime.seed={seed}"], tmp / f"{mode}{seed}"))
        resume_over = [*base[:3], *args.overrides, "runtime.seed=0"]
        exact, in_flight = _resume_check(resume_over, runs["one_step_off"][0]["run_dir"], tmp / "resume",
                                         fault_step=iterations // 2)
    med = lambda mode, k: statistics.median(r[k] for r in runs[mode])  # noqa: E731
    mean = lambda mode, k: statistics.mean(r[k] for r in runs[mode])  # noqa: E731
    gain = lambda mode: mean(mode, "eval_after") - mean(mode, "eval_before")  # noqa: E731
    osf = "one_step_off"
    out = {"model": spec.model.path, "task": spec.task.name, "executor": "ray", "iterations": iterations,
           "seeds": seeds, "samples_per_step": spec.task.prompts * spec.task.samples_per_prompt,
           "s_per_step_sync": round(med("sync", "s_per_step"), 4), "s_per_step_one_step_off": round(med(osf, "s_per_step"), 4),
           "one_step_off_speedup": round(med("sync", "s_per_step") / med(osf, "s_per_step"), 3),
           "eval_before": round(mean(osf, "eval_before"), 4), "eval_after": round(mean(osf, "eval_after"), 4),
           "eval_before_sync": round(mean("sync", "eval_before"), 4), "eval_after_sync": round(mean("sync", "eval_after"), 4),
           "eval_gap": round(gain("sync") - gain(osf), 4),
           "eval_after_by_seed": {m: [r["eval_after"] for r in runs[m]] for m in runs},
           "encoder_share": round(med(osf, "encoder_share"), 4), "encoder_s": round(med(osf, "encoder_s"), 5),
           "encoder_share_sync": round(med("sync", "encoder_share"), 4),
           "ledger_ok": all(r["ledger_ok"] for m in runs for r in runs[m]),
           "resume_bit_exact": exact, "in_flight_groups_at_checkpoint": in_flight,
           "minutes": round((time.perf_counter() - t0) / 60, 2)}
    print(f"one step off x{out['one_step_off_speedup']:.2f} ({out['s_per_step_sync']:.3f} -> "
          f"{out['s_per_step_one_step_off']:.3f} s/step); held-out {out['eval_before']:.3f} -> {out['eval_after']:.3f} "
          f"(sync {out['eval_before_sync']:.3f} -> {out['eval_after_sync']:.3f}, gap {out['eval_gap']:+.3f}); "
          f"resume bit-exact with {in_flight} groups in flight: {exact}", flush=True)
    record.emit("multimodal", out, args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
