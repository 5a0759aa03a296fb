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

from .. import plugins


class TensorBoard:
    """Registered under ``omnigraph.loggers`` as ``tensorboard``. A logger class is built as
    ``Cls(run_dir, start_step)`` and gets ``log(row)``, ``flush()``, ``close()``; its ``missing()`` names a
    package it needs that is not installed (validation reports it before the run)."""

    @staticmethod
    def missing() -> str | None:
        return "tensorboard" if importlib.util.find_spec("tensorboard") is None else None

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


def make(names: list[str], run_dir: Path, start_step: int) -> list:
    return [plugins.load("loggers", n, where="runtime.loggers")(run_dir, start_step) for n in dict.fromkeys(names)]
