"""Reading a run's JSON-lines records (``metrics.jsonl``, ``timeline.jsonl``, ...), for the plots, the
what-if and the summary.

>>> steady([{"step": 0}, {"step": 1}, {"step": 2}, {"step": 3}], fill=1)
[{'step': 2}]
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


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
