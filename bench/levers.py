"""Three levers of a separate rollout and trainer, measured side by side on real runs: delta sync, lending, the layout advisor.

``python bench/levers.py --quick`` runs, on the tiny model, local Ray, on the CPU but where a GPU is said
(every run the same graph but for what is compared, one after another in this process):

1. **Delta sync** (``nodes.sync.payload``): the shipped graph (fp32 weights, its learning rate 3e-4) with
   ``full`` and with ``delta``; then the same pair in bf16 (``model.dtype: bfloat16``: fp32 masters, bf16 on
   the wire) at the shipped rate and at 1e-6 (the order of an LLM's RL rate). ``delta_bytes_fraction``: the
   delta run's bytes over the dense bytes of the same syncs, the dense first sync left out; ``delta_sync_speedup``:
   the median seconds per sync (export on the trainer + load on the rollout) of the full run over the delta run's.
   With a GPU, also ``graphs/gpu/grpo_one_step_off.yaml`` (both pools on the card, bf16, weights by CUDA IPC)
   at its rate and at 1e-6 (``_cuda_ipc`` keys).
2. **Lending** (``schedule.lend``): a rollout-bound graph (:func:`lending_graph`: with a GPU, the shipped graph
   with its rollout on one CPU core and its trainer on the GPU; without, the shipped graph with ``math_verify``
   as its reward) run without lending; its measured node times are given to the planner (``nodes.*.cost``) and
   the graph run again with ``lend: auto``: once as a probe, whose lent share measures how fast the trainer's
   pool generates (``lend_speed``, given to the runs after it as ``schedule.lend_speed``), then twice each,
   alternating. ``lend_speedup``: s/step without over s/step
   with (medians); ``lend_run_node_s`` / ``no_lend_run_node_s``: each node's median seconds in the first run of
   each side. On a CPU the tiny model's update costs more than its generation, whatever the length of the
   completions (both grow with the tokens), so generation alone never leaves a CPU trainer idle; and a
   verifier's cost follows the completions, which differ once lending changes who samples what.
3. **The advisor** (``omnigraph plan --devices``): ``advisor_picks`` for timings shaped like verl-omni's
   published runs (trainer-bound, on 4 devices) and a generation-bound workload (long tail, on 2), as the tests feed it; then a
   real calibration: the shipped graph on 1 + 1 CPU and the colocated sync graph on 2, twice each, the advisor
   fitted on the four runs, its recommendation for 2 CPUs written out and run fresh three times.
   ``advisor_pred_error``: |predicted - measured| / measured s/step, measured the mean of the fresh runs;
   ``advisor_run_spread``: (max - min) / mean of those three runs, the noise the error is read against
   (``advisor_error_within_noise``: the error at most max(0.10, the spread)).

4. **The advisor at scale** (``--only scale``, 8 cores or more): fitted on runs with pools of 1 and 2 cores,
   its predictions for pools of 4 and 8 against fresh runs: ``advisor_scale_error``, the larger relative error.

5. **Delta sync across nodes** (``--only cross``, :mod:`cross_sync`): SmolLM2-135M's weights (269 MB in bf16)
   from a trainer actor on node ``a`` of a two-node local Ray cluster to receivers on node ``b``, dense and as
   deltas, at lr 1e-6, each sync timed from the export's call to the receiver's return:
   ``delta_sync_speedup_cross_node`` (dense seconds over delta seconds, medians), ``receivers_bit_identical``.

``--only delta|lend|advisor|scale|cross`` runs one part (repeatable).

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
GPU_GRAPH = str(ROOT / "graphs" / "gpu" / "grpo_one_step_off.yaml")
PARTS = ("delta", "lend", "advisor", "scale", "cross")
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


def delta_pair(where: Path, it: int, extra: list[str], tag: str, graph: str = GRAPH) -> dict:
    base = [f"schedule.iterations={it}", *extra]
    _, full, plan = go(graph, base + ["nodes.sync.payload=full"], where, f"full{tag}")
    _, delta, _ = go(graph, base + ["nodes.sync.payload=delta"], where, f"delta{tag}")
    f_s, f_bytes, _ = sync_costs(full)
    d_s, d_bytes, dense = sync_costs(delta)
    return {f"delta_bytes_fraction{tag}": round(d_bytes / dense, 4), f"delta_sync_speedup{tag}": round(f_s / d_s, 3),
            f"full_sync_s{tag}": round(f_s, 5), f"delta_sync_s{tag}": round(d_s, 5),
            f"delta_path{tag}": ", ".join(sorted(set(plan.weights.values())))}


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


def lending_graph(cuda: bool) -> tuple[list[str], str]:
    """The rollout-bound graph lending is measured on, and what makes it rollout-bound.

    With a GPU: the shipped graph with its rollout on one CPU core and its trainer on the GPU, the layout where a
    rollout pool is weaker than the trainer's (what lending is for: the trainer waits for every batch). Its costs
    follow the prompts, not the completions (the reward is ``digits_match``, generation stops at
    ``max_new_tokens`` or the batch's last end of text). Without one: the verifier-bound variant (``math_verify``
    on the rollout, both pools one CPU core), whose reward's cost follows what was sampled."""
    if cuda:
        return (["pools.rollout.gpus=0", "pools.trainer.gpus=1"],
                "rollout 1 CPU core (generate, digits_match), trainer 1 GPU (old_logprob, update, sync)")
    return (["nodes.reward.fn=math_verify"], "rollout 1 CPU core (generate, math_verify), trainer 1 CPU core")


