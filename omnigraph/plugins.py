"""The plugin registry: built-ins and a user's package go through one door, Python entry points.

==========================  =========================================  ===============================
group                       name                                       value
==========================  =========================================  ===============================
``omnigraph.backends``      ``<kind>.<backend>`` (``generate.hf``)     a :class:`omnigraph.sdk.Backend`
``omnigraph.tasks``         task name (``digits``)                     ``factory(prompts=, seed=, ...)``
``omnigraph.rewards``       reward name (``digits_match``)             ``fn(prompt, completion, **meta)``
``omnigraph.models``        model alias (``tiny``)                     ``materialise(seed, log) -> Path``
``omnigraph.environments``  environment name                           an environment class
``omnigraph.loggers``       logger name (``tensorboard``)              a logger class
``omnigraph.transports``    weights path (``shm``, ``nccl``, ...)      a weights transport class
==========================  =========================================  ===============================

omnigraph's own are declared in its ``pyproject.toml`` exactly like a user's
package declares its own. Asking for an unknown name is a :class:`GraphError`
that lists the known ones and suggests the closest:

>>> load("tasks", "digts", where="task.name")
Traceback (most recent call last):
...
omnigraph.errors.GraphError: task.name: unknown task 'digts' (did you mean 'digits'? known: arithmetic, ..., digits...
"""

from __future__ import annotations

import difflib
import inspect
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
from typing import Any, Callable

from pydantic import BaseModel, ValidationError

from .errors import GraphError, GraphErrors
from .sdk import ConfigError, options_model, registry

GROUPS = {"backends": "backend", "tasks": "task", "rewards": "reward function", "models": "model",
          "environments": "environment", "loggers": "logger", "transports": "weights transport"}


def _table(group: str) -> dict[str, EntryPoint]:
    if group not in GROUPS:
        raise ValueError(f"unknown plugin group {group!r}")
    out = registry.table(group)
    if group not in _checked:
        for ep in entry_points(group=f"omnigraph.{group}"):
            if ep.value != out[ep.name].value:
                raise GraphError(f"two packages register the {GROUPS[group]} '{ep.name}' ({out[ep.name].value} and "
                                 f"{ep.value})", fix="uninstall one of them, or rename one entry point")
        _checked.add(group)
    return out


_checked: set[str] = set()


def names(group: str) -> list[str]:
    return sorted(_table(group))


def has(group: str, name: str) -> bool:
    return name in _table(group)


def refresh() -> None:
    """Forget what was read (after installing a package in this process)."""
    registry.table.cache_clear()
    _checked.clear()


def unknown(group: str, name: str, where: str | None, known: list[str] | None = None) -> GraphError:
    known = names(group) if known is None else known
    close = difflib.get_close_matches(name, known, n=1)
    hint = f"did you mean '{close[0]}'? " if close else ""
    listing = ", ".join(known) or "none installed"
    return GraphError(f"unknown {GROUPS[group]} '{name}' ({hint}known: {listing})", where=where,
                      fix=f"use one of the known names, or install the package that registers it under the "
                          f"'omnigraph.{group}' entry-point group (pip install -e . registers omnigraph's own)")


def load(group: str, name: str, where: str | None = None) -> Any:
    """The object registered as ``name`` in ``group``; a GraphError naming ``where`` if there is none."""
    ep = _table(group).get(name)
    if ep is None:
        raise unknown(group, name, where)
    try:
        return ep.load()
    except Exception as e:  # noqa: BLE001 - a broken plugin is the user's to fix, said in one line
        raise GraphError(f"the {GROUPS[group]} '{name}' ({ep.value}) cannot be loaded: {type(e).__name__}: {e}",
                         where=where, fix="check that the package providing it is installed and importable") from None


def backend(kind: str, name: str, where: str | None = None):
    """The :class:`~omnigraph.sdk.Backend` descriptor of backend ``name`` for node kind ``kind``."""
    key = f"{kind}.{name}"
    if not has("backends", key):
        known = sorted(n.split(".", 1)[1] for n in names("backends") if n.split(".", 1)[0] == kind)
        err = unknown("backends", name, where, known)
        raise GraphError(err.message.replace("unknown backend", f"unknown {kind} backend"), where=where, fix=err.fix)
    return load("backends", key, where)


