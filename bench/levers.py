"""The seed's three levers, measured side by side on real runs: delta sync, lending, the layout advisor.

``python bench/levers.py --quick`` runs, on the tiny model, CPU, local Ray (every run the same graph but for
what is compared, one after another in this process):

1. **Delta sync** (``nodes.sync.payload``): the shipped graph (fp32 weights, its learning rate 3e-4) with
   ``full`` and with ``delta``; then the same pair in bf16 (``model.dtype: bfloat16``: fp32 masters, bf16 on
   the wire) at the shipped rate and at 1e-6 (the order of an LLM's RL rate). ``delta_bytes_fraction``: the
   delta run's bytes over the dense bytes of the same syncs, the dense first sync left out; ``delta_sync_speedup``:
   the median seconds per sync (export on the trainer + load on the rollout) of the full run over the delta run's.
2. **Lending** (``schedule.lend``): a rollout-bound variant of the shipped graph (its reward verifies every
   answer with ``math_verify``: the rollout generates and verifies, the trainer waits) run without lending;
   its measured node times are given to the planner (``nodes.*.cost``) and the graph run again with
   ``lend: auto``; twice each, alternating. ``lend_speedup``: s/step without over s/step with (medians);
   ``lend_run_node_s`` / ``no_lend_run_node_s``: each node's median seconds in the first run of each side
   (the verifier's cost follows the completions, which differ once lending changes who samples what).
   On this CPU the tiny model's update costs more than its generation, whatever the length of the
   completions (both grow with the tokens), so generation alone never leaves the trainer idle here.
3. **The advisor** (``omnigraph plan --devices``): ``advisor_picks`` for timings shaped like the seed's
   (trainer-bound, on 4 devices) and a generation-bound workload (long tail, on 2), as the tests feed it; then a
   real calibration: the shipped graph on 1 + 1 CPU and the colocated sync graph on 2, the advisor fitted on both,
   its recommendation for 2 CPUs written out and run fresh. ``advisor_pred_error``: |predicted - measured| /
   measured s/step of that run.

Every s/step is the run's steady-state median (``summary.json``). The machine is shared and has 2 cores: the
runs are one at a time.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "tests"))
GRAPH = str(ROOT / "graphs" / "grpo_one_step_off.yaml")
SYNC_GRAPH = str(ROOT / "graphs" / "grpo_sync.yaml")


def go(graph: str, overrides: list[str], where: Path, label: str):
    import omnigraph as og
    from omnigraph.runtime import run
    plan = og.compile(graph, overrides=overrides)
    result = run(plan, run_dir=where / label, progress=False)
    rows = [json.loads(x) for x in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    print(f"{label}: {result.summary.get('s_per_step')} s/step, reward {result.summary.get('reward_first')} -> "
          f"{result.summary.get('reward_last')}", flush=True)
    return result, rows, plan


def sync_costs(rows: list[dict]) -> tuple[float, int, int]:
    """Median seconds per sync after the first (export + the rollout's load), bytes sent and dense bytes."""
    later = [r for r in rows if r.get("sync_bytes")][1:]
    secs = [r.get("sync_export_s", 0.0) + r.get("load_weights_s", 0.0) for r in later]
    sent = sum(r["sync_bytes"] for r in later)
    dense = sum(r.get("sync_dense_bytes", r["sync_bytes"]) for r in later)
    return statistics.median(secs), int(sent), int(dense)


def delta_pair(where: Path, it: int, extra: list[str], tag: str) -> dict:
    base = [f"schedule.iterations={it}", *extra]
    _, full, _ = go(GRAPH, base + ["nodes.sync.payload=full"], where, f"full{tag}")
    _, delta, _ = go(GRAPH, base + ["nodes.sync.payload=delta"], where, f"delta{tag}")
    f_s, f_bytes, _ = sync_costs(full)
    d_s, d_bytes, dense = sync_costs(delta)
    return {f"delta_bytes_fraction{tag}": round(d_bytes / dense, 4), f"delta_sync_speedup{tag}": round(f_s / d_s, 3),
            f"full_sync_s{tag}": round(f_s, 5), f"delta_sync_s{tag}": round(d_s, 5)}


def node_medians(run_dir: Path) -> dict[str, float]:
    """Median seconds of each node's runs after the first quarter of the run (``timeline.jsonl``)."""
    from omnigraph.records import read_jsonl
    rows = read_jsonl(Path(run_dir) / "timeline.jsonl")
    last = max(r["step"] for r in rows)
    per: dict[str, list[float]] = {}
    for r in rows:
        if r["step"] >= last // 4:
            per.setdefault(r["node"], []).append(r["t_end"] - r["t_start"])
    return {n: round(statistics.median(v), 4) for n, v in sorted(per.items())}


def medians(rows: list[dict], fill: int = 1) -> dict[str, float]:
    from omnigraph.planning.whatif import steady_medians
    return steady_medians(rows, fill)


def lending(where: Path, it: int) -> dict:
    """A rollout that generates and then verifies every answer with math_verify (sympy: the rollout's work is
    generation plus verification, the trainer's is short): without lending, then with the planner given the
    node times measured without; twice each, alternating, the median s/step of each side."""
    bound = [f"schedule.iterations={it}", "nodes.reward.fn=math_verify"]
    alone, rows, _ = go(GRAPH, bound, where, "no_lend_1")
    costs = medians(rows)
    costs["generate"] = costs.get("generate", 0.0) + costs.pop("apply_weights", 0.0)
    hints = [f"nodes.{n}.cost={round(c, 4)}" for n, c in costs.items() if n in
             ("generate", "reward", "old_logprob", "update", "sync")]
    lent, lrows, plan = go(GRAPH, bound + hints + ["schedule.lend=auto"], where, "lend_1")
    alone2, _, _ = go(GRAPH, bound, where, "no_lend_2")
    lent2, _, _ = go(GRAPH, bound + hints + ["schedule.lend=auto"], where, "lend_2")
    without = statistics.median([alone.summary["s_per_step"], alone2.summary["s_per_step"]])
    with_ = statistics.median([lent.summary["s_per_step"], lent2.summary["s_per_step"]])
    base = __import__("omnigraph").compile(GRAPH, overrides=bound + hints)
    return {"lend_speedup": round(without / with_, 3), "no_lend_s_per_step": round(without, 4),
            "lend_s_per_step": round(with_, 4),
            "lend_predicted_speedup": round(base.prediction.step_s / plan.prediction.step_s, 3),
            "lend_prompts": plan.lend["lent_prompts"] if plan.lend else 0,
            "lend_predicted_idle_fraction": plan.lend["idle_fraction"] if plan.lend else None,
            "lend_node_s": {n: round(c, 4) for n, c in costs.items()},
            "lend_run_node_s": node_medians(lent.run_dir), "no_lend_run_node_s": node_medians(alone.run_dir),
            "lend_staleness_mean": round(statistics.mean(r["staleness_mean"] for r in lrows
                                                         if "staleness_mean" in r), 4),
            "lend_reward_last": lent.summary.get("reward_last"), "no_lend_reward_last": alone.summary.get("reward_last")}


def advisor(where: Path, it: int) -> dict:
    from omnigraph.planning import layouts
    from omnigraph.planning.compile import to_spec
    from test_layouts import colocated, separate
    seed = separate(where / "seed31", 3, 4, {"generate": 177.5, "reward": 0.5, "old_logprob": 40.0,
                                             "update": 150.0, "sync": 2.2})
    gen1 = separate(where / "gen11", 1, 2, {"generate": 99.5, "reward": 0.5, "old_logprob": 10.0, "update": 48.0,
                                            "sync": 2.0})
    gen2 = colocated(where / "gen2", 2, {"generate": 89.5, "reward": 0.5, "old_logprob": 5.0, "update": 24.0,
                                         "sync": 1.0})
    spec = to_spec(GRAPH)
    picks = {}
    for case, runs, n in (("trainer_bound", [seed], 4), ("generation_bound", [gen1, gen2], 2)):
        scaling, _ = layouts.fit_scaling(spec, runs)
        pick = next(r for r in layouts.layouts(spec, scaling, n) if r.recommended)
        picks[case] = f"{pick.layout}, {pick.schedule}"
    # a real calibration: 1 + 1 CPUs one-step-off (the shipped graph) and 2 CPUs colocated sync
    a, _, _ = go(GRAPH, [f"schedule.iterations={it}"], where, "calib_1+1")
    b, _, _ = go(SYNC_GRAPH, [f"schedule.iterations={it}"], where, "calib_colocated2")
    scaling, runs = layouts.fit_scaling(spec, [str(a.run_dir), str(b.run_dir)])
    rows = layouts.layouts(spec, scaling, 2, runs)
    pick = next(r for r in rows if r.recommended)
    chosen = where / "recommended.yaml"
    from omnigraph import yamlio
    chosen.write_text(yamlio.dump(layouts.chosen_spec(spec, pick)))
    fresh, _, _ = go(str(chosen), [f"schedule.iterations={it}"], where, "recommended")
    measured = fresh.summary["s_per_step"]
    return {"advisor_picks": picks, "advisor_real_pick": f"{pick.layout}, {pick.schedule}",
            "advisor_predicted_s": pick.predicted_s, "advisor_measured_s": measured,
            "advisor_pred_error": round(abs(pick.predicted_s - measured) / measured, 4),
            "advisor_overheads": {r["run"].rsplit("/", 2)[-2]: r.get("overhead_s") for r in runs},
            "advisor_layouts": {f"{r.layout}, {r.schedule}": r.predicted_s for r in rows if r.predicted_s},
            "advisor_scaling": {n: {"a": round(s.a, 5), "b": round(s.b, 5), "efficiency": s.efficiency}
                                for n, s in scaling.items()}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer iterations per run (16, else 40; twice as many "
                                                         "for lending and the advisor, whose runs are s/step)")
    import record
    record.add_arguments(ap)
    args = ap.parse_args()
    it = 16 if args.quick else 40
    out: dict = {}
    with tempfile.TemporaryDirectory(prefix="levers-") as tmp:
        where = Path(tmp)
        out.update(delta_pair(where, it, [], ""))
        out.update(delta_pair(where, it, ["model.dtype=bfloat16"], "_bf16"))
        out.update(delta_pair(where, it, ["model.dtype=bfloat16", "nodes.update.lr=1e-6"], "_bf16_lr1e-6"))
        out.update(lending(where, 2 * it))
        out.update(advisor(where, 2 * it))
    out["model"] = "tiny (embedded), CPU, local Ray; rollout and trainer 1 CPU each unless colocated"
    record.emit("levers", out, args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
