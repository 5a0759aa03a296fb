"""The run loop under supervision: start the actors, step, checkpoint, and restart on failure.

``run(plan)`` creates the run directory (:mod:`.rundir`), prepares the model
once, then runs *attempts*: one life of the actors each. When a node fails or
an actor's process dies, the actors are torn down, started again and the run
resumes from the newest checkpoint that verifies (from the start without
one), at most ``runtime.max_restarts`` times; each restart is logged with its
cause in ``restarts.jsonl`` (as are resumes and damaged checkpoints skipped);
then the error stops the run. Every node failure's traceback is appended to
``errors.log``, and the one-line message names that file.

A step whose update a node skipped for NaN or inf values logs how many such steps came in a row
(``nonfinite_in_a_row``, any ``nonfinite*_in_a_row`` metric: the built-in nodes' guard, ``nodes.nonfinite``);
after ``runtime.max_nonfinite_steps`` in a row the run stops with a :class:`GraphError` naming that setting.
"""

from __future__ import annotations

import errno
import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import plugins
from ..errors import GraphError, NodeFailure
from ..executors import for_executor, make_executor
from . import checkpoint as ckpt
from . import interrupt
from .ledger import events
from .loggers import make as make_loggers, run_params
from .metrics import step_metrics, summary
from .progress import Progress
from .rundir import RunFiles, append, check_data, log_failure, new_run_dir, write_header

TIMELINE_STEPS = 16
"""Node runs of the first steps go to timeline.jsonl, for the measured pipeline picture."""


@dataclass
class RunResult:
    run_dir: Path
    steps: int
    wall_s: float
    metrics: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)


def run(plan, *, run_dir: str | Path | None = None, executor: str | None = None, progress: bool = True,
        console=None, resume: str | Path | None = None) -> RunResult:
    """Run ``plan`` (on ``executor``, default ``runtime.executor``); with ``resume`` (a run directory) continue
    it from its newest good checkpoint."""
    spec = plan.graph.spec
    if executor and executor != spec.runtime.executor:
        plan = for_executor(plan, executor)                 # the weights path may differ
    if resume is None:
        out = new_run_dir(run_dir or spec.runtime.run_dir, spec.name)
        write_header(out, plan)
    else:
        out = Path(resume)
        check_data(out, plan)
    graph_id = ckpt.graph_hash((out / "config.yaml").read_text())
    bar = Progress(plan, enabled=progress, console=console)
    restarts: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    try:
        rows = _supervised(plan, out, graph_id, bar, t0, restarts, resume is not None)
    except KeyboardInterrupt:                       # a second signal, or the grace period ran out
        newest = ckpt.newest(out)
        raise interrupt.Stopped(out, newest[1] if newest else None) from None
    wall = time.perf_counter() - t0
    result = summary(plan, rows, wall, out)
    result["restarts"] = restarts
    (out / "summary.json").write_text(json.dumps(result, indent=2) + "\n")
    return RunResult(run_dir=out, steps=len(rows), wall_s=wall, metrics=rows, summary=result)


def _supervised(plan, out: Path, graph_id: str, bar, t0: float, restarts: list, resume: bool) -> list[dict[str, Any]]:
    """Attempts until one ends: restarts after a node failure, at most ``runtime.max_restarts``."""
    spec = plan.graph.spec
    with bar:
        if any(plugins.backend(n.kind, n.backend).uses_model for n in plan.graph.nodes.values() if n.kind != "custom"):
            bar.status("preparing the model")
            plugins.model_dir(spec.model.path, spec.model.seed, log=bar.log)
        while True:
            if interrupt.requested():
                raise _preempted(out, plan, None)
            os.environ["OMNIGRAPH_ATTEMPT"] = str(len(restarts))
            os.environ["OMNIGRAPH_RUN_DIR"] = str(out)     # the actors' own logs (an agent's traceback) go there
            try:
                return _attempt(plan, out, graph_id, bar, t0, resume=resume or bool(restarts))
            except NodeFailure as e:
                log = log_failure(out, e, len(restarts) + 1)
                where = f" (traceback: {log})" if log and e.traceback else ""      # the one line points to the rest
                if len(restarts) >= spec.runtime.max_restarts:
                    after = f" (after {len(restarts)} restart(s))" if restarts else ""
                    raise NodeFailure(e.node, e.iteration, f"{e.detail}{after}{where}", e.traceback) from e
                restarts.append({"event": "restart", "attempt": len(restarts) + 1, "cause": str(e), "node": e.node,
                                 "step": e.iteration, "time": round(time.perf_counter() - t0, 3)})
                append(out, "restarts", restarts[-1])
                bar.log(f"restart {len(restarts)}/{spec.runtime.max_restarts}: {e}{where}")


def _preempted(out: Path, plan, step: int | None) -> interrupt.Preempted:
    """The stop request honoured: logged in ``restarts.jsonl``, for the message and for the next start."""
    newest = ckpt.newest(out)
    name = newest[1] if newest else None
    if step is None and newest is not None:
        step = newest[0]
    append(out, "restarts", {"event": "preempted", "signal": interrupt.requested(), "step": step, "checkpoint": name})
    return interrupt.Preempted(interrupt.requested() or "a signal", out, step, name, plan.steps)


