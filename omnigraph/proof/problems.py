"""The problems a validation pass collects, each a :class:`~omnigraph.errors.GraphError` naming the field and
the fix, raised together once the pass is through (a user fixes them all in one go)."""

from __future__ import annotations

from ..errors import GraphError, GraphErrors


class Problems:
    """The problems one check pass finds: raised together at its end (one, or a GraphErrors of all)."""

    def __init__(self) -> None:
        self.items: list[GraphError] = []

    def add(self, message: str, where: str | None = None, fix: str | None = None) -> None:
        self.items.append(GraphError(message, where=where, fix=fix))

    def extend(self, error: GraphError) -> None:
        self.items.extend(getattr(error, "errors", [error]))

    def raise_if_any(self) -> None:
        if len(self.items) == 1:
            raise self.items[0]
        if self.items:
            raise GraphErrors(self.items)
