"""transformers' private and internal parts that omnigraph uses, in one place (see :mod:`omnigraph.sdk.adapters`).

- ``AutoModelForCausalLM._model_mapping``: the class ``AutoModelForCausalLM.from_pretrained`` would build for
  a config, looked up without building it (the lookup imports the architecture's modelling module): the warm
  workers import a model's code once, in the process the actors are forked from;
- ``transformers.models.auto.tokenization_auto.tokenizer_class_from_name``: the same for a tokenizer class
  named in ``tokenizer_config.json`` (not exported at the top level);
- ``PretrainedConfig._attn_implementation``: the attention implementation a loaded model uses (the static
  decoder gives ``sdpa`` models its grouped-query attention); there is a setter on the model, no public getter;
- ``transformers.integrations.sdpa_attention.sdpa_attention_forward`` and ``transformers.masking_utils.sdpa_mask``:
  transformers' own ``sdpa`` attention and its masks, which an attention registered under a new name falls
  back to and reuses (internal modules, not exported at the top level).

>>> from types import SimpleNamespace
>>> attn_implementation(SimpleNamespace(_attn_implementation="sdpa")), attn_implementation(None)
('sdpa', None)
"""

from __future__ import annotations


from . import check

SUPPORTED = ">=5.19,<5.20"
"""The transformers versions this adapter was written for (the project pins 5.19.0)."""

_version: str | None = None


def check_version() -> str:
    """The installed transformers version, checked once; :class:`~omnigraph.sdk.adapters.UnsupportedVersion` outside
    :data:`SUPPORTED`."""
    global _version
    if _version is None:
        _version = check("transformers", ("transformers",), SUPPORTED, __name__)
    return _version


def causal_lm_class(config):
    """The class ``AutoModelForCausalLM`` builds for ``config`` (importing its modelling module)."""
    check_version()
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM._model_mapping[type(config)]


def tokenizer_class(name: str):
    """The tokenizer class called ``name`` (importing its module), or None where transformers has none."""
    check_version()
    from transformers.models.auto.tokenization_auto import tokenizer_class_from_name
    return tokenizer_class_from_name(name)


def attn_implementation(config) -> str | None:
    """The attention implementation a model's ``config`` names (``"sdpa"``, ``"eager"``, a registered name), or
    None where it names none."""
    check_version()
    return getattr(config, "_attn_implementation", None)


def sdpa_attention_forward():
    """transformers' ``sdpa`` attention function (what a model with ``attn_implementation="sdpa"`` calls)."""
    check_version()
    from transformers.integrations.sdpa_attention import sdpa_attention_forward as forward
    return forward


def register_attention(name: str, forward) -> None:
    """Register ``forward`` as the attention called ``name``, with ``sdpa``'s masks (a model then takes it with
    ``model.set_attn_implementation(name)``)."""
    check_version()
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    AttentionInterface.register(name, forward)
    AttentionMaskInterface.register(name, sdpa_mask)
