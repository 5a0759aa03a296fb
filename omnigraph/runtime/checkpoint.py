"""Checkpoints: written atomically, verified on load, the newest good one used.

A checkpoint after step ``t`` is a folder ``RUN_DIR/checkpoints/step-<t>/``::

    manifest.json   {"step": t, "graph": <hash of the resolved config>, "files": {name: sha256},
                     "metrics_lines": n, "ledger_lines": m, "timeline_lines": k, "in_flight_groups": [g, ...]}
    <actor>.pkl     each actor's interpreter snapshot (delay buffers, versions, weights, optimizer, RNG)

``in_flight_groups``: the prompt groups the snapshots hold generated and not yet trained (in the one-step-off
edge's buffer, unfinished in partial rollouts), as the actors name them (:mod:`omnigraph.executors.snapshot`);
``omnigraph ledger`` counts them as in flight at the checkpoint, kept, not lost.

It is written into a temporary folder, every file fsynced, then renamed into
place, so a crash leaves either the whole checkpoint or none. On load, a
checkpoint whose manifest or checksums do not match is skipped with a message
and the previous one is used.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ..errors import GraphError
from ..executors.snapshot import held_groups


def graph_hash(config_text: str) -> str:
    return hashlib.sha256(config_text.encode()).hexdigest()[:16]


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _write(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


@dataclass
class Checkpoint:
    step: int
    path: Path
    manifest: dict
    snapshots: dict[str, bytes]


def save(run_dir: Path, step: int, graph: str, snapshots: dict[str, bytes], counts: dict[str, int],
         keep: int) -> Path:
    root = Path(run_dir) / "checkpoints"
    root.mkdir(exist_ok=True)
    final = root / folder(step)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=root))
    try:
        files = {}
        for actor, blob in snapshots.items():
            _write(tmp / f"{actor}.pkl", blob)
            files[f"{actor}.pkl"] = _sha(blob)
        manifest = {"step": step, "graph": graph, "files": files, **{f"{k}_lines": v for k, v in counts.items()}}
        held = [held_groups(blob) for blob in snapshots.values()]
        if all(h is not None for h in held):
            manifest["in_flight_groups"] = sorted(set().union(*held))
        _write(tmp / "manifest.json", json.dumps(manifest, indent=1).encode())
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        fd = os.open(root, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise GraphError(f"cannot write checkpoint {final}: {e.strerror or e}", where="checkpoint",
                         fix="free disk space in the run directory; the run directory is intact") from None
    for old in sorted(p for p in root.glob("step-*") if p.is_dir())[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def load_latest(run_dir: Path, graph: str, on_damaged=None) -> Checkpoint | None:
    """The newest checkpoint that verifies; torn or corrupt ones are skipped, each reported to
    ``on_damaged(name, reason)``."""
    root = Path(run_dir) / "checkpoints"
    for path in sorted((p for p in root.glob("step-*") if p.is_dir()), reverse=True):
        try:
            manifest = json.loads((path / "manifest.json").read_text())
            snaps = {}
            for name, digest in manifest["files"].items():
                blob = (path / name).read_bytes()
                if _sha(blob) != digest:
                    raise ValueError(f"{name}: checksum mismatch")
                snaps[name.removesuffix(".pkl")] = blob
        except (OSError, ValueError, KeyError) as e:
            if on_damaged is not None:
                on_damaged(path.name, str(e))
            continue
        if manifest["graph"] != graph:
            raise GraphError(f"checkpoint {path} belongs to another graph", where="--resume",
                             fix="resume with the run directory's own config.yaml (do not edit it)")
        return Checkpoint(manifest["step"], path, manifest, snaps)
    return None


def folder(step: int) -> str:
    """The name of the checkpoint folder of ``step``."""
    return f"step-{step:08d}"


def newest_manifest(run_dir: Path) -> dict | None:
    """The manifest of the newest checkpoint that has a readable one, with its folder's ``name`` added; None
    without any. Its snapshots are not verified (that reads them all): a resume still skips a damaged one."""
    for path in sorted((p for p in (Path(run_dir) / "checkpoints").glob("step-*") if p.is_dir()), reverse=True):
        try:
            manifest = json.loads((path / "manifest.json").read_text())
        except (OSError, ValueError):
            continue
        if isinstance(manifest, dict):
            return {**manifest, "name": path.name}
    return None


def newest(run_dir: Path) -> tuple[int, str] | None:
    """The step and folder name of the newest checkpoint (unverified), or None."""
    found = sorted(p.name for p in (Path(run_dir) / "checkpoints").glob("step-*") if p.is_dir())
    return (int(found[-1].removeprefix("step-")), found[-1]) if found else None
