"""The run directory and its files.

``<runtime.run_dir>/<name>-<timestamp>/`` holds

- ``config.yaml``: the resolved spec (every default written out);
- ``plan.txt``: ``print(plan)``;
- ``metrics.jsonl``: one JSON object per step (:mod:`.metrics`);
- ``ledger.jsonl``: where every prompt group went (:mod:`.ledger`);
- ``timeline.jsonl``: the node runs of the first steps (the measured pipeline);
- ``restarts.jsonl``: each supervised restart with its cause, each resume and
  each damaged checkpoint skipped;
- ``errors.log``: every node failure (appended): when, the step, the node, the attempt, the one-line
  message and the full traceback (the file and line in the user's code that raised), which the message on
  the console points to;
- ``data.json``: with prompts from data, what was read (source, fingerprint, rows, rows left out, the rows'
  ids), checked again by ``--resume`` (the fingerprint) and read by ``omnigraph ledger``;
- ``checkpoints/``, ``final/``, ``summary.json`` and the plots;
- with ``runtime.loggers``: ``tensorboard/``, ``wandb/``, ``mlruns/`` and ``loggers.json`` (the W&B and
  MLflow run ids a resumed run continues, :mod:`.loggers`).

A run never writes outside its directory and never reuses an existing one.
"""

from __future__ import annotations

import json
import os
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from ..errors import GraphError, NodeFailure
from .ledger import row_ids, with_id


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


def write_header(out: Path, plan) -> None:
    """``config.yaml`` and ``plan.txt`` of a new run."""
    spec = plan.source if plan.source is not None else plan.graph.spec     # as given: compiles to this plan again
    (out / "config.yaml").write_text(yaml.safe_dump(spec.model_dump(mode="json"), sort_keys=False))
    (out / "plan.txt").write_text(str(plan) + "\n")
    if plan.graph.data:                 # prompts from data: what was read, for the ledger and for --resume
        (out / "data.json").write_text(json.dumps(plan.graph.data, indent=2, default=str) + "\n")


def check_data(out: Path, plan) -> None:
    """A resumed run reads the same data it started with: a changed file would silently change which rows
    the next steps see."""
    path = out / "data.json"
    if not plan.graph.data or not path.is_file():
        return
    was = json.loads(path.read_text()).get("fingerprint")
    now = plan.graph.data.get("fingerprint")
    if was != now:
        raise GraphError(f"the data changed since the run started (fingerprint {was}, now {now}): the resumed "
                         f"steps would not see the rows the run's data order promises", where="task.source",
                         fix="restore the data the run started with, or start a new run on the new data")


def config_of(run_dir: str | Path, where: str) -> Path:
    """The config.yaml a run wrote into its directory."""
    path = Path(run_dir) / "config.yaml"
    if not path.is_file():
        raise GraphError(f"'{run_dir}' is not a run directory (no config.yaml)", where=where,
                         fix="pass the directory printed by omnigraph run")
    return path


def log_failure(out: Path, failure: NodeFailure, attempt: int) -> Path | None:
    """Append one node failure to ``errors.log``: a header line (time, step, node, attempt: 1 is the run's
    first life, 2 its first restart), the message, then the traceback (on every executor: a Ray actor's
    comes back with its failure). Returns the file's path; None where it cannot be written (a full disk),
    which must not hide the failure itself."""
    path = out / "errors.log"
    step = f"step {failure.iteration}" if failure.iteration >= 0 else "starting"
    body = failure.traceback or "(no traceback: nothing raised in a node, e.g. an actor's process is gone or a " \
                                "step ran past its time)\n"
    try:
        with open(path, "a") as f:
            f.write(f"=== {datetime.now().isoformat(sep=' ', timespec='seconds')}  {step}  node {failure.node}  "
                    f"attempt {attempt} ===\n{failure}\n{body}\n")
    except OSError:
        return None
    return path


def append(out: Path, name: str, obj: dict[str, Any]) -> None:
    """One JSON line appended to ``<run dir>/<name>.jsonl`` (rare events: restarts, resumes)."""
    with open(out / f"{name}.jsonl", "a") as f:
        f.write(json.dumps(obj) + "\n")


class RunFiles:
    """The run's append-only JSON-lines files, with their line counts (checkpoints record them). A ``generated``
    ledger event of a data row gets the row's ``id`` from ``data.json`` (the rows' own ids, ``task.id_field``)."""

    NAMES = ("metrics", "ledger", "timeline")

    def __init__(self, out: Path, counts: dict[str, int] | None):
        self.out = out
        data = out / "data.json"
        self.ids = row_ids(json.loads(data.read_text())) if data.is_file() else {}
        if counts is not None:                 # resuming: cut what came after the checkpoint
            for name in self.NAMES:
                _truncate_lines(out / f"{name}.jsonl", counts.get(f"{name}_lines", 0))
        self.counts = {n: _count_lines(out / f"{n}.jsonl") for n in self.NAMES}
        self.f = {n: open(out / f"{n}.jsonl", "a") for n in self.NAMES}

    def write(self, name: str, obj: dict) -> None:
        if name == "ledger" and self.ids:
            obj = with_id(obj, self.ids)
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
