"""The ``shm`` path's weight files in ``/dev/shm``: their names and their removal.

Apart from :mod:`.pack` (and torch) so that the driver can remove an executor's files after its actors
stopped without loading torch (seconds on a small host) when no node of its own needs it.

>>> name("/dev/shm", "123-ab", 456, 1, "float32")
'/dev/shm/omnigraph-weights-123-ab-456-1-float32'
"""

from __future__ import annotations

import contextlib
import glob
import os

PREFIX = "omnigraph-weights-"


def name(folder: str, tag: str, pid: int, count: int, dt: str) -> str:
    """``PREFIX<tag>-<writer pid>-<count>-<dtype>``: the tag is the executor's (``OMNIGRAPH_SHM_TAG``)."""
    return os.path.join(folder, f"{PREFIX}{tag}-{pid}-{count}-{dt}")


def remove_shm(tag: str) -> None:
    """Delete every weights file made under ``tag`` (an executor's actors, after they stopped)."""
    unlink(glob.glob(f"/dev/shm/{PREFIX}{tag}-*"))


def remove_orphans(folder: str) -> None:
    """Weights files whose writer is gone (killed before it could clean up): RAM nobody will free."""
    for path in glob.glob(os.path.join(folder, f"{PREFIX}*")):
        try:
            pid = int(os.path.basename(path).split("-")[-3])
            os.kill(pid, 0)
        except ProcessLookupError:
            unlink([path])
        except (ValueError, IndexError, PermissionError):
            pass


def unlink(paths: list[str]) -> None:
    for p in paths:
        with contextlib.suppress(OSError):
            os.unlink(p)
