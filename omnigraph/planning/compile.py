"""``compile``: spec -> validated graph -> staleness proof -> plan.

>>> import omnigraph as og
>>> plan = og.compile("graphs/grpo_one_step_off.yaml")
>>> plan.bound, plan.weights
(1, {'sync': 'shm'})
"""

from __future__ import annotations

from pathlib import Path

from ..graph.builder import Graph as Builder
from ..errors import GraphError
from ..graph.spec import GraphSpec
from ..proof.staleness import analyse
from ..proof.validate import resolve
from ..graph.yamlio import apply_override, load_file, validate_raw
from .lend import plan_lend
from .lower import lower
from .plan import Plan
from .order import queued_transfers
from .predict import idle_warnings


def compile(source, *, cluster: dict[str, float] | None = None,
            timings: dict[str, float] | None = None, overrides: list[str] | tuple[str, ...] = ()) -> Plan:
    """Compile a graph (``GraphSpec``, builder ``Graph``, or YAML path) into a :class:`Plan`.

    Raises :class:`GraphError` naming the node, edge or field and the fix.
    """
    given = to_spec(source, overrides)
    spec, lent, timings = plan_lend(given, timings)
    graph = resolve(spec, cluster=cluster)
    report = analyse(graph)
    s = spec.schedule
    if report.bound > s.max_staleness:
        msg = (f"the graph can train samples {report.bound} versions stale ({report.explanation}), "
               f"more than schedule.max_staleness {s.max_staleness}")
        if s.on_stale == "error":
            raise GraphError(msg, where="schedule.max_staleness",
                             fix=f"raise schedule.max_staleness to {report.bound}, lower the delays or sync_every, "
                                 "or set schedule.on_stale: drop|wait to discard/regenerate stale samples")
        what = ("drop the samples that exceed it" if s.on_stale == "drop" else
                "regenerate the prompt groups that exceed it with the trainer's current weights, on the trainer")
        graph.warnings.append(f"{msg}: on_stale {s.on_stale} will {what}")
    plan = lower(graph, report, timings)
    plan.lend, plan.source = lent, given
    plan.warnings.extend(idle_warnings(plan))
    plan.warnings.extend(queued_transfers(plan))
    return plan


def to_spec(source, overrides=()) -> GraphSpec:
    if isinstance(source, (str, Path)):
        return load_file(source, overrides)
    if isinstance(source, Builder):
        source = source.to_spec()
    if not isinstance(source, GraphSpec):
        raise GraphError(f"cannot compile a {type(source).__name__}",
                         fix="pass a GraphSpec, an og.Graph or the path of a YAML file")
    if overrides:
        raw = source.model_dump(mode="json", exclude_unset=False)
        raw["edges"] = [e.model_dump() for e in source.edges]
        for item in overrides:
            raw = apply_override(raw, item)
        source = validate_raw(raw)
    return source