def load_dotted(dotted: str, where: str | None = None) -> Any:
    """``package.module:attr`` -> the attribute (:func:`omnigraph.sdk.registry.load_dotted`); a GraphError naming
    ``where`` and the fix if it cannot be found."""
    try:
        return registry.load_dotted(dotted)
    except LookupError as e:
        fix = ("write it as package.module:name" if "not a dotted path" in str(e) else
               "check the name after ':'" if "has no attribute" in str(e) else
               "check the module name and that it is importable from the current directory")
        raise GraphError(str(e), where=where, fix=fix) from None


def named_or_dotted(group: str, ref: str, where: str | None = None) -> Any:
    """A registered name (``digits_match``) or a dotted path (``my_pkg.rewards:exact``)."""
    return load_dotted(ref, where) if ":" in ref else load(group, ref, where)


def model_dir(path: str, seed: int = 0, log: Callable[[str], None] = print) -> Path:
    """The local directory of ``model.path``: a registered alias is materialised once (then cached), any other
    value must be a Hugging Face model folder."""
    if has("models", path):
        try:
            return Path(load("models", path, "model.path")(seed, log))
        except ConfigError as e:
            raise GraphError(e.message, where=e.where or "model.path", fix=e.fix) from None
    p = Path(path).expanduser()
    if not (p / "config.json").exists():
        raise GraphError(f"'{path}' is not a Hugging Face model directory (no config.json)", where="model.path",
                         fix=f"use one of {', '.join(names('models')) or 'the registered models'} or a folder made "
                             "by save_pretrained")
    return p



def task_factory(spec) -> tuple[str, Any, str]:
    """``(name, factory, field)`` of the graph's task: ``task.name``; with ``task.source``, the task of that name
    where one is registered (``reasoning_gym``), else the task ``task.reader`` names (files and folders)."""
    t = spec.task
    if t.source is None:
        ref, where = t.name, "task.name"
    elif has("tasks", t.source):
        ref, where = t.source, "task.source"
    else:
        ref, where = t.reader, "task.reader"
    return ref, named_or_dotted("tasks", ref, where=where), where


def task_arguments(spec, factory, ref: str, log: Callable[[str], None] = lambda _: None) -> dict[str, Any]:
    """The keyword arguments of the task's factory beyond the stream's (``prompts``, ``seed``,
    ``eval_prompts``): its options, validated and typed; with a source, the data fields set in the graph, the
    source, the model (for prompt lengths in its tokens) and ``max_new_tokens`` (the largest of the generators
    that run the model, None if none does: the room a prompt must leave in the model's context), each where the
    factory takes it."""
    t = spec.task
    opts, errors = typed_options(factory, t.options, "task.options", kind=f"task {ref}", call=factory)
    if errors:
        raise errors[0] if len(errors) == 1 else GraphErrors(errors)
    kwargs = {k: getattr(opts, k) for k in type(opts).model_fields} if isinstance(opts, BaseModel) else dict(opts)
    if t.source is None:
        return kwargs
    takes = _keywords(factory)
    for f in t.changed(t.DATA_FIELDS):
        if f not in takes and takes != ["**"]:
            raise GraphError(f"task.{f} does not apply to task '{ref}'", where=f"task.{f}",
                             fix=f"remove it ('{ref}' takes {', '.join(k for k in takes if k in t.DATA_FIELDS) or 'none of them'})")
        kwargs[f] = getattr(t, f)

    def runs_model(node) -> bool:          # a synthetic generator does not; an unknown backend is said elsewhere
        try:
            return bool(backend(node.kind, node.backend).uses_model)
        except GraphError:
            return False
    given = {"source": t.source, "model_name": spec.model.path,
             "model_dir": lambda: model_dir(spec.model.path, spec.model.seed, log=log),
             "max_new_tokens": max((n.max_new_tokens for n in spec.nodes.values() if n.kind == "generate"
                                    and runs_model(n)), default=None)}
    kwargs.update({k: v for k, v in given.items() if k in takes or takes == ["**"]})
    return kwargs


