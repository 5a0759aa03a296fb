"""The sample ledger: where every prompt group went.

Every prompt group gets an id when it is generated (``step * prompts + i``).
The runtime appends one JSON line per event to ``ledger.jsonl``::

    {"event": "generated", "group": 17, "step": 2, "version": 1}
    {"event": "trained", "group": 17, "step": 3, "version": 2, "staleness": 1}
    {"event": "dropped", "group": 9, "step": 3, "reason": "stale"}
    {"event": "regenerated", "group": 21, "step": 6, "version": 5}
    {"event": "carried", "group": 40, "step": 5}

(``regenerated``: with ``schedule.on_stale: wait`` a group found staler than
``max_staleness`` is sampled again with the trainer's current weights before
it is trained; it is still trained once. ``carried``: with partial rollouts a group still unfinished after a firing stays in
the rollout and comes back in a later batch; one event per firing it stays.) With prompts from data
(``task.source``) a ``generated`` event also names the group's dataset
``row`` and ``epoch`` and, where the rows have ids (``task.id_field``), the
row's ``id``; the run directory's ``data.json`` says which rows the run draws
from (and their ids), so the ledger can say which rows were trained, dropped
or never reached, by id where it has them.

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
    rows = {int(g): v for g, v in record.get("generated_rows", {}).items()}
    for g in record.get("generated_groups", []):
        e = {"event": "generated", "group": g, "step": record["step"], "actor": record["actor"],
             "version": record.get("weights_version")}
        if g in rows:
            e["row"], e["epoch"] = rows[g]
        out.append(e)
    for g in record.get("trained_groups", []):
        out.append({"event": "trained", "group": g, "step": record["step"], "actor": record["actor"],
                    "version": record.get("version", 1) - 1, "staleness": record.get("staleness_max")})
    for g in record.get("dropped_groups", []):
        out.append({"event": "dropped", "group": g, "step": record["step"], "reason": "stale"})
    for g in record.get("carried_groups", []):
        out.append({"event": "carried", "group": g, "step": record["step"], "actor": record["actor"]})
    for g in record.get("regenerated_groups", []):
        out.append({"event": "regenerated", "group": g, "step": record["step"], "actor": record["actor"],
                    "version": record.get("version", 1) - 1})
    return out


def row_ids(data: dict[str, Any] | None) -> dict[int, str]:
    """Row index -> the row's own id, from a run's ``data.json`` (its ``split``: ``range`` and ``ids``, one per row
    of the range, None for a row left out); empty where the rows have no ids (or the run predates them)."""
    split = (data or {}).get("split") or {}
    ids, rng = split.get("ids"), split.get("range")
    if not ids or not rng:
        return {}
    return {rng[0] + k: str(v) for k, v in enumerate(ids) if v is not None}


def with_id(event: dict[str, Any], ids: dict[int, str]) -> dict[str, Any]:
    """A ``generated`` event of a data row with the row's ``id`` added (where ``ids``, :func:`row_ids`, has it)."""
    if event.get("event") == "generated" and event.get("row") in ids and "id" not in event:
        return {**event, "id": ids[event["row"]]}
    return event


@dataclass
class Summary:
    generated: int = 0
    trained_once: int = 0
    trained_twice: list[int] = field(default_factory=list)
    dropped: dict[str, int] = field(default_factory=dict)
    lost: int = 0
    regenerated: int = 0
    carried: int = 0
    """Prompt groups that stayed in the rollout across at least one firing (partial rollouts)."""
    unknown: list[int] = field(default_factory=list)
    staleness: dict[int, int] = field(default_factory=dict)
    rows: dict[str, Any] | None = None
    """Prompts from data: ``total`` rows the run draws from, and the sorted row indices ``trained`` (at least
    one group of the row trained), ``dropped`` (generated, never trained), ``never_reached``; ``epochs``; where
    the rows have ids, ``id_field`` and the same lists by id: ``trained_ids``, ``dropped_ids``,
    ``never_reached_ids``."""

    @property
    def ok(self) -> bool:
        return not self.trained_twice and not self.lost and not self.unknown

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok}


