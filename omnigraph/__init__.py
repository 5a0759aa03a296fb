"""omnigraph: RL post-training of language models as a static, compiled dataflow graph.

>>> import omnigraph as og
>>> plan = og.compile("graphs/synthetic_one_step_off.yaml")
>>> plan.bound
1

Node code imports :mod:`omnigraph.sdk` (here as ``og.sdk``) and nothing else.
"""

from . import sdk
from .graph.builder import Graph, NodeRef
from .errors import GraphError, NodeFailure, StalenessError
from .planning import Plan, compile
from .runtime import RunResult, run
from .graph.spec import GraphSpec
from .graph.yamlio import dump, load_file as load, load_text

__all__ = ["Graph", "NodeRef", "compile", "run", "Plan", "RunResult", "GraphError", "NodeFailure",
           "StalenessError", "GraphSpec", "dump", "load", "load_text", "sdk"]
__version__ = "0.1.0"
