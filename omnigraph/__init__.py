"""omnigraph: RL post-training of language models as a static, compiled dataflow graph.

>>> import omnigraph as og
>>> plan = og.compile("graphs/synthetic_one_step_off.yaml")   # doctest: +SKIP
>>> plan.bound                                                # doctest: +SKIP
1
"""

from .builder import Graph, NodeRef
from .compiler import compile
from .errors import GraphError, NodeFailure, StalenessError
from .spec import GraphSpec
from .yamlio import dump, load_file as load, load_text

__all__ = ["Graph", "NodeRef", "compile", "GraphError", "NodeFailure", "StalenessError", "GraphSpec",
           "dump", "load", "load_text", "run"]
__version__ = "0.1.0"


def run(plan, **kw):
    """Run a compiled plan (see :func:`omnigraph.runtime.run`)."""
    from .runtime import run as _run
    return _run(plan, **kw)
