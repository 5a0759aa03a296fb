"""The ``shm`` path's files, reused: a sender writes into pages it already has, a receiver holds a lock.

A fresh ``/dev/shm`` file costs the sender a page fault and a zeroed page per 4 KiB it writes (the export
of SmolLM2's 269 MB took 85 ms into new files against 12 ms into pages written before). So the sender
keeps the files of the packs it dropped (:class:`Pool`) and refills one instead of making a new one, but
only one that no receiver maps:

- a receiver reads a file under a shared ``flock`` (:func:`open_shared`), held as long as any tensor it
  handed out lives (the lock is a file descriptor of its own, closed when the last of them goes);
- the sender reuses a file only when it gets the exclusive lock at once, and renames it before writing: a
  receiver that opens the old name later finds no file (or another one: it compares inodes) and raises,
  as it did before files were reused, instead of reading a newer version.

So reuse never changes what any receiver reads; when every kept file is still mapped somewhere the sender
simply makes a new one. A sender keeps at most :data:`FREE` unused files per size and dtype (RAM).

A receiver keeps its mappings too (:data:`CACHED`, by inode, through a descriptor that holds no lock): a file
the sender refilled comes back already mapped, its page tables filled (mapping SmolLM2's 269 MB with
``MAP_POPULATE`` took 7 ms of each sync). Inode numbers are unique among a file system's live files and a
mapping keeps its file alive, so a kept mapping is always of the file of that number; one whose file was
deleted is dropped at the next open (its memory is the file's).
"""

from __future__ import annotations

import fcntl
import mmap
import os
import threading
from collections import OrderedDict

import numpy as np
import torch

from .shmfiles import name, remove_orphans, unlink

FREE = 2
CACHED = 8
"""Mappings a receiver keeps of the files it read (the sender's files in rotation: its kept packs and free files)."""
_COUNT = [0]
_MAPS: "OrderedDict[tuple[int, int, int], tuple[int, mmap.mmap]]" = OrderedDict()
_MAPS_LOCK = threading.Lock()


def _new_path(dt: str) -> str:
    folder = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    if folder is None:
        raise RuntimeError("the shm weights path needs a writable /dev/shm")
    if _COUNT[0] == 0:
        remove_orphans(folder)
    _COUNT[0] += 1
    return name(folder, os.environ.get("OMNIGRAPH_SHM_TAG", str(os.getpid())), os.getpid(), _COUNT[0], dt)


def new_buffer(n: int, dt: str) -> torch.Tensor:
    """A flat tensor of ``n`` elements backed by a new file in ``/dev/shm`` (``og_file``: its path)."""
    path = _new_path(dt)
    t = torch.from_file(path, shared=True, size=max(n, 1), dtype=getattr(torch, dt))[:n]
    t.og_file = path
    return t


def _unmapped(path: str) -> bool:
    """True when no receiver holds the file (the exclusive lock comes at once)."""
    try:
        fd = os.open(path, os.O_RDWR)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)                      # closing releases the lock


class Pool:
    """A sender's ``/dev/shm`` buffers: :meth:`take` one (a reused file when one is free), :meth:`give_back`
    those of a dropped pack; :meth:`close` deletes the files it keeps."""

    def __init__(self):
        self.free: list[torch.Tensor] = []
        self.closed = False
        self.reused = 0

    def take(self, n: int, dt: str) -> torch.Tensor:
        for i, t in enumerate(self.free):
            if t.numel() == n and str(t.dtype).removeprefix("torch.") == dt and _unmapped(t.og_file):
                self.free.pop(i)
                path = _new_path(dt)
                os.rename(t.og_file, path)
                t.og_file = path
                self.reused += 1
                return t
        return new_buffer(n, dt)

    def give_back(self, buffers: list[torch.Tensor]) -> None:
        for t in buffers:
            same = [f for f in self.free if f.numel() == t.numel() and f.dtype == t.dtype]
            if self.closed or len(same) >= FREE:
                unlink([t.og_file])
            else:
                self.free.append(t)

    def close(self) -> None:
        self.closed = True
        unlink([t.og_file for t in self.free])
        self.free.clear()


def open_shared(path: str, n: int, dt: str) -> torch.Tensor:
    """Receiver side: ``path`` (``n`` elements of ``dt``) as a tensor, under a shared lock held while any
    tensor made from it lives."""
    dtype = getattr(torch, dt)
    size = max(n, 1) * torch.empty((), dtype=dtype).element_size()
    try:
        fd = os.open(path, os.O_RDWR)
    except FileNotFoundError:
        raise _released(path) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
        st = os.fstat(fd)
        if st.st_ino != _inode(path):
            raise _released(path)
        m = _mapping(fd, st, size)
    except BaseException:
        os.close(fd)
        raise
    data = np.frombuffer(m, dtype=np.uint8, count=size).view(_Leased)
    data.lease = _Lease(fd)               # the tensors keep the array, the array the lock
    return torch.from_numpy(data).view(dtype)[:n]


class _Leased(np.ndarray):
    """A view of a mapping that carries the lock it was read under (``lease``)."""


class _Lease:
    def __init__(self, fd: int):
        self.fd = fd

    def __del__(self):
        try:
            os.close(self.fd)             # releases the shared lock
        except Exception:                 # noqa: BLE001 - closed already, or the interpreter is shutting down
            pass


def _mapping(locked: int, st: os.stat_result, size: int) -> mmap.mmap:
    """The kept mapping of the file open (and locked) as ``locked``, or a new one (kept)."""
    key = (st.st_dev, st.st_ino, size)
    with _MAPS_LOCK:
        for k, (fd, _) in list(_MAPS.items()):
            if k != key and os.fstat(fd).st_nlink == 0:      # deleted: only the mapping keeps its memory
                _drop(k)
        if key in _MAPS:
            _MAPS.move_to_end(key)
            return _MAPS[key][1]
        fd = os.open(f"/proc/self/fd/{locked}", os.O_RDWR)    # the same file, a description without the lock
        try:
            m = mmap.mmap(fd, size, flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0))
        except BaseException:
            os.close(fd)
            raise
        _MAPS[key] = (fd, m)
        while len(_MAPS) > CACHED:
            _drop(next(iter(_MAPS)))
        return m


def _drop(key) -> None:
    fd, _ = _MAPS.pop(key)
    os.close(fd)                          # the mapping itself goes with the last tensor on it


def _inode(path: str) -> int | None:
    try:
        return os.stat(path).st_ino
    except FileNotFoundError:
        return None


def _released(path: str) -> RuntimeError:
    return RuntimeError(f"weights were sent as the shared-memory file {path}, which is not on this host or was "
                        "already released; the shm path needs trainer and rollout on one host")
