"""The errors a user can cause, each with the field it is about and the fix.

Everything a user can get wrong (bad YAML, an unknown node, a cycle without
delay, a schedule that is too stale) ends in a :class:`GraphError`. The CLI
prints its ``str()`` and exits with code 1; it never shows a traceback.

>>> err = GraphError("must be >= 1", where="schedule.sync_every", fix="set it to 1 or more")
>>> print(err)
schedule.sync_every: must be >= 1 (fix: set it to 1 or more)
"""

from __future__ import annotations

import re
import traceback as _traceback


class GraphError(ValueError):
    """A graph, its YAML or its schedule is invalid. The message says where and how to fix it."""

    def __init__(self, message: str, *, where: str | None = None, fix: str | None = None,
                 line: int | None = None, source: str | None = None):
        self.message = message
        self.where = where
        self.fix = fix
        self.line = line
        self.source = source
        super().__init__(self._render())

    def _render(self) -> str:
        loc = ""
        if self.source:
            loc = f"{self.source}:{self.line}: " if self.line else f"{self.source}: "
        elif self.line:
            loc = f"line {self.line}: "
        where = f"{self.where}: " if self.where else ""
        fix = f" (fix: {self.fix})" if self.fix else ""
        return f"{loc}{where}{self.message}{fix}"

    def __reduce__(self):
        return _rebuild_graph_error, (self.message, self.where, self.fix, self.line, self.source)

    def located(self, source: str | None, line: int | None) -> "GraphError":
        """The same error, pointing at a file and line."""
        return GraphError(self.message, where=self.where, fix=self.fix,
                          line=line if line is not None else self.line,
                          source=source or self.source)


def _rebuild_graph_error(message, where, fix, line, source):
    return GraphError(message, where=where, fix=fix, line=line, source=source)


class GraphErrors(GraphError):
    """Several independent problems found in one validation pass."""

    def __init__(self, errors: list[GraphError]):
        self.errors = list(errors)
        super().__init__("\n".join(str(e) for e in self.errors))

    def _render(self) -> str:  # the message is the list itself
        return self.message


class StalenessError(RuntimeError):
    """A trained batch was staler than the bound the compiler proved (``on_stale: error``)."""


class NodeFailure(RuntimeError):
    """A node raised while the graph ran: names the node and the iteration.

    ``traceback`` keeps where it raised (file and line in the user's code, formatted), for the run
    directory's ``errors.log``: taken from the exception given, or passed along where the failure crossed a
    process boundary as a string (:meth:`wire` and :meth:`from_message`). The message stays one line.

    >>> try:
    ...     {}["x"]
    ... except KeyError as e:
    ...     failure = NodeFailure("reward", 2, e)
    >>> str(failure), "line 2" in failure.traceback
    ("node reward failed at iteration 2: KeyError: 'x'", True)
    >>> again = NodeFailure.from_message(failure.wire())
    >>> (str(again), again.traceback == failure.traceback)
    ("node reward failed at iteration 2: KeyError: 'x'", True)
    """

    TRACEBACK = "\n--- traceback ---\n"
    """Between the message and the traceback in :meth:`wire`."""

    def __init__(self, node: str, iteration: int, error: BaseException | str, traceback: str | None = None):
        self.node = node
        self.iteration = iteration
        self.error = error
        detail = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
        self.detail = detail
        if traceback is None and isinstance(error, BaseException) and error.__traceback__ is not None:
            traceback = "".join(_traceback.format_exception(error))
        self.traceback = traceback
        super().__init__(f"node {node} failed at iteration {iteration}: {detail}")

    def __reduce__(self):
        return NodeFailure, (self.node, self.iteration, self.detail, self.traceback)

    def wire(self) -> str:
        """The message, then the traceback where there is one: what crosses a process boundary as a string."""
        return str(self) + (self.TRACEBACK + self.traceback if self.traceback else "")

    @classmethod
    def from_message(cls, message: str) -> "NodeFailure":
        """Rebuild from ``str(failure)`` or :meth:`wire` (what crosses a process boundary)."""
        message, _, traceback = message.partition(cls.TRACEBACK)
        m = re.match(r"node (\S+) failed at iteration (-?\d+): (.*)", message, re.S)
        if not m:
            return cls("?", -1, message, traceback or None)
        return cls(m.group(1), int(m.group(2)), m.group(3), traceback or None)