def make_task(spec, log: Callable[[str], None] = lambda _: None) -> Any:
    """The task (prompt source) of the graph (:func:`task_factory`), built with :func:`task_arguments`."""
    t = spec.task
    ref, factory, where = task_factory(spec)
    kwargs = task_arguments(spec, factory, ref, log)
    try:
        return factory(prompts=t.prompts, seed=t.seed, eval_prompts=t.eval_prompts, **kwargs)
    except ConfigError as e:
        raise GraphError(e.message, where=e.where or where, fix=e.fix) from None

def typed_options(plugin: Any, raw: dict | None, where: str, *, kind: str = "plugin",
                  call: Callable | None = None, passed: frozenset = frozenset({"prompts", "seed", "eval_prompts"})
                  ) -> tuple[Any, list[GraphError]]:
    """``raw`` (a graph's ``options:`` mapping) validated against the options model ``plugin`` declares
    (:func:`omnigraph.sdk.options_model`): ``(the model instance, [])``, or ``(None, errors)`` naming each field
    (``where.<field>``) and the fix; an unknown key gets the closest known one. A plugin that declares no model
    takes the keyword arguments of ``call`` (its factory; checked by name), or none at all."""
    raw = dict(raw or {})
    model = options_model(plugin)
    if model is None:
        known = _keywords(call, passed) if call is not None else []
        bad = [k for k in raw if k not in known] if known != ["**"] else []
        errors = [_unknown_option(k, known, where, kind) for k in bad]
        return (None if errors else raw), errors
    try:
        return model.model_validate(raw), []
    except ValidationError as e:
        out = []
        for err in e.errors()[:8]:
            loc = tuple(str(p) for p in err["loc"])
            if err["type"] == "extra_forbidden":
                out.append(_unknown_option(loc[-1], _fields_at(model, loc[:-1]), where + "".join(f".{p}" for p in loc[:-1]),
                                           kind))
            else:
                at = where + "".join(f".{p}" for p in loc)
                doc = _doc_of(model, loc)
                out.append(GraphError(err["msg"].removeprefix("Value error, "), where=at,
                                      fix=f"see {kind} option '{loc[-1] if loc else where}'" + (f": {doc}" if doc else "")))
        return None, out


def _unknown_option(key: str, known: list[str], where: str, kind: str) -> GraphError:
    close = difflib.get_close_matches(key, known, n=1)
    hint = f"did you mean '{close[0]}'? " if close else ""
    listing = ", ".join(known) if known else "it takes none"
    return GraphError(f"unknown {kind} option '{key}' ({hint}known: {listing})", where=f"{where}.{key}",
                      fix=f"use '{close[0]}'" if close else ("remove it" if not known else f"use one of: {listing}"))


def _fields_at(model: type[BaseModel], loc: tuple) -> list[str]:
    """The field names of the (nested) options model at ``loc``."""
    for part in loc:
        field = model.model_fields.get(part)
        ann = getattr(field, "annotation", None)
        if not (isinstance(ann, type) and issubclass(ann, BaseModel)):
            return []
        model = ann
    return list(model.model_fields)


def _doc_of(model: type[BaseModel], loc: tuple) -> str:
    field = model.model_fields.get(loc[0]) if loc else None
    return (field.description or "") if field is not None else ""


def _keywords(call: Callable, passed: frozenset = frozenset({"prompts", "seed", "eval_prompts"})) -> list[str]:
    """The keyword parameters ``call`` accepts beyond ``passed``, what its caller passes itself (``["**"]``: any)."""
    try:
        params = inspect.signature(call).parameters.values()
    except (TypeError, ValueError):
        return ["**"]
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return ["**"]
    return [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name not in passed
            and p.name != "self"]
