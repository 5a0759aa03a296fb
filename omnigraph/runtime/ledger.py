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

A run that has not finished (no ``summary.json``: preempted, stopped, failed, or still going) has groups
generated and not yet trained. Those its newest checkpoint holds (the manifest's ``in_flight_groups``, named
by the actors' snapshots: the one-step-off edge's buffer, unfinished partial rollouts) are *in flight at the
checkpoint*, kept: a resume trains them. Those generated after that checkpoint are *in flight since* it:
the run goes on with them, or a resume generates them again. Neither is lost; any other is. A finished run
has nothing in flight: a group never trained there is lost.

>>> s = summarize([{"event": "generated", "group": 0}, {"event": "trained", "group": 0}])
>>> (s.generated, s.trained_once, s.lost, s.ok)
(1, 1, 0, True)
>>> made = [{"event": "generated", "group": 0}, {"event": "generated", "group": 1}]
>>> s = summarize(made, finished=False, checkpoint={"name": "step-00000000", "ledger_lines": 2,
...                                                  "in_flight_groups": [1]})
>>> (s.in_flight, s.lost, s.ok)
(1, 1, False)
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable

from ..errors import GraphError
from .checkpoint import newest_manifest

REASONS = {"stale": "too stale"}
"""A drop's reason as the report words it."""


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
    finished: bool = True
    """The run ended (``summary.json``): nothing can be in flight."""
    in_flight: int = 0
    """Unfinished run: groups generated, not yet trained, held by the newest checkpoint (a resume trains them)."""
    in_flight_since: int = 0
    """Unfinished run: groups generated after the newest checkpoint (or with none), not yet trained."""
    checkpoint: str | None = None
    """Unfinished run: the newest checkpoint's folder name."""
    rows: dict[str, Any] | None = None
    """Prompts from data: ``total`` rows the run draws from, and the sorted row indices ``trained`` (at least
    one group of the row trained), ``in_flight`` (none trained, one in flight), ``lost`` (none trained or in
    flight, one lost), ``dropped`` (every group dropped, too stale), ``never_reached``, ``left_out`` (by the
    data's filters: never drawn); ``epochs``; where the rows have ids, ``id_field`` and the same lists by id
    (``trained_ids``, ...)."""

    @property
    def ok(self) -> bool:
        return not self.trained_twice and not self.lost and not self.unknown

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok}


def summarize(lines: Iterable[dict[str, Any]], data: dict[str, Any] | None = None, *, finished: bool = True,
              checkpoint: dict[str, Any] | None = None) -> Summary:
    """The law of the pipeline over ledger events; ``data`` (a run's ``data.json``) adds the rows' fate. An
    unfinished run (``finished`` false) counts the groups in flight, by its newest ``checkpoint`` manifest."""
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
    waiting = generated - set(handled)
    kept, since = in_flight_groups(lines, waiting, checkpoint) if not finished else (set(), set())
    fate = {**{g: "lost" for g in waiting - kept - since}, **{g: "in_flight" for g in kept | since},
            **{g: "dropped" for g in dropped}, **{g: "trained" for g in trained}}
    rows = _rows(lines, fate, data) if data is not None else None
    return Summary(rows=rows, generated=len(generated),
                   trained_once=sum(1 for g, n in trained.items() if n == 1 and not dropped[g]),
                   trained_twice=sorted(g for g, n in handled.items() if n > 1), dropped=dict(reasons),
                   lost=len(waiting - kept - since), regenerated=len(regenerated),
                   carried=len(carried), unknown=sorted((set(handled) | regenerated | carried) - generated),
                   staleness=dict(sorted(staleness.items())), finished=finished, in_flight=len(kept),
                   in_flight_since=len(since), checkpoint=(checkpoint or {}).get("name"))


def in_flight_groups(lines: list[dict[str, Any]], waiting: set[int],
                     checkpoint: dict[str, Any] | None) -> tuple[set[int], set[int]]:
    """Of an unfinished run's groups ``waiting`` (generated, not yet trained or dropped): those the newest
    ``checkpoint`` holds, and those generated after it (its ``ledger_lines`` ledger lines; all without one)."""
    if checkpoint is None:
        return set(), set(waiting)
    before = {e["group"] for e in lines[:checkpoint.get("ledger_lines", 0)] if e.get("event") == "generated"}
    kept = waiting & set(checkpoint.get("in_flight_groups") or ())
    return kept, waiting - before - kept


