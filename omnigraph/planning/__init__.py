"""Planning: ``compile`` (:mod:`.compile`: spec -> validated graph -> staleness proof -> plan), the graph
lowered onto actors (:mod:`.lower`), the resulting :class:`Plan` (:mod:`.plan`), its predicted step time
(:mod:`.predict`), its one printer (:mod:`.printer`), and what a run's measured node times predict for
other schedules (:mod:`.whatif`, ``omnigraph plan --timings``).
"""

from .compile import compile, to_spec
from .lower import lower
from .plan import Actor, Channel, Group, Plan, Task

__all__ = ["Actor", "Channel", "Group", "Plan", "Task", "compile", "lower", "to_spec"]
