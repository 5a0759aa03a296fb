"""The verifiers library's internal parts that omnigraph's verifiers environment uses, in one place (see
:mod:`omnigraph.sdk.adapters`). verifiers is an optional extra (``omnigraph[verifiers]``).

- ``<stack>.utils.message_utils.normalize_messages`` (``<stack>``: ``verifiers`` in 0.2, ``verifiers.legacy`` in
  0.3): what verifiers' own rollout does with an environment's ``env_response``, making its messages message
  objects; a utility module, not exported at the package's top.
"""

from __future__ import annotations

import importlib

from . import check

SUPPORTED = ">=0.2,<0.4"
"""The verifiers versions this adapter was written for (0.4 keeps only its new ``verifiers.v1`` stack)."""

_version: str | None = None


def check_version() -> str:
    """The installed verifiers version, checked once; :class:`~omnigraph.sdk.adapters.UnsupportedVersion`
    outside :data:`SUPPORTED` or where verifiers is not installed."""
    global _version
    if _version is None:
        _version = check("verifiers", ("verifiers",), SUPPORTED, __name__)
    return _version


def normalize_messages(stack):
    """verifiers' ``normalize_messages`` of the classic ``stack`` (the module of ``MultiTurnEnv``)."""
    check_version()
    return importlib.import_module(f"{stack.__name__}.utils.message_utils").normalize_messages
