"""Reading prompts' data from local files: the source's path and fingerprint, its splits (with Hugging Face
``datasets``, never the hub), a broken JSON line named by its line, the model's context length.

>>> parse_split("train[:90%]", 200)
('train', 0, 180)
>>> parse_split("test[-20:]", 100)
('test', 80, 100)
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any

from omnigraph.sdk import ConfigError


FILE_TYPES = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}
_SPLIT = re.compile(r"^([A-Za-z0-9_.\-]+)(?:\[\s*(-?\d+%?)?\s*:\s*(-?\d+%?)?\s*\])?$")


def parse_split(spec: str, rows: int | None = None) -> tuple[str, int | None, int | None]:
    """``name[a:b]`` -> (name, start, stop) with percentages and negative bounds resolved against ``rows``."""
    m = _SPLIT.match(spec.strip())
    if not m:
        raise ConfigError(f"'{spec}' is not a split", where="task.split",
                          fix="write a split name, optionally sliced: train, train[:90%], train[100:]")
    name, a, b = m.groups()

    def bound(x: str | None, default: int | None) -> int | None:
        if x is None or rows is None:
            return default
        v = round(rows * int(x[:-1]) / 100) if x.endswith("%") else int(x)
        return max(0, min(rows, v + rows if v < 0 else v))
    return name, bound(a, 0), bound(b, rows)


def fingerprint(path: Path) -> str:
    """sha256 over the source's files (names and bytes): a resumed run refuses data that changed.

    This is all ``--resume`` compares (``data.json``'s ``fingerprint``): any edit, a row added, removed or
    reordered, an id changed, is refused. The ids themselves (``id_field``) are not compared apart: they are
    read from the same bytes, and the run's ``config.yaml`` names the same ``id_field``."""
    h = hashlib.sha256()
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    for f in files:
        h.update(str(f.relative_to(path) if path.is_dir() else f.name).encode())
        with open(f, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()[:16]


def resolve_source(source: str) -> Path:
    p = Path(source).expanduser()
    if not p.is_absolute():
        p = Path(os.environ.get("OMNIGRAPH_WORKDIR", os.getcwd())) / p
    if not p.exists():
        raise ConfigError(f"no such file or folder '{source}' (looked at {p})", where="task.source",
                          fix="give the path of a .jsonl/.json/.parquet/.csv file or a dataset folder, relative to "
                              "the directory omnigraph runs in (or absolute)")
    return p


def load_splits(path: Path) -> dict[str, Any]:
    """The source's splits as ``datasets.Dataset`` objects, read from local files only."""
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import datasets                       # heavy (~1.5 s): only data tasks pay for it
    datasets.disable_progress_bars()
    verbosity = datasets.logging.get_verbosity()
    datasets.logging.set_verbosity(datasets.logging.CRITICAL)     # its own log of a bad file: we say it, once
    data_files: dict[str, str] = {}
    try:
        if path.is_dir() and ((path / "dataset_dict.json").exists() or (path / "state.json").exists()):
            loaded = datasets.load_from_disk(str(path))
            return dict(loaded) if isinstance(loaded, datasets.DatasetDict) else {"train": loaded}
        if path.is_dir():
            files = {f.stem: f for f in sorted(path.iterdir()) if f.suffix in FILE_TYPES}
            if not files:
                raise ConfigError(f"folder '{path}' holds no .jsonl/.json/.parquet/.csv file and no saved dataset",
                                  where="task.source", fix="point task.source at a data file or a dataset folder")
            kinds = {FILE_TYPES[f.suffix] for f in files.values()}
            if len(kinds) > 1:
                raise ConfigError(f"folder '{path}' mixes file types ({', '.join(sorted(kinds))})",
                                  where="task.source", fix="keep one file type per dataset folder")
            data_files = {k: str(v) for k, v in files.items()}
        elif path.suffix in FILE_TYPES:
            kinds, data_files = {FILE_TYPES[path.suffix]}, {"train": str(path)}
        else:
            raise ConfigError(f"'{path.name}' is not a data file omnigraph reads", where="task.source",
                              fix="use .jsonl, .json, .parquet or .csv, or a folder made by save_to_disk")
        loaded = datasets.load_dataset(kinds.pop(), data_files=data_files, keep_in_memory=True)
        return dict(loaded)
    except ConfigError:
        raise
    except Exception as e:  # noqa: BLE001 - a file datasets cannot read is the user's to fix
        for f in data_files.values():
            bad = broken_json(Path(f)) if Path(f).suffix in (".jsonl", ".json") else None
            if bad is not None:
                raise ConfigError(bad[0], where="task.source", fix=bad[1]) from None
        raise ConfigError(f"cannot read '{path}': {type(e).__name__}: {(str(e).splitlines() or [''])[0][:300]}",
                          where="task.source", fix="check the file is valid JSON lines / Parquet / CSV") from None
    finally:
        datasets.logging.set_verbosity(verbosity)


def broken_json(path: Path, shown: int = 60) -> tuple[str, str] | None:
    """``(message, fix)`` naming the first line of a ``.jsonl``/``.json`` file that is not JSON (its number,
    1-based, counting every line, and its first ``shown`` characters), or None where every line reads.

    JSON lines (a file whose first line is a JSON object of its own) are read line by line, each a JSON object;
    any other ``.json`` file as one document, the line being where the document breaks.

    >>> import tempfile
    >>> f = Path(tempfile.mkdtemp()) / "rows.jsonl"
    >>> _ = f.write_text('{"q": "a", "a": "1"}\\n\\n{"q": "b" "a": "2"}\\n')
    >>> print(broken_json(f)[0])  # doctest: +ELLIPSIS
    cannot read '.../rows.jsonl': line 3 is not JSON (Expecting ',' delimiter at column 11): {"q": "b" "a": "2"}
    """
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        n = raw.count(b"\n", 0, e.start) + 1
        start = raw.rfind(b"\n", 0, e.start) + 1
        line = raw[start:raw.find(b"\n", start) if b"\n" in raw[start:] else len(raw)]
        return (f"cannot read '{path}': line {n} is not UTF-8 text: {_start(line.decode('utf-8', 'replace'), shown)}",
                f"save {path.name} as UTF-8")
    lines = text.split("\n")

    def bad(n: int, why: str) -> tuple[str, str]:
        return (f"cannot read '{path}': line {n} is {why}: {_start(lines[n - 1], shown)}",
                f"correct or remove line {n}: a file of JSON lines holds one JSON object per line" if by_line else
                f"correct line {n}: the file is one JSON document (a list of rows), or JSON lines")
    first = next((ln for ln in lines if ln.strip()), "")
    try:
        by_line = path.suffix == ".jsonl" or isinstance(json.loads(first), dict)
    except json.JSONDecodeError:
        by_line = False
    if not by_line:
        try:
            json.loads(text)
            return None                                   # one document that reads: datasets failed otherwise
        except json.JSONDecodeError as e:
            return bad(e.lineno, f"not JSON ({e.msg} at column {e.colno})")
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as e:
            return bad(n, f"not JSON ({e.msg} at column {e.colno})")
        if not isinstance(value, dict):
            return bad(n, f"not a JSON object but {type(value).__name__ if value is not None else 'null'}")
    return None


def _start(line: str, shown: int) -> str:
    """The first ``shown`` characters of a line, on one line of text."""
    line = "".join(c if c.isprintable() else " " for c in line.rstrip("\r"))
    return line[:shown] + ("..." if len(line) > shown else "")


def context_length(model_dir: Path) -> int | None:
    """The model's context in tokens (``max_position_embeddings`` of its ``config.json``), or None if it says none."""
    try:
        config = json.loads((Path(model_dir) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    for cfg in (config, config.get("text_config") or {}):
        for key in ("max_position_embeddings", "n_positions", "max_sequence_length"):
            v = cfg.get(key)
            if isinstance(v, int) and not isinstance(v, bool) and v > 0:
                return v
    return None


def blank(value: Any) -> bool:
    """No content: None, a blank string, an empty list or mapping, a list of messages all without content."""
    if value is None:
        return True
    if isinstance(value, str):
        return not value.strip()
    if isinstance(value, dict):
        return not value
    if isinstance(value, (list, tuple)):
        return all(isinstance(m, dict) and blank(m.get("content")) for m in value)
    return False
