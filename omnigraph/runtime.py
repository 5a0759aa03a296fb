"""The run loop: a run directory, an executor, per-step metrics, a live progress bar.

``run(plan)`` creates ``<runtime.run_dir>/<name>-<timestamp>/`` holding

- ``config.yaml``: the resolved spec (every default written out);
- ``plan.txt``: ``print(plan)``;
- ``metrics.jsonl``: one JSON object per step (see :func:`step_metrics`);
- ``summary.json``: totals at the end.

It never writes outside that directory and never reuses an existing one.
"""

from __future__ import annotations

import errno
import json
import os
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from .errors import GraphError, NodeFailure
from .executors.base import StepResult, make_executor


TIMELINE_STEPS = 16
"""Node runs of the first steps go to timeline.jsonl, for the measured pipeline picture."""


@dataclass
class RunResult:
    run_dir: Path
    steps: int
    wall_s: float
    metrics: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)


def new_run_dir(parent: str | Path, name: str) -> Path:
    parent = Path(parent)
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    for n in range(1000):
        d = parent / (f"{name}-{stamp}" + (f"-{n}" if n else ""))
        try:
            d.mkdir(parents=True, exist_ok=False)
            return d
        except FileExistsError:
            continue
        except OSError as e:
            raise GraphError(f"cannot create the run directory {d}: {e.strerror}", where="runtime.run_dir",
                             fix="point runtime.run_dir at a writable folder") from None
    raise GraphError(f"too many runs named {name} this second in {parent}", where="runtime.run_dir")


SKIP = {"node", "actor", "step", "seconds", "t_start", "t_end", "trained_groups", "dropped_groups",
        "generated_groups", "kind", "wait_s", "wait_for", "weights", "apply_s"}


def step_metrics(result: StepResult, elapsed: float, step_s: float, plan=None) -> dict[str, Any]:
    """Fold one step's records into one metrics row.

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
            if k in SKIP:
                continue
            if k in ("staleness_max", "version", "weights_version"):
                row[k] = max(row.get(k, v), v)
            elif k in ("dropped", "samples", "regenerated"):
                row[k] = row.get(k, 0) + v
            elif k == "batch":
                row[f"{r['node']}/batch"] = v
            else:
                row.setdefault(k, v)
    if plan is not None:
        _pipeline_metrics(row, plan, busy, waits, applies, step_s)
    return row


def _pipeline_metrics(row, plan, busy, waits, applies, step_s) -> None:
    trainer = plan.graph.update.pool
    pool_of = {a: x.pool for a, x in plan.actors.items()}
    row["timing_s/gen"] = round(max((w for (a, weights), w in waits.items()
                                     if pool_of[a] == trainer and not weights), default=0.0), 6)
    rollout = {n.pool for n in plan.graph.of_kind("generate")}
    export = sum(row.get(f"timing_s/{n.name}", 0.0) for n in plan.graph.of_kind("sync"))
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


class _Files:
    """The run's append-only JSON-lines files, with their line counts (checkpoints record them)."""

    NAMES = ("metrics", "ledger", "timeline")

    def __init__(self, out: Path, counts: dict[str, int] | None):
        self.out = out
        if counts is not None:                 # resuming: cut what came after the checkpoint
            for name in self.NAMES:
                _truncate_lines(out / f"{name}.jsonl", counts.get(f"{name}_lines", 0))
        self.counts = {n: _count_lines(out / f"{n}.jsonl") for n in self.NAMES}
        self.f = {n: open(out / f"{n}.jsonl", "a") for n in self.NAMES}

    def write(self, name: str, obj: dict) -> None:
        self.f[name].write(json.dumps(obj) + "\n")
        self.counts[name] += 1

    def flush(self) -> None:
        for f in self.f.values():
            f.flush()
            os.fsync(f.fileno())

    def close(self) -> None:
        for f in self.f.values():
            f.close()


def _count_lines(path: Path) -> int:
    return path.read_text().count("\n") if path.exists() else 0


def _truncate_lines(path: Path, n: int) -> None:
    if path.exists():
        lines = path.read_text().splitlines(keepends=True)[:n]
        path.write_text("".join(lines))


