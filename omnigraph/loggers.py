"""Where a run's metrics go besides ``metrics.jsonl``: ``runtime.loggers``.

``tensorboard``: every numeric field of every step's metrics row (``reward_mean``,
``timing_s/update``, ``bubble/rollout``, ``staleness_max``, ...) as a scalar at
that step, in ``<run dir>/tensorboard`` (``tensorboard --logdir runs``). A
resumed run purges what the old run wrote after its checkpoint, so the curves
show each step once.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

PACKAGES = {"tensorboard": "tensorboard"}
"""Logger -> the package it needs (``pip install -e '.[tensorboard]'``)."""


def missing(name: str) -> str | None:
    """The package ``name`` needs when it is not installed, else None."""
    pkg = PACKAGES[name]
    return pkg if importlib.util.find_spec(pkg) is None else None


class TensorBoard:
    def __init__(self, run_dir: Path, start_step: int):
        from torch.utils.tensorboard import SummaryWriter
        self.dir = Path(run_dir) / "tensorboard"
        self.writer = SummaryWriter(str(self.dir), purge_step=start_step or None)

    def log(self, row: dict[str, Any]) -> None:
        step = row["step"]
        for key, value in row.items():
            if key != "step" and isinstance(value, (int, float)) and not isinstance(value, bool):
                self.writer.add_scalar(key, value, step)

    def flush(self) -> None:
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


def make(names: list[str], run_dir: Path, start_step: int) -> list[TensorBoard]:
    return [{"tensorboard": TensorBoard}[n](run_dir, start_step) for n in dict.fromkeys(names)]
