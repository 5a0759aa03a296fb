"""Plugin options: what a plugin accepts beyond the graph's own fields, as a pydantic model it declares.

A backend names its model in its :class:`~omnigraph.sdk.Backend` descriptor (``options=``); a task, an
environment or a logger class carries it as its ``Options`` attribute. The engine validates the graph's
``options:`` mapping against it when the graph is checked (``omnigraph check``, before anything starts): an
unknown key is an error naming the field, with the closest known one; a value of the wrong type or out of range
is an error naming the field and the fix. The plugin then gets the validated instance (a node as
``ctx.backend_options``, a task, environment or logger as keyword arguments), never an untyped dict.

>>> from pydantic import Field
>>> class Sampler(Options):
...     '''Options of a made-up generator.'''
...     steps: int = Field(10, ge=1)
...     '''Denoising steps.'''
>>> Sampler.model_validate({"steps": 4}).steps
4
>>> sorted(Sampler.model_fields)
['steps']
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict


class Options(BaseModel):
    """The base of every plugin's options: unknown keys are errors, instances are read-only."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


def options_model(plugin: Any) -> type[Options] | None:
    """The options model a plugin declares: a backend descriptor's ``options``, else the ``Options`` attribute
    of a class (or function), or the model itself; None when it declares none."""
    if isinstance(plugin, type) and issubclass(plugin, BaseModel):
        return plugin
    model = getattr(plugin, "options", None) if not isinstance(plugin, type) else None
    if not (isinstance(model, type) and issubclass(model, BaseModel)):
        model = getattr(plugin, "Options", None)
    return model if isinstance(model, type) and issubclass(model, BaseModel) else None
