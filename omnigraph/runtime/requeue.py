"""Requeue-friendly starts: the same ``omnigraph run GRAPH --run-dir DIR`` continues an unfinished run.

A cluster that requeues a preempted job runs its script again, unchanged. So ``omnigraph run`` looks
for the run to continue before it starts a new one (``--fresh`` skips this):

- ``DIR`` is itself a run directory (it has ``config.yaml``): the graph and settings must be the run's
  (a difference is refused, naming each differing field) and the run is continued;
- otherwise ``DIR`` (default ``runtime.run_dir``) is the parent of run directories: the newest
  unfinished run of the same graph name, settings equal, with a checkpoint or a recorded preemption,
  is continued; none, and a new run starts.

"Settings equal" ignores the fields a resume may change: ``runtime.executor``, ``runtime.address``
and ``runtime.run_dir``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from ..errors import GraphError
from .checkpoint import newest

FREE = {"runtime.executor", "runtime.address", "runtime.run_dir"}
"""Fields a continued run may differ in (``--executor``, ``--address``, ``--run-dir``)."""


def differences(was: Any, now: Any, path: str = "") -> list[str]:
    """Dotted paths where two config trees differ (``FREE`` fields left out)."""
    if path in FREE:
        return []
    if isinstance(was, dict) and isinstance(now, dict):
        out = []
        for k in list(was) + [k for k in now if k not in was]:
            out += differences(was.get(k), now.get(k), f"{path}.{k}" if path else str(k))
        return out
    return [] if was == now else [path or "(the whole config)"]


def _config(run_dir: Path) -> dict:
    try:
        return yaml.safe_load((run_dir / "config.yaml").read_text()) or {}
    except (OSError, yaml.YAMLError):
        return {}


def _resumable(run_dir: Path) -> bool:
    """Unfinished, with something to continue from: a checkpoint, or a preemption on record."""
    if (run_dir / "summary.json").exists():
        return False
    if newest(run_dir) is not None:
        return True
    try:
        lines = (run_dir / "restarts.jsonl").read_text().splitlines()
    except OSError:
        return False
    return any(json.loads(line).get("event") == "preempted" for line in lines if line.strip())


def _shown(value: Any) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 40 else text[:37] + "..."


def run_to_continue(target: Path, spec) -> Path | None:
    """The run directory ``omnigraph run`` continues instead of starting a new run, or None."""
    now = spec.model_dump(mode="json")
    if (target / "config.yaml").is_file():
        was = _config(target)
        diff = differences(was, now)
        if diff:
            def get(tree, path):
                for part in path.split("."):
                    tree = tree.get(part) if isinstance(tree, dict) else None
                return tree
            shown = "; ".join(f"{p}: run {_shown(get(was, p))}, now {_shown(get(now, p))}" for p in diff[:6])
            more = f" and {len(diff) - 6} more" if len(diff) > 6 else ""
            raise GraphError(f"{target} is a run of other settings ({shown}{more})", where="--run-dir",
                             fix="run with the run's own settings (omnigraph run --resume DIR), or point --run-dir "
                                 "at a new folder")
        if (target / "summary.json").exists():
            raise GraphError(f"{target} is a finished run: its {now['schedule']['iterations']} steps are done",
                             where="--run-dir", fix="point --run-dir at a new folder to start another run")
        return target
    if not target.is_dir():
        return None
    runs = [d for d in target.glob(f"{spec.name}-*") if (d / "config.yaml").is_file()]
    for d in sorted(runs, key=lambda d: d.stat().st_mtime, reverse=True):
        if _resumable(d) and not differences(_config(d), now):
            return d
    return None