def _restore_point(out: Path, graph_id: str, bar) -> ckpt.Checkpoint | None:
    """The newest checkpoint that verifies; each damaged one skipped is reported and logged."""
    def damaged(name: str, reason: str) -> None:
        append(out, "restarts", {"event": "checkpoint_damaged", "checkpoint": name, "reason": reason})
        (bar.log if bar.enabled else print)(f"checkpoint {name} is damaged ({reason}); using the previous one")
    point = ckpt.load_latest(out, graph_id, on_damaged=damaged)
    append(out, "restarts", {"event": "resume", "checkpoint": point.path.name if point else None,
                             "from_step": point.step + 1 if point else 0})
    return point


def _attempt(plan, out: Path, graph_id: str, bar, t0: float, resume: bool) -> list[dict[str, Any]]:
    """One life of the actors: start, restore the newest checkpoint (when resuming), run, save."""
    spec = plan.graph.spec
    restart = _restore_point(out, graph_id, bar) if resume else None
    start = restart.step + 1 if restart else 0
    files = RunFiles(out, restart.manifest if restart else ({} if resume else None))

    def status(text: str) -> None:      # the executors report every second while the actors start
        bar.status(text)
        interrupt.reinstall()           # ray.init replaced the SIGTERM handler
        if interrupt.requested():
            raise _preempted(out, plan, None)

    ex = make_executor(plan, on_status=status)
    loggers = make_loggers(spec.runtime.loggers, out, start, run_params(plan, out), spec.runtime.logger_options)
    every = spec.checkpoint.every
    barrier = (lambda t: bool(every) and 0 < t < plan.steps and t % every == 0) if every else None
    rows: list[dict[str, Any]] = []
    try:
        bar.status(f"starting {ex.name} executor: actors, models")
        ex.start()
        interrupt.reinstall()
        if hasattr(ex, "placement"):        # which node each actor is on, per attempt (a lost node's replacement)
            append(out, "placement", {"attempt": int(os.environ.get("OMNIGRAPH_ATTEMPT", "0")),
                                      "actors": ex.placement()})
        if restart:
            bar.log(f"resuming from {restart.path.name}: continuing at step {start}")
            ex.restore(restart.snapshots)
        bar.skip(start)
        bar.status("first step")
        last, done = time.perf_counter(), None
        for result in ex.steps(start, barrier=barrier, stop=interrupt.requested):
            now = time.perf_counter()
            row = step_metrics(result, now - t0, now - last, plan)
            last = now
            rows.append(row)
            files.write("metrics", row)
            for r in result.records:
                if result.step < TIMELINE_STEPS and "t_start" in r:
                    files.write("timeline", {k: r[k] for k in ("node", "actor", "step", "t_start", "t_end")})
                    for label, a, b in r.get("spans", ()):
                        files.write("timeline", {"node": r["node"], "part": label, "actor": r["actor"],
                                                 "step": r["step"], "t_start": a, "t_end": b})
                for e in events(r):
                    files.write("ledger", e)
            files.flush()
            for lg in loggers:
                lg.log(row)
                lg.flush()
            bar.advance(row)
            _stop_if_nonfinite(row, spec.runtime.max_nonfinite_steps)
            done = result.step
            if barrier and barrier(result.step + 1):
                bar.status(f"checkpoint after step {result.step}")
                ckpt.save(out, result.step, graph_id, ex.snapshot(), dict(files.counts), spec.checkpoint.keep)
        if interrupt.requested() and (done if done is not None else start - 1) < plan.steps - 1:
            if done is not None and (ckpt.newest(out) or (None,))[0] != done:     # nothing in flight now
                bar.status(f"checkpoint after step {done} ({interrupt.requested()})")
                ckpt.save(out, done, graph_id, ex.snapshot(), dict(files.counts), spec.checkpoint.keep)
            raise _preempted(out, plan, done)
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


def _stop_if_nonfinite(row: dict[str, Any], limit: int) -> None:
    """Stop the run when a node has skipped ``limit`` steps in a row for non-finite values (its
    ``nonfinite*_in_a_row`` metric, kept in the node's checkpointed state: a resume goes on counting)."""
    runs = {k: v for k, v in row.items() if k.startswith("nonfinite") and k.endswith("_in_a_row")}
    key = max(runs, key=runs.get, default=None)
    if key is None or runs[key] < limit:
        return
    raise GraphError(f"{runs[key]:g} steps in a row up to step {row['step']} had NaN or inf values in what they "
                     f"would train on or load ({key}), and were skipped: the run stops",
                     where="runtime.max_nonfinite_steps",
                     fix="find where they come from (each skip printed a line naming the node and the tensor; "
                         f"metrics.jsonl counts them), or raise runtime.max_nonfinite_steps (now {limit})")


def _quietly(fn) -> None:
    """Clean-up that must not replace the error that is already on its way out."""
    try:
        fn()
    except Exception as e:  # noqa: BLE001
        if sys.exc_info()[0] is None:
            print(f"warning: clean-up failed: {type(e).__name__}: {e}", file=sys.stderr)
