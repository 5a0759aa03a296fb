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
import importlib
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
from typing import Any, Callable

from .errors import GraphError
from .sdk import ConfigError, registry

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
    """``package.module:attr`` -> the attribute; a clear GraphError if it cannot be found."""
    mod, sep, attr = dotted.partition(":")
    if not sep or not mod or not attr:
        raise GraphError(f"'{dotted}' is not a dotted path", where=where, fix="write it as package.module:name")
    try:
        module = importlib.import_module(mod)
    except Exception as e:  # noqa: BLE001 - any import failure is the user's to fix
        raise GraphError(f"cannot import module '{mod}': {type(e).__name__}: {e}", where=where,
                         fix="check the module name and that it is importable from the current directory") from None
    if not hasattr(module, attr):
        raise GraphError(f"module '{mod}' has no attribute '{attr}'", where=where, fix="check the name after ':'")
    return getattr(module, attr)


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


DATA_FIELDS = ("prompt", "answer", "split", "eval_split", "shuffle_seed", "epochs", "max_prompt_tokens", "on_long",
               "chat", "system")


def make_task(spec, log: Callable[[str], None] = lambda _: None) -> Any:
    """The task (prompt source) of the graph: a registered or dotted factory (``task.name``), or prompts from
    data (``task.source``: the registered ``dataset`` task for files, ``reasoning_gym`` for that source)."""
    t = spec.task
    if t.source is None:
        factory = named_or_dotted("tasks", t.name, where="task.name")
        return factory(prompts=t.prompts, seed=t.seed, eval_prompts=t.eval_prompts, **t.options)
    if t.source == "reasoning_gym":
        factory = load("tasks", "reasoning_gym", where="task.source")
        kwargs = {"dataset": t.dataset, "config": t.config, "fewshot": t.fewshot, "fewshot_answer": t.fewshot_answer}
    else:
        factory = load("tasks", "dataset", where="task.source")
        kwargs = {"source": t.source, "model_name": spec.model.path,
                  "model_dir": lambda: model_dir(spec.model.path, spec.model.seed, log=log)}
    fields = {f: getattr(t, f) for f in (DATA_FIELDS if t.source != "reasoning_gym" else t.changed(DATA_FIELDS))}
    try:
        return factory(prompts=t.prompts, seed=t.seed, eval_prompts=t.eval_prompts, **fields, **kwargs, **t.options)
    except ConfigError as e:
        raise GraphError(e.message, where=e.where or "task.source", fix=e.fix) from None