def run(plan, *, run_dir: str | Path | None = None, executor: str | None = None, progress: bool = True,
        console=None, resume: str | Path | None = None) -> RunResult:
    """Run ``plan``; with ``resume`` (a run directory) continue it from its newest good checkpoint.

    Supervision: when a node fails or an actor dies, the actors are torn down, started again and
    the run resumes from the last checkpoint (from the start without one), at most
    ``runtime.max_restarts`` times, each restart logged with its cause; then the error stops the run.
    """
    from . import checkpoint as ckpt
    spec = plan.graph.spec
    if resume is None:
        out = new_run_dir(run_dir or spec.runtime.run_dir, spec.name)
        (out / "config.yaml").write_text(yaml.safe_dump(spec.model_dump(mode="json"), sort_keys=False))
        (out / "plan.txt").write_text(str(plan) + "\n")
    else:
        out = Path(resume)
    graph_id = ckpt.graph_hash((out / "config.yaml").read_text())
    bar = _Progress(plan, enabled=progress, console=console)
    restarts: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    with bar:
        if any(n.backend in ("hf", "vllm", "torch") for n in plan.graph.nodes.values()):
            from nodes import models
            bar.status("preparing the model")
            models.resolve(spec.model.path, spec.model.seed, log=bar.log)
        while True:
            os.environ["OMNIGRAPH_ATTEMPT"] = str(len(restarts))
            try:
                rows = _attempt(plan, out, graph_id, executor, bar, t0, resume=resume is not None or bool(restarts))
                break
            except NodeFailure as e:
                if len(restarts) >= spec.runtime.max_restarts:
                    if restarts:
                        raise NodeFailure(e.node, e.iteration, f"{e.detail} (after {len(restarts)} restart(s))") from e
                    raise
                restarts.append({"attempt": len(restarts) + 1, "cause": str(e), "time": round(time.perf_counter() - t0, 3)})
                (out / "restarts.jsonl").open("a").write(json.dumps(restarts[-1]) + "\n")
                bar.log(f"restart {len(restarts)}/{spec.runtime.max_restarts}: {e}")
    wall = time.perf_counter() - t0
    summary = _summary(plan, rows, wall, out)
    summary["restarts"] = restarts
    from .plots import plot_run
    summary["plots"] = [str(p) for p in plot_run(out)]
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return RunResult(run_dir=out, steps=len(rows), wall_s=wall, metrics=rows, summary=summary)


def _attempt(plan, out: Path, graph_id: str, executor, bar, t0: float, resume: bool) -> list[dict[str, Any]]:
    """One life of the actors: start, restore the newest checkpoint (when resuming), run, save."""
    from . import checkpoint as ckpt
    from .ledger import events
    spec = plan.graph.spec
    restart = ckpt.load_latest(out, graph_id, log=bar.log if bar.enabled else print) if resume else None
    start = restart.step + 1 if restart else 0
    files = _Files(out, restart.manifest if restart else ({} if resume else None))
    ex = make_executor(plan, executor, on_status=bar.status)
    from .loggers import make
    loggers = make(spec.runtime.loggers, out, start)
    every = spec.checkpoint.every
    barrier = (lambda t: bool(every) and 0 < t < plan.steps and t % every == 0) if every else None
    rows: list[dict[str, Any]] = []
    try:
        bar.status(f"starting {ex.name} executor: actors, models")
        ex.start()
        if restart:
            bar.log(f"resuming from {restart.path.name}: continuing at step {start}")
            ex.restore(restart.snapshots)
        bar.skip(start)
        bar.status("first step")
        last = time.perf_counter()
        for result in ex.steps(start, barrier=barrier):
            now = time.perf_counter()
            row = step_metrics(result, now - t0, now - last, plan)
            last = now
            rows.append(row)
            files.write("metrics", row)
            for r in result.records:
                if result.step < TIMELINE_STEPS and "t_start" in r:
                    files.write("timeline", {k: r[k] for k in ("node", "actor", "step", "t_start", "t_end")})
                for e in events(r):
                    files.write("ledger", e)
            files.flush()
            for lg in loggers:
                lg.log(row)
                lg.flush()
            bar.advance(row)
            if barrier and barrier(result.step + 1):
                bar.status(f"checkpoint after step {result.step}")
                ckpt.save(out, result.step, graph_id, ex.snapshot(), dict(files.counts), spec.checkpoint.keep)
        bar.status("saving final weights")
        ex.finish(str(out))
    except OSError as e:
        if e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EROFS):
            raise GraphError(f"cannot write to the run directory: {e.strerror}", where=str(out),
                             fix="free disk space, then continue with omnigraph run --resume "
                                 f"{out} (everything up to the last checkpoint is intact)") from None
        raise
    finally:
        _quietly(files.close)
        for lg in loggers:
            _quietly(lg.close)
        _quietly(ex.stop)
    return rows


