"""Which class implements a node: by kind and backend, or by dotted path for ``kind: custom``."""

from __future__ import annotations

from omnigraph.errors import GraphError
from omnigraph.validate import load_object

BUILTIN = {
    ("generate", "synthetic"): "nodes.synthetic:Generate",
    ("reward", "python"): "nodes.reward:Reward",
    ("reward", "synthetic"): "nodes.reward:Reward",
    ("old_logprob", "synthetic"): "nodes.synthetic:Logprob",
    ("ref_logprob", "synthetic"): "nodes.synthetic:Logprob",
    ("update", "synthetic"): "nodes.synthetic:Update",
    ("sync", "synthetic"): "nodes.synthetic:Sync",
    ("generate", "hf"): "nodes.hf:Generate",
    ("generate", "vllm"): "nodes.vllm_backend:VllmGenerate",
    ("old_logprob", "torch"): "nodes.trainer:Logprob",
    ("ref_logprob", "torch"): "nodes.trainer:Logprob",
    ("update", "torch"): "nodes.trainer:Update",
    ("sync", "torch"): "nodes.trainer:Sync",
}


def make_node(node, ctx):
    """Build the implementation of ``node`` (an ``ir.Node``) for one actor rank."""
    if node.kind == "custom":
        return load_object(node.spec.cls)(node.name, node.spec, ctx)
    path = BUILTIN.get((node.kind, node.backend))
    if path is None:
        raise GraphError(f"backend '{node.backend}' of kind {node.kind} is not available in this version",
                         where=f"nodes.{node.name}.backend", fix="use backend: synthetic")
    return load_object(path)(node.name, node.spec, ctx)
