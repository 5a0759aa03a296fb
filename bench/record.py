"""Benchmark results on disk: every figure a benchmark prints is kept with where and on what it was measured.

``save(bench, result)`` writes ``bench/results/<bench>-<YYYYMMDD-HHMMSS>.json`` (UTC; ``-1``, ``-2`` ...
appended if that second is taken) holding::

    {"bench": "vs_trl", "date": "2026-12-01T10:11:12+00:00",
     "git_rev": "<git rev-parse HEAD>", "dirty": false,        # dirty: tracked files modified
     "argv": [...],
     "machine": {"cpu_model", "cpu_flags": {avx2, avx512f, avx512_bf16, amx_bf16, amx_tile, avx512_vnni},
                 "cores": {"os_cpu_count", "affinity"}, "mem_gb", "gpus": [{"name", "memory_gb"}],
                 "python", "torch", "ray", "load_avg"},
     "result": {... the dict the benchmark printed as its last JSON line ...}}

``latest(bench)`` reads the newest one back. A benchmark ends with :func:`emit`: it saves the dict
(unless ``--no-save``, added by :func:`add_arguments`), prints ``results: <path>``, then prints the same
dict as its last line of JSON.

On a copy of the working tree (the GPU machine's: no ``.git``, or a stale one) pass the revision in:
``OMNIGRAPH_GIT_REV=<sha> [OMNIGRAPH_GIT_DIRTY=0|1]`` (it wins over git); ``OMNIGRAPH_BENCH_RESULTS=DIR`` writes the
files to ``DIR`` instead (e.g. ``$OUT/results`` on the device machine, to bring them back), to be copied
into ``bench/results/`` afterwards. README figures cite these files (``tests/test_bench_results.py``).

Record a result that a benchmark did not produce (e.g. an ``omnigraph run``'s ``summary.json``)::

    python bench/record.py NAME FILE.json      # writes bench/results/NAME-<date>.json around it
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile", "avx512_vnni")
_NAME = re.compile(r"[A-Za-z0-9_.+-]+")


def results_dir() -> Path:
    return Path(os.environ.get("OMNIGRAPH_BENCH_RESULTS") or RESULTS)


def _git(*args: str) -> str | None:
    try:
        done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def git_state() -> tuple[str | None, bool | None]:
    """``(HEAD, dirty)``: dirty when a tracked file differs from HEAD (untracked files, results included, do not
    count). ``OMNIGRAPH_GIT_REV`` / ``OMNIGRAPH_GIT_DIRTY``, when set, win: a copied working tree (the GPU
    machine's) may carry a stale ``.git``. Neither: ``(None, None)``."""
    env = os.environ.get("OMNIGRAPH_GIT_REV")
    if env:
        dirty = os.environ.get("OMNIGRAPH_GIT_DIRTY")
        return env.strip(), None if dirty is None else dirty.strip() not in ("", "0", "false")
    rev = _git("rev-parse", "HEAD")
    if rev:
        status = _git("status", "--porcelain", "--untracked-files=no")
        return rev.strip(), None if status is None else bool(status.strip())
    return None, None


def _cpuinfo() -> tuple[str | None, set[str]]:
    model, flags = None, set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "model name" and model is None:
                    model = value.strip()
                elif key == "flags" and not flags:
                    flags = set(value.split())
    except OSError:
        model = platform.processor() or None
    return model, flags


def _mem_gb() -> float | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return round(int(line.split()[1]) * 1024 / 1e9, 1)
    except (OSError, ValueError, IndexError):
        pass
    try:
        return round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9, 1)
    except (ValueError, OSError, AttributeError):
        return None


def _version(dist: str) -> str | None:
    from importlib import metadata
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        mod = sys.modules.get(dist)        # e.g. a Ray unpacked onto PYTHONPATH without its metadata
        return getattr(mod, "__version__", None)


def _gpus() -> list[dict[str, Any]]:
    try:
        import torch
        if not torch.cuda.is_available():
            return []
        out = []
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            out.append({"name": p.name, "memory_gb": round(p.total_memory / 2**30, 1)})
        return out
    except Exception:  # noqa: BLE001 - no torch, or a broken driver: record no GPU rather than fail
        return []


