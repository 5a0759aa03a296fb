"""The error node code raises for a problem the user can fix (a missing package, a model folder without
a chat template): the engine shows it as one line naming the field and the fix, never a traceback.

>>> str(ConfigError("needs the gguf package", where="model.path", fix="pip install gguf"))
'model.path: needs the gguf package (fix: pip install gguf)'
"""

from __future__ import annotations


class ConfigError(ValueError):
    def __init__(self, message: str, *, where: str | None = None, fix: str | None = None):
        self.message, self.where, self.fix = message, where, fix
        super().__init__((f"{where}: " if where else "") + message + (f" (fix: {fix})" if fix else ""))

    def __reduce__(self):
        return _rebuild, (self.message, self.where, self.fix)


def _rebuild(message, where, fix):
    return ConfigError(message, where=where, fix=fix)