def trainer_speed(run_dir: Path, plan) -> float:
    """The trainer's pool's seconds per prompt over the rollout's, measured in a run that lent (its node times as
    for whole steps, :func:`omnigraph.planning.whatif.node_times`); 1 where it lent nothing."""
    from omnigraph.planning.whatif import node_times
    if not (plan.lend and plan.lend["lent_prompts"]):
        return 1.0
    t, *_ = node_times(plan.source, run_dir)
    g, r = "generate", "reward"
    return round((t[g + "_lent"] + t.get(r + "_lent", 0.0)) / (t[g] + t.get(r, 0.0)), 3)


def lending(where: Path, it: int, cuda: bool) -> dict:
    """A rollout-bound graph (:func:`lending_graph`) without lending, then with the planner given the node times
    measured without: first a probe, the share sized by the pools' devices, whose node times measure how fast the
    trainer's pool generates (``schedule.lend_speed`` of the runs after it); then twice each, alternating, the
    median s/step of each side."""
    layout, what = lending_graph(cuda)
    bound = [f"schedule.iterations={it}", *layout]
    alone, rows, _ = go(GRAPH, bound, where, "no_lend_1")
    costs = medians(rows)
    costs["generate"] = costs.get("generate", 0.0) + costs.pop("apply_weights", 0.0)
    hints = [f"nodes.{n}.cost={round(c, 4)}" for n, c in costs.items() if n in
             ("generate", "reward", "old_logprob", "update", "sync")]
    probe, _, probe_plan = go(GRAPH, bound + hints + ["schedule.lend=auto"], where, "lend_probe")
    hints.append(f"schedule.lend_speed={trainer_speed(probe.run_dir, probe_plan)}")
    lent, lrows, plan = go(GRAPH, bound + hints + ["schedule.lend=auto"], where, "lend_1")
    alone2, _, _ = go(GRAPH, bound, where, "no_lend_2")
    lent2, _, _ = go(GRAPH, bound + hints + ["schedule.lend=auto"], where, "lend_2")
    without = statistics.median([alone.summary["s_per_step"], alone2.summary["s_per_step"]])
    with_ = statistics.median([lent.summary["s_per_step"], lent2.summary["s_per_step"]])
    base = __import__("omnigraph").compile(GRAPH, overrides=bound + hints)
    return {"lend_speedup": round(without / with_, 3), "lend_graph": what, "no_lend_s_per_step": round(without, 4),
            "lend_s_per_step": round(with_, 4),
            "lend_runs_s_per_step": {r: x.summary["s_per_step"] for r, x in
                                     (("no_lend_1", alone), ("lend_1", lent), ("no_lend_2", alone2),
                                      ("lend_2", lent2))},
            "lend_predicted_speedup": round(base.prediction.step_s / plan.prediction.step_s, 3),
            "lend_prompts": plan.lend["lent_prompts"] if plan.lend else 0,
            "lend_probe_prompts": probe_plan.lend["lent_prompts"] if probe_plan.lend else 0,
            "lend_probe_s_per_step": probe.summary["s_per_step"],
            "lend_speed": plan.lend["speed"] if plan.lend else None,
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
    # a real calibration: 1 + 1 CPUs one-step-off (the shipped graph) and 2 CPUs colocated sync, twice each
    # (alternating); the recommendation for 2 CPUs then run fresh three times: the machine's run-to-run spread
    # is of the order of the error measured, so one run of each would measure the spread
    calib = []
    for i in (1, 2):
        calib.append(go(GRAPH, [f"schedule.iterations={it}"], where, f"calib_1+1_{i}")[0])
        calib.append(go(SYNC_GRAPH, [f"schedule.iterations={it}"], where, f"calib_colocated2_{i}")[0])
    scaling, runs = layouts.fit_scaling(spec, [str(c.run_dir) for c in calib])
    rows = layouts.layouts(spec, scaling, 2, runs)
    pick = next(r for r in rows if r.recommended)
    chosen = where / "recommended.yaml"
    from omnigraph.graph import yamlio
    chosen.write_text(yamlio.dump(layouts.chosen_spec(spec, pick)))
    fresh = [go(str(chosen), [f"schedule.iterations={it}"], where, f"recommended_{i}")[0].summary["s_per_step"]
             for i in (1, 2, 3)]
    measured = statistics.mean(fresh)
    spread = (max(fresh) - min(fresh)) / measured        # the machine's run-to-run noise on the same layout
    return {"advisor_picks": picks, "advisor_real_pick": f"{pick.layout}, {pick.schedule}",
            "advisor_predicted_s": pick.predicted_s, "advisor_measured_s": measured, "advisor_fresh_s": fresh,
            "advisor_calibration_s": {Path(c.run_dir).parent.name: c.summary["s_per_step"] for c in calib},
            "advisor_pred_error": round(abs(pick.predicted_s - measured) / measured, 4),
            "advisor_run_spread": round(spread, 4),
            "advisor_error_within_noise": abs(pick.predicted_s - measured) / measured <= max(0.10, spread),
            "advisor_overheads": {Path(r["run"]).parent.name: r.get("overhead_s") for r in runs},
            "advisor_layouts": {f"{r.layout}, {r.schedule}": r.predicted_s for r in rows if r.predicted_s},
            "advisor_scaling": {n: {"a": round(s.a, 5), "b": round(s.b, 5), "efficiency": s.efficiency}
                                for n, s in scaling.items()}}


def advisor_scale(where: Path, it: int) -> dict:
    """The advisor's scaling model against bigger pools: fitted on runs with pools of 1 and 2 cores (separate 1+1
    and 2+2 one-step-off, colocated 2 sync), its predictions for separate 4+4 one-step-off and colocated 8 sync
    against fresh runs of those layouts. Needs 8 cores (a 16-core host: the GPU machines')."""
    import os
    from omnigraph.planning import layouts
    from omnigraph.planning.compile import to_spec
    cores = len(os.sched_getaffinity(0))
    if cores < 8:
        return {"advisor_scale": f"not run: needs 8 cores, this machine has {cores}"}
    base = [f"schedule.iterations={it}"]

    def split(k: int) -> list[str]:
        return [*base, f"pools.rollout.cpus={k}", f"pools.trainer.cpus={k}"]

    calib = [go(GRAPH, split(1), where, "scale_1+1")[0], go(GRAPH, split(2), where, "scale_2+2")[0],
             go(SYNC_GRAPH, [*base, "pools.trainer.cpus=2"], where, "scale_colocated2")[0]]
    spec = to_spec(GRAPH)
    scaling, runs = layouts.fit_scaling(spec, [str(c.run_dir) for c in calib])
    rows = {(r.layout, r.schedule): r for r in layouts.layouts(spec, scaling, 8, runs)}
    targets = {("separate 4+4", "one_step_off"): go(GRAPH, split(4), where, "scale_4+4")[0],
               ("colocated 8", "sync"): go(SYNC_GRAPH, [*base, "pools.trainer.cpus=8"], where, "scale_colocated8")[0]}
    out, errors = {}, []
    for (layout, schedule), run in targets.items():
        predicted, measured = rows[(layout, schedule)].predicted_s, run.summary["s_per_step"]
        errors.append(abs(predicted - measured) / measured)
        out[f"{layout}, {schedule}"] = {"predicted_s": predicted, "measured_s": measured,
                                        "error": round(errors[-1], 4)}
    return {"advisor_scale_error": round(max(errors), 4), "advisor_scale_cases": out,
            "advisor_scale_calibration_s": {Path(c.run_dir).parent.name: c.summary["s_per_step"] for c in calib},
            "advisor_scale_cores": cores}


def cross_nodes(steps: int) -> dict:
    """Part 5: dense against delta syncs of SmolLM2-135M between the two nodes of a local cluster."""
    import cross_sync
    from nodes.zoo.smollm2 import materialise
    from omnigraph.cluster import LocalCluster
    with LocalCluster() as c:
        c.add_node("a", cpus=1)
        c.add_node("b", cpus=1)
        return cross_sync.measure(c.address, str(materialise()), steps=steps)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer iterations per run (16, else 40; twice as many "
                                                         "for lending and the advisor, whose runs are s/step)")
    ap.add_argument("--only", action="append", choices=PARTS, help="run this part only (repeatable; default: all)")
    import record
    record.add_arguments(ap)
    args = ap.parse_args()
    it = 16 if args.quick else 40
    import torch
    cuda = torch.cuda.is_available()
    out: dict = {}
    with tempfile.TemporaryDirectory(prefix="levers-") as tmp:
        where = Path(tmp)
        parts = args.only or PARTS
        if "delta" in parts:
            out.update(delta_pair(where, it, [], ""))
            out.update(delta_pair(where, it, ["model.dtype=bfloat16"], "_bf16"))
            out.update(delta_pair(where, it, ["model.dtype=bfloat16", "nodes.update.lr=1e-6"], "_bf16_lr1e-6"))
            if cuda:                 # both pools on the GPU: weights by CUDA IPC, bf16 (graphs/gpu)
                out.update(delta_pair(where, it, [], "_cuda_ipc", GPU_GRAPH))
                out.update(delta_pair(where, it, ["nodes.update.lr=1e-6"], "_cuda_ipc_lr1e-6", GPU_GRAPH))
        if "lend" in parts:
            out.update(lending(where, 2 * it, cuda))
        if "advisor" in parts:
            out.update(advisor(where, 2 * it))
        if "scale" in parts:
            out.update(advisor_scale(where, 2 * it))
        if "cross" in parts:
            out.update(cross_nodes(4 if args.quick else 8))
    out["model"] = ("tiny (embedded), local Ray; delta and advisor: CPU, rollout and trainer 1 CPU each unless "
                    "colocated; lending: " + lending_graph(cuda)[1])
    record.emit("levers", out, args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