def _rows(lines: list[dict[str, Any]], fate: dict[int, str], data: dict[str, Any]) -> dict[str, Any]:
    """Each row's fate from its groups' (``fate``: group -> trained, in_flight, lost or dropped): a row is
    trained when one of its groups is, else in flight, else lost, else dropped."""
    groups_of: dict[int, set[str]] = {}
    for e in lines:
        if e.get("event") == "generated" and "row" in e and e["group"] in fate:
            groups_of.setdefault(e["row"], set()).add(fate[e["group"]])
    kinds = ("trained", "in_flight", "lost", "dropped")
    out: dict[str, Any] = {k: sorted(r for r, f in groups_of.items() if next(x for x in kinds if x in f) == k)
                           for k in kinds}
    out["epochs"] = len({e["epoch"] for e in lines if e.get("event") == "generated" and "epoch" in e})
    split = data.get("split")
    if split:                                          # a finite table: the rows the run could have reached
        start, stop = split["range"]
        left_out = set(split.get("left_out", []))
        usable = set(range(start, stop)) - left_out
        out.update(total=len(usable), never_reached=sorted(usable - set(groups_of)), left_out=sorted(left_out))
    ids = {**row_ids(data), **{e["row"]: str(e["id"]) for e in lines
                               if e.get("event") == "generated" and "row" in e and "id" in e}}
    if ids:                                            # the rows' own ids: the report names rows by them
        out["id_field"] = data.get("id_field") or "id"
        for kind in (*kinds, "never_reached"):
            if kind in out:
                out[f"{kind}_ids"] = [ids.get(r, f"row {r}") for r in out[kind]]
    return out


def read(run_dir: str | Path, finished: bool | None = None) -> Summary:
    """The ledger of a run directory; ``finished`` (default: it has ``summary.json``) decides whether
    groups not yet trained may be in flight (see the module's docstring)."""
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
    if finished is None:
        finished = (Path(run_dir) / "summary.json").is_file()
    return summarize(rows, json.loads(data.read_text()) if data.is_file() else None, finished=finished,
                     checkpoint=None if finished else newest_manifest(Path(run_dir)))


def format_summary(s: Summary) -> str:
    drop = ", ".join(f"{n} {REASONS.get(why, why)}" for why, n in s.dropped.items()) or "none"
    stale = ", ".join(f"{k}: {v}" for k, v in s.staleness.items()) or "-"
    lines = [*([] if s.finished else ["run not finished (no summary.json): groups not yet trained may be in flight"]),
             f"prompt groups generated: {s.generated}",
             f"trained exactly once:    {s.trained_once}",
             f"dropped:                 {drop}",
             *_format_in_flight(s),
             f"trained twice:           {len(s.trained_twice)}" + (f" ({s.trained_twice[:10]})" if s.trained_twice else ""),
             f"lost (never trained):    {s.lost}",
             f"regenerated (stale):     {s.regenerated}",
             *([f"carried across firings: {s.carried} (partial rollouts)"] if s.carried else []),
             f"staleness of trained groups (staleness: groups): {stale}",
             *_format_rows(s.rows, s.finished),
             _verdict(s)]
    return "\n".join(lines)


def _format_in_flight(s: Summary) -> list[str]:
    if s.finished:
        return []
    if s.checkpoint is None:
        return [f"in flight, no checkpoint: {s.in_flight_since} (the run goes on with them, or a resume starts over)"]
    out = [f"in flight at checkpoint: {s.in_flight} (kept in {s.checkpoint}: a resume trains them)"]
    if s.in_flight_since:
        out.append(f"in flight since then:    {s.in_flight_since} (the run goes on with them, or a resume "
                   "generates them again)")
    return out


def _verdict(s: Summary) -> str:
    if not s.ok:
        return "ledger: NOT OK"
    if s.finished:
        return "ledger: OK, every group handled exactly once"
    return "ledger: OK so far, every group handled exactly once or in flight (the run has not finished)"


def _format_rows(rows: dict[str, Any] | None, finished: bool = True) -> list[str]:
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
           f"rows dropped, too stale: {len(rows['dropped'])}{some('dropped')}"]
    if not finished or rows["in_flight"]:
        out.append(f"rows in flight:          {len(rows['in_flight'])}{some('in_flight')}")
    if rows["lost"]:
        out.append(f"rows lost:               {len(rows['lost'])}{some('lost')}")
    if "never_reached" in rows:
        out.append(f"rows never reached:      {len(rows['never_reached'])}{some('never_reached')}")
    if rows.get("left_out"):
        out.append(f"rows left out by filters: {len(rows['left_out'])}{some('left_out')}")   # never drawn
    return out