def summarize(lines: Iterable[dict[str, Any]], data: dict[str, Any] | None = None) -> Summary:
    """The law of the pipeline over ledger events; ``data`` (a run's ``data.json``) adds the rows' fate."""
    lines = list(lines)
    generated: set[int] = set()
    trained: Counter[int] = Counter()
    dropped: Counter[int] = Counter()
    reasons: Counter[str] = Counter()
    staleness: Counter[int] = Counter()
    regenerated: set[int] = set()
    carried: set[int] = set()
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
        elif kind == "carried":
            carried.add(e["group"])
    handled = trained + dropped
    rows = _rows(lines, trained, data) if data is not None else None
    return Summary(rows=rows, generated=len(generated),
                   trained_once=sum(1 for g, n in trained.items() if n == 1 and not dropped[g]),
                   trained_twice=sorted(g for g, n in handled.items() if n > 1), dropped=dict(reasons),
                   lost=len(generated - set(handled)), regenerated=len(regenerated),
                   carried=len(carried), unknown=sorted((set(handled) | regenerated | carried) - generated),
                   staleness=dict(sorted(staleness.items())))


def _rows(lines: list[dict[str, Any]], trained: Counter, data: dict[str, Any]) -> dict[str, Any]:
    row_of = {e["group"]: e["row"] for e in lines if e.get("event") == "generated" and "row" in e}
    done = {row_of[g] for g in trained if g in row_of}
    reached = set(row_of.values())
    epochs = sorted({e["epoch"] for e in lines if e.get("event") == "generated" and "epoch" in e})
    out: dict[str, Any] = {"trained": sorted(done), "dropped": sorted(reached - done), "epochs": len(epochs)}
    split = data.get("split")
    if split:                                          # a finite table: the rows the run could have reached
        start, stop = split["range"]
        usable = set(range(start, stop)) - set(split.get("left_out", []))
        out.update(total=len(usable), never_reached=sorted(usable - reached))
    ids = {**row_ids(data), **{e["row"]: str(e["id"]) for e in lines
                               if e.get("event") == "generated" and "row" in e and "id" in e}}
    if ids:                                            # the rows' own ids: the report names rows by them
        out["id_field"] = data.get("id_field") or "id"
        for kind in ("trained", "dropped", "never_reached"):
            if kind in out:
                out[f"{kind}_ids"] = [ids.get(r, f"row {r}") for r in out[kind]]
    return out


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
    data = Path(run_dir) / "data.json"
    return summarize(rows, json.loads(data.read_text()) if data.is_file() else None)


def format_summary(s: Summary) -> str:
    drop = ", ".join(f"{n} {why}" for why, n in s.dropped.items()) or "none"
    stale = ", ".join(f"{k}: {v}" for k, v in s.staleness.items()) or "-"
    lines = [f"prompt groups generated: {s.generated}",
             f"trained exactly once:    {s.trained_once}",
             f"dropped:                 {drop}",
             f"trained twice:           {len(s.trained_twice)}" + (f" ({s.trained_twice[:10]})" if s.trained_twice else ""),
             f"lost (never trained):    {s.lost}",
             f"regenerated (stale):     {s.regenerated}",
             *([f"carried across firings: {s.carried} (partial rollouts)"] if s.carried else []),
             f"staleness of trained groups (staleness: groups): {stale}",
             *_format_rows(s.rows),
             "ledger: OK, every group handled exactly once" if s.ok else "ledger: NOT OK"]
    return "\n".join(lines)


def _format_rows(rows: dict[str, Any] | None) -> list[str]:
    if rows is None:
        return []

    def some(kind: str) -> str:
        """The first rows of a list: by id (``id_field``) where the rows have ids, else by index."""
        ids = rows.get(f"{kind}_ids")
        shown = [str(i) for i in (rows[kind] if ids is None else ids)[:8]]
        name = "rows" if ids is None else f"{rows.get('id_field', 'id')}s"
        return f" ({name} {', '.join(shown)}{', ...' if len(rows[kind]) > 8 else ''})" if rows[kind] else ""
    total = f" of {rows['total']}" if "total" in rows else ""
    out = [f"dataset rows trained:    {len(rows['trained'])}{total} over {rows['epochs']} epoch(s)"
           + (f", known by their {rows['id_field']}" if "id_field" in rows else ""),
           f"rows dropped:            {len(rows['dropped'])}{some('dropped')}"]
    if "never_reached" in rows:
        out.append(f"rows never reached:      {len(rows['never_reached'])}{some('never_reached')}")
    return out
