"""The descriptors omnigraph reads to check a graph (this module stays light: no torch)."""

from omnigraph.sdk import Backend

LOOP = Backend("generate", "omnigraph_example.loop:LoopGenerate", uses_model=True,
               doc="sampling as a plain token loop over the model's KV cache")
