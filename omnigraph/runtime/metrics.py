"""One metrics row per step, folded from the records every node run returns; the run's summary.

Every node run gives a record (node, actor, step, seconds, t_start/t_end and
what the node logged with ``ctx.log``); the executors add ``wait`` and
``apply`` records. :func:`step_metrics` folds one step's records into the row
written to ``metrics.jsonl``.
"""

from __future__ import annotations

from typing import Any

from ..executors.base import StepResult
from .ledger import read
from ..records import steady

SKIP = {"node", "actor", "step", "seconds", "t_start", "t_end", "trained_groups", "dropped_groups",
        "generated_groups", "generated_rows", "regenerated_groups", "emitted_groups", "carried_groups", "kind",
        "wait_s", "wait_for", "weights", "apply_s", "spans"}


def step_metrics(result: StepResult, elapsed: float, step_s: float, plan=None) -> dict[str, Any]:
    """Fold one step's records into one metrics row.

    Off-policy, on every step the trainer trains: ``staleness_mean`` and ``staleness_max`` of the batch as it
    reached the trainer (``on_stale: wait``: of the regenerated batch), ``dropped`` and ``regenerated``
    samples, ``dropped_groups`` and ``regenerated_groups`` (prompt groups).

    ``timing_s/<node>``: compute seconds (slowest rank); ``timing_s/gen``: how long the
    trainer waited for samples (~0 when generation is hidden); ``timing_s/update_weights``:
    export + the rollout's wait for and loading of new weights (``timing_s/apply_weights``: the loading
    alone, on the rollout's actor before it generates); ``bubble/<pool>``: the
    fraction of the step the pool's actors sat idle.
    """
    row: dict[str, Any] = {"step": result.step, "wall_s": round(elapsed, 6), "step_s": round(step_s, 6),
                           "fired": sorted(result.fired)}
    busy: dict[str, float] = {}
    waits: dict[tuple[str, bool], float] = {}
    applies: dict[str, float] = {}
    groups: dict[str, set] = {"dropped_groups": set(), "regenerated_groups": set()}
    scored: list[tuple[float, int]] = []          # (reward_mean, samples) of every scorer that ran this step
    for r in result.records:
        kind = r.get("kind", "run")
        if kind == "wait":
            key = (r["actor"], bool(r.get("weights")))
            waits[key] = waits.get(key, 0.0) + r["wait_s"]
            continue
        if kind == "apply":
            applies[r["actor"]] = applies.get(r["actor"], 0.0) + r["apply_s"]
            continue
        key = f"timing_s/{r['node']}"
        row[key] = max(row.get(key, 0.0), r.get("seconds", 0.0))
        busy[r["actor"]] = busy.get(r["actor"], 0.0) + r.get("seconds", 0.0)
        for k, v in r.items():
            if k in groups:
                groups[k].update(v)
            if k in SKIP:
                continue
            if k == "reward_mean" and "scored" in r:
                scored.append((v, r["scored"]))
            if k in ("staleness_max", "version", "weights_version"):
                row[k] = max(row.get(k, v), v)
            elif k in ("dropped", "samples", "regenerated", "regenerate_s", "scored"):
                row[k] = row.get(k, 0) + v
            elif k == "batch":
                row[f"{r['node']}/batch"] = v
            else:
                row.setdefault(k, v)
    if len(scored) > 1:                         # shares of one step's prompts scored apart (a lent scorer's)
        row["reward_mean"] = sum(m * n for m, n in scored) / max(sum(n for _, n in scored), 1)
    if "staleness_max" in row:                  # the trainer trained: the off-policy figures, every such step
        row.setdefault("regenerated", 0)
        row.update({k: len(v) for k, v in groups.items()})
    if plan is not None:
        _pipeline_metrics(row, plan, busy, waits, applies, step_s)
    return row


def _pipeline_metrics(row, plan, busy, waits, applies, step_s) -> None:
    trainer = plan.graph.trainer.pool
    pool_of = {a: x.pool for a, x in plan.actors.items()}
    row["timing_s/gen"] = round(max((w for (a, weights), w in waits.items()
                                     if pool_of[a] == trainer and not weights), default=0.0), 6)
    rollout = {n.pool for n in plan.graph.of_role("generator")}
    export = sum(row.get(f"timing_s/{n.name}", 0.0) for n in plan.graph.of_role("exporter"))
    receive = max((waits.get((a, True), 0.0) + applies.get(a, 0.0) for a in plan.actors if pool_of[a] in rollout),
                  default=0.0)
    row["timing_s/update_weights"] = round(export + receive, 6)
    loads = [applies[a] for a in plan.actors if pool_of[a] in rollout and a in applies]
    if loads:
        row["timing_s/apply_weights"] = round(max(loads), 6)
    if step_s > 0:
        for pool in dict.fromkeys(pool_of.values()):
            actors = [a for a in plan.actors if pool_of[a] == pool]
            mean_busy = sum(busy.get(a, 0.0) for a in actors) / len(actors)
            row[f"bubble/{pool}"] = round(min(1.0, max(0.0, 1 - mean_busy / step_s)), 4)


def summary(plan, rows, wall, out) -> dict[str, Any]:
    ledger = read(out, finished=True)          # every step done: nothing is in flight any more
    rewards = [r["reward_mean"] for r in rows if "reward_mean" in r]
    steps = sorted(r["step_s"] for r in steady(rows, plan.fill))
    stale = [r["staleness_max"] for r in rows if "staleness_max" in r]
    tokens = [r["token_staleness_max"] for r in rows if "token_staleness_max" in r]
    extra = {"observed_max_token_staleness": max(tokens), "groups_carried": ledger.carried} if ledger.carried else {}
    return {
        "run_dir": str(out), "steps": len(rows), "iterations": plan.iterations, "wall_s": round(wall, 3),
        "s_per_step": round(steps[len(steps) // 2], 4) if steps else None,
        "startup_s": round(rows[0]["wall_s"] - rows[0]["step_s"], 3) if rows else None,
        "groups_generated": ledger.generated, "groups_trained": ledger.trained_once,
        "groups_dropped": sum(ledger.dropped.values()),
        "groups_trained_twice": len(ledger.trained_twice), "groups_lost": ledger.lost,
        "dropped_samples": sum(r.get("dropped", 0) for r in rows),
        "regenerated_samples": sum(r.get("regenerated", 0) for r in rows),
        "regenerate_s": round(sum(r.get("regenerate_s", 0.0) for r in rows), 3),
        "nonfinite_skipped": sum(int(r.get("nonfinite_skipped", 0)) for r in rows),   # NaN/inf: updates skipped
        "staleness_bound": plan.bound, "observed_max_staleness": max(stale, default=0),
        "reward_first": rewards[0] if rewards else None, "reward_last": rewards[-1] if rewards else None,
        **extra,
    }