def _quietly(fn) -> None:
    """Clean-up that must not replace the error that is already on its way out."""
    import sys
    try:
        fn()
    except Exception as e:  # noqa: BLE001
        if sys.exc_info()[0] is None:
            print(f"warning: clean-up failed: {type(e).__name__}: {e}", file=sys.stderr)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The JSON objects of a run's ``.jsonl`` file, one per line; blank or broken lines (a torn last line of
    an interrupted run) are skipped, a missing file has none."""
    if not path.is_file():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if isinstance(obj, dict):
            out.append(obj)
    return out


def steady(rows: list, fill: int) -> list:
    """The steady-state rows of a run: the first step (start-up) and the pipeline's fill and drain left out."""
    return rows[fill + 1: len(rows) - fill] or rows[1:] or rows


def _summary(plan, rows, wall, out) -> dict[str, Any]:
    from .ledger import read
    ledger = read(out)
    rewards = [r["reward_mean"] for r in rows if "reward_mean" in r]
    steps = sorted(r["step_s"] for r in steady(rows, plan.fill))
    stale = [r["staleness_max"] for r in rows if "staleness_max" in r]
    return {
        "run_dir": str(out), "steps": len(rows), "iterations": plan.iterations, "wall_s": round(wall, 3),
        "s_per_step": round(steps[len(steps) // 2], 4) if steps else None,
        "startup_s": round(rows[0]["wall_s"] - rows[0]["step_s"], 3) if rows else None,
        "groups_generated": ledger.generated, "groups_trained": ledger.trained_once,
        "groups_dropped": sum(ledger.dropped.values()),
        "groups_trained_twice": len(ledger.trained_twice), "groups_lost": ledger.lost,
        "dropped_samples": sum(r.get("dropped", 0) for r in rows),
        "staleness_bound": plan.bound, "observed_max_staleness": max(stale, default=0),
        "reward_first": rewards[0] if rewards else None, "reward_last": rewards[-1] if rewards else None,
    }


class _Progress:
    """A rich progress bar with step, reward, staleness and s/step (silent when disabled)."""

    def __init__(self, plan, enabled: bool, console=None):
        self.enabled = enabled
        self.total = plan.steps
        if not enabled:
            return
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
        self.progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), TextColumn("{task.fields[info]}"), console=console,
                                 transient=False)
        self.task = self.progress.add_task(plan.name, total=self.total, info="")

    def __enter__(self):
        if self.enabled:
            self.progress.__enter__()
        return self

    def __exit__(self, *exc):
        if self.enabled:
            self.progress.__exit__(*exc)

    def skip(self, steps: int) -> None:
        if self.enabled:
            self.progress.update(self.task, completed=steps)

    def log(self, text: str) -> None:
        if self.enabled:
            self.progress.console.print(text)

    def status(self, text: str) -> None:
        if self.enabled:
            self.progress.update(self.task, info=text)

    def advance(self, row: dict[str, Any]) -> None:
        if not self.enabled:
            return
        parts = []
        if "reward_mean" in row:
            parts.append(f"reward {row['reward_mean']:.3f}")
        if "staleness_max" in row:
            parts.append(f"staleness {row['staleness_max']}")
        parts.append(f"{row['step_s']:.3f} s/step")
        self.progress.update(self.task, advance=1, info="  ".join(parts))
