"""The sample ledger: where every prompt group went.

Every prompt group gets an id when it is generated (``step * prompts + i``).
The runtime appends one JSON line per event to ``ledger.jsonl``::

    {"event": "generated", "group": 17, "step": 2, "version": 1}
    {"event": "trained", "group": 17, "step": 3, "version": 2, "staleness": 1}
    {"event": "dropped", "group": 9, "step": 3, "reason": "stale"}
    {"event": "regenerated", "group": 21, "step": 6, "version": 5}

(``regenerated``: with ``schedule.on_stale: wait`` a group found staler than
``max_staleness`` is sampled again with the trainer's current weights before
it is trained; it is still trained once.)

``omnigraph ledger RUN_DIR`` reads it back and checks the law of the pipeline:
every generated group is trained (or dropped, with a reason) exactly once.

>>> s = summarize([{"event": "generated", "group": 0}, {"event": "trained", "group": 0}])
>>> (s.generated, s.trained_once, s.lost, s.ok)
(1, 1, 0, True)
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable

from ..errors import GraphError


def events(record: dict[str, Any]) -> list[dict[str, Any]]:
    """Ledger events of one node-run record (generate and update runs have some)."""
    out = []
    for g in record.get("generated_groups", []):
        out.append({"event": "generated", "group": g, "step": record["step"], "actor": record["actor"],
                    "version": record.get("weights_version")})
    for g in record.get("trained_groups", []):
        out.append({"event": "trained", "group": g, "step": record["step"], "actor": record["actor"],
                    "version": record.get("version", 1) - 1, "staleness": record.get("staleness_max")})
    for g in record.get("dropped_groups", []):
        out.append({"event": "dropped", "group": g, "step": record["step"], "reason": "stale"})
    for g in record.get("regenerated_groups", []):
        out.append({"event": "regenerated", "group": g, "step": record["step"], "actor": record["actor"],
                    "version": record.get("version", 1) - 1})
    return out


@dataclass
class Summary:
    generated: int = 0
    trained_once: int = 0
    trained_twice: list[int] = field(default_factory=list)
    dropped: dict[str, int] = field(default_factory=dict)
    lost: int = 0
    regenerated: int = 0
    unknown: list[int] = field(default_factory=list)
    staleness: dict[int, int] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.trained_twice and not self.lost and not self.unknown

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok}


def summarize(lines: Iterable[dict[str, Any]]) -> Summary:
    generated: set[int] = set()
    trained: Counter[int] = Counter()
    dropped: Counter[int] = Counter()
    reasons: Counter[str] = Counter()
    staleness: Counter[int] = Counter()
    regenerated: set[int] = set()
    for e in lines:
        kind = e.get("event")
        if kind == "generated":
            generated.add(e["group"])
        elif kind == "trained":
            trained[e["group"]] += 1
            if e.get("staleness") is not None:
                staleness[e["staleness"]] += 1
        elif kind == "dropped":
            dropped[e["group"]] += 1
            reasons[e.get("reason", "?")] += 1
        elif kind == "regenerated":
            regenerated.add(e["group"])
    handled = trained + dropped
    return Summary(generated=len(generated),
                   trained_once=sum(1 for g, n in trained.items() if n == 1 and not dropped[g]),
                   trained_twice=sorted(g for g, n in handled.items() if n > 1), dropped=dict(reasons),
                   lost=len(generated - set(handled)), regenerated=len(regenerated),
                   unknown=sorted((set(handled) | regenerated) - generated),
                   staleness=dict(sorted(staleness.items())))


def read(run_dir: str | Path) -> Summary:
    path = Path(run_dir) / "ledger.jsonl"
    if not path.is_file():
        raise GraphError(f"no ledger in '{run_dir}'", fix="pass a run directory made by omnigraph run")
    rows = []
    lines = path.read_text().splitlines()
    for n, line in enumerate(lines, 1):
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            if n < len(lines):      # a torn last line is a crash, not corruption
                raise GraphError(f"ledger line {n} is not JSON", where=str(path)) from None
    return summarize(rows)


def format_summary(s: Summary) -> str:
    drop = ", ".join(f"{n} {why}" for why, n in s.dropped.items()) or "none"
    stale = ", ".join(f"{k}: {v}" for k, v in s.staleness.items()) or "-"
    lines = [f"prompt groups generated: {s.generated}",
             f"trained exactly once:    {s.trained_once}",
             f"dropped:                 {drop}",
             f"trained twice:           {len(s.trained_twice)}" + (f" ({s.trained_twice[:10]})" if s.trained_twice else ""),
             f"lost (never trained):    {s.lost}",
             f"regenerated (stale):     {s.regenerated}",
             f"staleness of trained groups (staleness: groups): {stale}",
             "ledger: OK, every group handled exactly once" if s.ok else "ledger: NOT OK"]
    return "\n".join(lines)