def machine() -> dict[str, Any]:
    """What the figures were measured on (the CPU of a shared machine can change from one day to the next)."""
    model, flags = _cpuinfo()
    try:
        affinity = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        affinity = None
    try:
        load = round(os.getloadavg()[0], 2)
    except OSError:
        load = None
    torch_version = _version("torch")
    return {"cpu_model": model, "cpu_flags": {f: f in flags for f in FLAGS},
            "cores": {"os_cpu_count": os.cpu_count(), "affinity": affinity}, "mem_gb": _mem_gb(),
            "gpus": _gpus(), "python": platform.python_version(), "torch": torch_version,
            "ray": _version("ray"), "load_avg": load}


def save(bench: str, result: dict, argv: list[str] | None = None) -> Path:
    """Write ``result`` with its provenance to ``bench/results/<bench>-<YYYYMMDD-HHMMSS>.json``; return the path."""
    if not _NAME.fullmatch(bench):
        raise ValueError(f"benchmark name {bench!r}: letters, digits and _ . + - only")
    now = _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0)
    rev, dirty = git_state()
    record = {"bench": bench, "date": now.isoformat(), "git_rev": rev, "dirty": dirty,
              "argv": list(sys.argv if argv is None else argv), "machine": machine(), "result": result}
    text = json.dumps(record, indent=2, allow_nan=False) + "\n"    # NaN is not JSON: fail here, not in a reader
    folder = results_dir()
    folder.mkdir(parents=True, exist_ok=True)
    stem = f"{bench}-{now:%Y%m%d-%H%M%S}"
    for i in range(1000):
        path = folder / (stem + (f"-{i}" if i else "") + ".json")
        try:
            with open(path, "x") as f:             # never overwrite a result
                f.write(text)
            return path
        except FileExistsError:
            continue
    raise RuntimeError(f"could not find a free file name for {stem} in {folder}")


def _stamp(bench: str, path: Path) -> tuple[str, int] | None:
    m = re.fullmatch(re.escape(bench) + r"-(\d{8}-\d{6})(?:-(\d+))?\.json", path.name)
    return (m.group(1), int(m.group(2) or 0)) if m else None


def latest(bench: str) -> dict | None:
    """The newest saved record of ``bench`` (by the date in its file name), or None."""
    folder = results_dir()
    if not folder.is_dir():
        return None
    found = [(s, p) for p in folder.glob(f"{bench}-*.json") if (s := _stamp(bench, p))]
    if not found:
        return None
    return json.loads(max(found)[1].read_text())


def add_arguments(ap) -> None:
    """``--no-save``: print the result without writing it under bench/results (smoke runs)."""
    ap.add_argument("--no-save", action="store_true", help="do not record the result under bench/results/")


def _clean(x):
    """NaN and infinities (not JSON) as None, so the printed line and the saved file hold the same values."""
    if isinstance(x, float) and (x != x or x in (float("inf"), float("-inf"))):
        return None
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    return x


def emit(bench: str, result: dict, args=None) -> Path | None:
    """The end of a benchmark: save ``result`` (unless ``args.no_save``), say where, print it as the last line."""
    result = _clean(result)
    path = None
    if not getattr(args, "no_save", False):
        try:
            path = save(bench, result)
            try:
                shown = path.relative_to(ROOT)
            except ValueError:
                shown = path
            print(f"results: {shown}", flush=True)
        except OSError as e:
            print(f"results: not saved ({type(e).__name__}: {e})", file=sys.stderr, flush=True)
    print(json.dumps(result), flush=True)
    return path


def main(argv: list[str] | None = None) -> int:
    import argparse
    ap = argparse.ArgumentParser(description="record a JSON result under bench/results/ with its provenance")
    ap.add_argument("name", help="the result's name (the file is NAME-<date>.json)")
    ap.add_argument("file", help="a JSON file holding one object (e.g. a run's summary.json)")
    a = ap.parse_args(argv)
    result = json.loads(Path(a.file).read_text())
    if not isinstance(result, dict):
        ap.error(f"{a.file} does not hold a JSON object")
    print(save(a.name, result, argv=sys.argv if argv is None else ["bench/record.py", *argv]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
