"""The building blocks of the YAML schema (:mod:`omnigraph.graph.spec`): strict models and the constrained scalars."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

NAME = r"^[A-Za-z_][A-Za-z0-9_\-]*$"
Name = Annotated[str, Field(pattern=NAME, max_length=64)]
Seconds = Annotated[float, Field(ge=0, le=86_400)]
Backend = Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_\-]*$", max_length=64)]
"""A backend name, checked against the plugin registry when the graph is compiled."""


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)
