"""Executors: one plan, three ways to run it.

- ``local``: the plan in one process, deterministically (:mod:`.local`): the reference semantics;
- ``ray``: the plan compiled into one Ray Compiled Graph (:mod:`.ray.compiled`);
- ``ray-tasks``: the same program as ordinary actor calls (:mod:`.ray.tasks`).

Each hosts one :class:`~omnigraph.executors.interpreter.Interpreter` per plan actor. The modules here are
executor-neutral (the interpreter, building nodes, the checks on what crosses an edge, regeneration, fault
injection); everything that knows Ray is in :mod:`omnigraph.executors.ray`, imported only when a Ray executor
runs (an import contract holds it).
"""

from __future__ import annotations

import importlib

from ..errors import GraphError
from ..planning import compile
from .base import Executor, StepResult

EXECUTORS = {"local": "local:LocalExecutor", "ray": "ray.compiled:RayCompiledExecutor",
             "ray-tasks": "ray.tasks:RayTasksExecutor"}
"""Name -> module:class; Ray is imported only when a Ray executor runs (``omnigraph check`` never loads it)."""


def make_executor(plan, name: str | None = None, **options) -> Executor:
    """The executor ``name`` (default: the one the plan was compiled for, ``runtime.executor``). Another
    executor gets the plan compiled for it: the weights path can depend on it (one process or several)."""
    if name and name != plan.graph.spec.runtime.executor:
        plan = for_executor(plan, name)
    name = plan.graph.spec.runtime.executor
    if name not in EXECUTORS:
        raise GraphError(f"unknown executor '{name}'", where="runtime.executor", fix="use ray, ray-tasks or local")
    module, cls = EXECUTORS[name].split(":")
    return getattr(importlib.import_module(f".{module}", __name__), cls)(plan, **options)


def for_executor(plan, name: str):
    """``plan`` compiled again for executor ``name`` (the same graph; only choices that depend on it differ).

    It compiles the spec as given (``plan.source``), not the planner's rewrite of it: ``schedule.lend`` adds
    nodes, and planning the rewritten spec again would add them twice."""
    if name not in EXECUTORS:
        raise GraphError(f"unknown executor '{name}'", where="runtime.executor", fix="use ray, ray-tasks or local")
    return compile(plan.source if plan.source is not None else plan.graph.spec, overrides=[f"runtime.executor={name}"])


__all__ = ["EXECUTORS", "Executor", "StepResult", "for_executor", "make_executor"]
