"""The ``shm`` weights path's files (``omnigraph.transports.shmpool``): a sender reuses a file only when no
receiver holds it, and a receiver keeps its mappings of the sender's files but holds their locks only while
tensors read under them live."""

import glob
import os
import pickle
import subprocess
import sys

import pytest
import torch

from conftest import ROOT

RECEIVER = """
import pickle, sys, torch
pack = pickle.loads(sys.stdin.buffer.read(int(sys.stdin.buffer.readline())))
first = pack["w"].clone()
print("mapped", flush=True)
sys.stdin.buffer.readline()                   # the sender exported again meanwhile
print("intact" if torch.equal(pack["w"], first) else "overwritten", float(first[0, 0]), flush=True)
"""


def test_shm_files_are_reused_only_when_no_receiver_maps_them():
    """The sender refills the files of dropped packs (pages it has: memory speed), except one that another
    process still maps: that receiver keeps reading the version it was sent. A receiver that comes for a file
    after it was reused is told, never handed the newer weights."""
    from omnigraph.transports.packed import KEEP, Shm
    from omnigraph.sdk import WeightsState
    state = {"w": torch.zeros(256, 1024), "b": torch.zeros(7)}
    shm = Shm("sync")
    try:
        blobs = []
        for v in range(KEEP + 1):
            state["w"].fill_(v)
            blobs.append(pickle.dumps(shm.export(WeightsState(state, "full"), v).tensors))
        proc = subprocess.Popen([sys.executable, "-c", RECEIVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                text=False, cwd=ROOT)
        proc.stdin.write(b"%d\n" % len(blobs[-1]) + blobs[-1])
        proc.stdin.flush()
        assert proc.stdout.readline().strip() == b"mapped"
        for v in range(KEEP + 1, 3 * KEEP + 3):   # every kept file comes round again, the mapped one too
            state["w"].fill_(v)
            shm.export(WeightsState(state, "full"), v)
        proc.stdin.write(b"go\n")
        proc.stdin.flush()
        out, _ = proc.communicate(timeout=60)
        assert out.split() == [b"intact", str(float(KEEP)).encode()], out
        assert shm.pool.reused >= KEEP                # the others were reused
        with pytest.raises(RuntimeError, match="already released"):
            pickle.loads(blobs[0])                    # its file was reused since (renamed): not the newer weights
    finally:
        shm.close()


def test_a_receiver_keeps_its_mappings_but_not_the_locks():
    """The receiver maps each of the sender's files once: a refilled file comes back through the mapping it kept,
    with the new weights; its lock lasts only as long as the tensors read under it; a deleted file's mapping is
    dropped at the next open."""
    from omnigraph.sdk import WeightsState
    from omnigraph.transports import shmpool
    from omnigraph.transports.packed import KEEP, Shm
    state = {"w": torch.zeros(64, 1024)}
    shm, other = Shm("sync"), Shm("sync")

    def mapping_of(ino):
        (m,) = [m for (_, i, _), (_, m) in shmpool._MAPS.items() if i == ino]
        return m
    try:
        seen: dict[int, object] = {}                  # inode -> the mapping it was read through
        for v in range(1, 4 * KEEP):
            state["w"].fill_(v)
            sent = shm.export(WeightsState(state, "full"), v).tensors
            ino = os.stat(sent.files["float32"]).st_ino
            got = pickle.loads(pickle.dumps(sent))
            assert float(got["w"][0, 0]) == v and float(got["w"][-1, -1]) == v
            assert seen.setdefault(ino, mapping_of(ino)) is mapping_of(ino)   # seen before: the same mapping
            assert not shmpool._unmapped(sent.files["float32"])               # locked while `got` lives
            del got, sent
        assert shm.pool.reused >= KEEP and len(seen) <= shmpool.CACHED      # files came round, mapped once each
        # no received tensor alive: each file can be taken by its sender, though the receiver still maps it
        files = [f for f in glob.glob("/dev/shm/omnigraph-weights-*") if os.stat(f).st_ino in seen]
        assert files and all(shmpool._unmapped(f) for f in files)
        # the sender goes (its files deleted): the next open drops their mappings
        shm.close()
        state["w"].fill_(-1)
        got = pickle.loads(pickle.dumps(other.export(WeightsState(state, "full"), 1).tensors))
        assert float(got["w"][0, 0]) == -1
        assert not {i for (_, i, _) in shmpool._MAPS} & set(seen)
    finally:
        shm.close()
        other.close()
