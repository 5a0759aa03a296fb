"""What a graph names outside itself, checked before anything starts: each node's backend and its options,
environments and agents, custom classes, the model, the task and its data. Part of validation
(:mod:`omnigraph.proof.validate`)."""

from __future__ import annotations

from pathlib import Path

from .. import plugins
from ..errors import GraphError
from ..graph.ir import Node
from ..graph.spec import GraphSpec
from .problems import Problems


def check_references(spec: GraphSpec, nodes: dict[str, Node], errors: Problems) -> None:
    """What the graph names by string: backends, the task, reward functions, custom classes, loggers, the model."""
    uses_model = []
    for n in nodes.values():
        if n.kind == "custom":
            _resolvable(lambda: plugins.load_dotted(n.spec.cls), f"nodes.{n.name}.cls", errors)
            continue
        try:
            b = plugins.backend(n.kind, n.backend, where=f"nodes.{n.name}.backend")
        except GraphError as e:
            errors.extend(e)
            continue
        opts, problems = plugins.typed_options(b, n.spec.options, f"nodes.{n.name}.options",
                                               kind=f"{n.kind} backend {n.backend}")
        for problem in problems:
            errors.extend(problem)
        object.__setattr__(n, "backend_options", opts)       # the IR node is frozen; set once, here
        env = getattr(n.spec, "env", None)
        if env is not None:
            try:
                cls = plugins.named_or_dotted("environments", env.name, where=f"nodes.{n.name}.env.name")
            except GraphError:
                pass                                            # the backend's check names it
            else:
                for problem in plugins.typed_options(cls, env.options, f"nodes.{n.name}.env.options",
                                                     kind=f"environment {env.name}", call=cls,
                                                     passed=frozenset({"prompt"}))[1]:
                    errors.extend(problem)
        if getattr(n.spec, "agent", None) is not None and "agents" not in b.capabilities:
            errors.add(f"backend {n.backend} cannot serve agents (no 'agents' capability)",
                       where=f"nodes.{n.name}.agent", fix="use a token generator that can (hf, vllm), or remove agent")
        if b.uses_model:
            uses_model.append(n)
        if getattr(n.spec, "partial", None) is not None:
            _partial(spec, n, b, errors)
        if n.pool in spec.pools and spec.pools[n.pool].sharding != "none" and not b.sharded:
            errors.add(f"node {n.name} (backend {n.backend}) cannot run on a sharded pool",
                       where=f"pools.{n.pool}.sharding", fix=f"set pools.{n.pool}.sharding: none, or move "
                       f"{n.name} to another pool (a sharded pool holds the torch trainer and its nodes)")
        for problem in (b.check(n.name, n.spec, spec) if b.check else []):   # the backend's own rules
            errors.add(problem.message, where=problem.where, fix=problem.fix)
    try:
        ref, factory, _ = plugins.task_factory(spec)
        if spec.task.source is None:          # a source is read by _data, after everything else is known sound
            plugins.task_arguments(spec, factory, ref)
    except GraphError as e:
        errors.extend(e)
    for name in spec.runtime.logger_options:
        if name not in spec.runtime.loggers:
            errors.add(f"options for logger '{name}', which runtime.loggers does not list",
                       where=f"runtime.logger_options.{name}", fix=f"add {name} to runtime.loggers, or remove them")
    for name in spec.runtime.loggers:
        try:
            cls = plugins.load("loggers", name, where="runtime.loggers")
            need = getattr(cls, "missing", lambda: None)()
        except GraphError as e:
            errors.extend(e)
            continue
        for problem in plugins.typed_options(cls, spec.runtime.logger_options.get(name), f"runtime.logger_options.{name}",
                                             kind=f"logger {name}", call=cls,
                                             passed=frozenset({"run_dir", "start_step"}))[1]:
            errors.extend(problem)
        if need:
            errors.add(f"logger '{name}' needs the {need} package, which is not installed", where="runtime.loggers",
                       fix=f"pip install {need} (or pip install -e '.[{name}]'), or remove {name} from runtime.loggers")
    path = spec.model.path
    if uses_model and not plugins.has("models", path) and not Path(path).expanduser().is_dir():
        errors.add(f"model directory '{path}' does not exist (node '{uses_model[0].name}' uses backend "
                   f"{uses_model[0].backend})", where="model.path",
                   fix=f"use one of {', '.join(plugins.names('models'))} or a local Hugging Face model directory")


def check_data(spec: GraphSpec, errors: Problems) -> dict | None:
    """Prompts from data are read now: a missing file, field or split, or too few rows for the run's
    iterations, is an error before anything starts."""
    if spec.task.source is None:
        return None
    try:
        task = plugins.make_task(spec)
    except GraphError as e:
        errors.extend(e)
        return None
    available = task.steps_available()
    if available is not None and available < spec.schedule.iterations:
        errors.add(f"{spec.schedule.iterations} iterations need {spec.schedule.iterations * spec.task.prompts} "
                   f"prompts but {spec.task.epochs} epoch(s) of {task.describe()['rows']} rows give "
                   f"{available} steps", where="task.epochs",
                   fix=f"raise task.epochs, or set schedule.iterations <= {available}")
    return task.describe()


def _partial(spec: GraphSpec, n: Node, backend, errors: Problems) -> None:
    """Partial rollouts need a generator that carries samples, and a schedule that never regenerates."""
    where = f"nodes.{n.name}.partial"
    if not backend.partial:
        errors.add(f"backend {n.backend} cannot carry unfinished samples to the next firing", where=where,
                   fix="use backend hf or vllm, or remove partial")
    if spec.schedule.on_stale == "wait":
        errors.add("on_stale: wait regenerates whole batches from their prompts, which would drop the tokens that "
                   "partial rollouts carry", where="schedule.on_stale",
                   fix=f"raise schedule.max_staleness to the bound `omnigraph check` prints (it includes "
                       f"max_spans - 1 = {n.spans - 1}), or set on_stale: drop")


def _resolvable(load, where: str, errors: Problems) -> None:
    try:
        load()
    except GraphError as e:
        errors.add(e.message, where=where, fix=e.fix)
