"""Finding what a package registered: ``load(group, name)`` and ``load_dotted("module:attr")``: the one lookup.

``load_dotted`` also takes a file: ``path/to/agent.py:solve`` imports that file as a module of its own (a
user's code that is not an installed package; a graph file's relative path is resolved against its folder).

A node that names another plugin (a reward function by name, a task) looks it
up here; the engine's registry (``omnigraph.plugins``) builds on these two
functions and turns a miss into an error that names the field and the fix.
"""

from __future__ import annotations

import difflib
import functools
import importlib
import importlib.util
import os
import sys
from importlib.metadata import EntryPoint, entry_points
from typing import Any


@functools.lru_cache(maxsize=None)
def table(group: str) -> dict[str, EntryPoint]:
    """Name -> entry point of ``omnigraph.<group>`` (the first registration of a name; the engine reports
    two packages registering one name differently)."""
    out: dict[str, EntryPoint] = {}
    for ep in entry_points(group=f"omnigraph.{group}"):
        out.setdefault(ep.name, ep)
    return out


def load_dotted(ref: str) -> Any:
    """``package.module:attr`` (or ``path/to/file.py:attr``) -> the attribute; LookupError saying what is wrong
    if it cannot be found."""
    module, sep, attr = ref.rpartition(":") if ".py:" in ref else ref.partition(":")   # a file path may hold ":"
    if not sep or not module or not attr:
        raise LookupError(f"'{ref}' is not a dotted path")
    try:
        mod = _from_file(module) if module.endswith(".py") else importlib.import_module(module)
    except Exception as e:  # noqa: BLE001 - any import failure is the user's to fix
        raise LookupError(f"cannot import module '{module}': {type(e).__name__}: {e}") from e
    if not hasattr(mod, attr):
        raise LookupError(f"module '{module}' has no attribute '{attr}'")
    return getattr(mod, attr)


@functools.lru_cache(maxsize=None)
def _from_file(path: str):
    """A Python file imported as a module named after its path (once per process)."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no such file '{path}'")
    name = "omnigraph_user_" + "".join(c if c.isalnum() else "_" for c in os.path.abspath(path))
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def load(group: str, ref: str) -> Any:
    """A registered name in ``omnigraph.<group>`` or a dotted path ``package.module:attr``; LookupError if
    neither resolves."""
    if ":" in ref:
        return load_dotted(ref)
    ep = table(group).get(ref)
    if ep is None:
        known = sorted(table(group))
        close = difflib.get_close_matches(ref, known, n=1)
        hint = f"did you mean '{close[0]}'? " if close else ""
        raise LookupError(f"nothing is registered as '{ref}' under omnigraph.{group} ({hint}known: "
                          f"{', '.join(known) or 'none'})")
    return ep.load()
