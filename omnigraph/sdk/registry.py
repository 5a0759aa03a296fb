"""Finding what a package registered: ``load(group, name)`` and ``load_dotted("module:attr")``: the one lookup.

A node that names another plugin (a reward function by name, a task) looks it
up here; the engine's registry (``omnigraph.plugins``) builds on these two
functions and turns a miss into an error that names the field and the fix.
"""

from __future__ import annotations

import difflib
import functools
import importlib
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
    """``package.module:attr`` -> the attribute; LookupError saying what is wrong if it cannot be found."""
    module, sep, attr = ref.partition(":")
    if not sep or not module or not attr:
        raise LookupError(f"'{ref}' is not a dotted path")
    try:
        mod = importlib.import_module(module)
    except Exception as e:  # noqa: BLE001 - any import failure is the user's to fix
        raise LookupError(f"cannot import module '{module}': {type(e).__name__}: {e}") from e
    if not hasattr(mod, attr):
        raise LookupError(f"module '{module}' has no attribute '{attr}'")
    return getattr(mod, attr)


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
