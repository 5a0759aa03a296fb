"""Prompts from data files (``task.source``), read with Hugging Face ``datasets`` from local files only.

``source`` is a file (``.jsonl``, ``.json``, ``.parquet``, ``.csv``: one split, ``train``), a folder of such
files (one split per file, named by its stem: ``train.jsonl``, ``test.jsonl``) or a folder written by
``Dataset.save_to_disk`` / ``DatasetDict.save_to_disk``. Splits can be sliced: ``train[:90%]``,
``train[90%:]``, ``train[:200]``.

Every training prompt has a place in the *data order*: position ``k`` of the run (``k = step * prompts + i``)
is row ``order(epoch)[k % rows]`` of epoch ``k // rows``, where ``order(epoch)`` is the training rows shuffled
with ``shuffle_seed + epoch`` (or the file's order). So the cursor is a function of the step: a resumed run
continues with the next unseen row, a regenerated batch gets the same rows, and the ledger can say which rows
were trained. Each prompt's ``meta`` carries ``row`` (the row's index in its split), ``epoch``, ``target``
(the ``answer`` field) and ``data`` (the whole row), for the reward.

Prompts longer than ``max_prompt_tokens`` (in the model's tokens, chat template included) are left out and
counted (``on_long: filter``) or refused (``on_long: error``); nothing is truncated.

>>> parse_split("train[:90%]", 200)
('train', 0, 180)
>>> parse_split("test[-20:]", 100)
('test', 80, 100)
"""

from __future__ import annotations

import hashlib
import os
import random
import re
import string
from pathlib import Path
from typing import Any, Callable

from omnigraph.sdk import ConfigError, Options, Prompt

from nodes.tasks.prompting import encode

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
    """sha256 over the source's files (names and bytes): a resumed run refuses data that changed."""
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
        raise ConfigError(f"cannot read '{path}': {type(e).__name__}: {str(e).splitlines()[0][:300]}",
                          where="task.source", fix="check the file is valid JSON lines / Parquet / CSV") from None


class Template:
    """``prompt``: a field name, or a template with ``{field}`` placeholders."""

    def __init__(self, text: str, columns: list[str], where: str = "task.prompt"):
        self.text = text
        fields = [f for _, f, _, _ in string.Formatter().parse(text) if f is not None]
        self.field = None if fields else text
        missing = [f for f in (fields or [text]) if f.split(".")[0].split("[")[0] not in columns]
        if missing:
            raise ConfigError(f"the rows have no field '{missing[0]}' (fields: {', '.join(columns)})", where=where,
                              fix="name one of the fields, or write a template over them like '{question}'")

    def __call__(self, row: dict[str, Any]) -> Any:
        return row[self.field] if self.field is not None else self.text.format_map(row)


def _is_messages(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(
        isinstance(m, dict) and "role" in m and "content" in m for m in value)


class DataTask:
    """A task over rows of data (the ``dataset`` task; ``task.source`` set to a path). It takes the graph's data
    fields (``task.prompt``, ``answer``, ``split``, ...) and no options of its own."""

    class Options(Options):
        """``dataset`` takes no ``task.options``: its settings are the task's data fields."""

    def __init__(self, prompts: int, seed: int = 0, eval_prompts: int = 64, *, source: str,
                 prompt: str = "prompt", answer: str | None = "answer", split: str = "train",
                 eval_split: str | None = None, shuffle_seed: int | None = 0, epochs: int | None = None,
                 max_prompt_tokens: int | None = None, on_long: str = "filter", chat: bool = False,
                 system: str | None = None, model_dir: Callable[[], Path] | None = None, model_name: str = ""):
        self.prompts, self.seed, self.eval_prompts = prompts, seed, eval_prompts
        self.shuffle_seed, self.epochs = shuffle_seed, epochs
        self.chat, self.system = chat, system
        path = resolve_source(source)
        self.source, self.fingerprint = str(path), fingerprint(path)
        splits = load_splits(path)
        self.columns = sorted({c for d in splits.values() for c in d.column_names})
        self.template = Template(prompt, self.columns)
        if answer is not None and answer not in self.columns:
            raise ConfigError(f"the rows have no field '{answer}' (fields: {', '.join(self.columns)})",
                              where="task.answer", fix="name the field holding the reference answer, or null")
        self.answer = answer
        self._tok, self._model_dir, self.model_name = None, model_dir, model_name
        self.max_prompt_tokens, self.on_long = max_prompt_tokens, on_long
        self._extent: dict[str, dict] = {}
        self.train, self.filtered = self._rows(splits, split, "task.split")
        if not self.train:
            raise ConfigError(f"split '{split}' has no usable rows", where="task.split",
                              fix="choose a split with rows (or raise task.max_prompt_tokens)")
        self.eval_rows, self.eval_filtered = ([], 0) if eval_split is None else \
            self._rows(splits, eval_split, "task.eval_split")
        self._orders: dict[int, list[int]] = {}

    # -- reading ------------------------------------------------------------------------------------
    def _rows(self, splits: dict[str, Any], spec: str, where: str) -> tuple[list[tuple[int, dict, Prompt]], int]:
        name, _, _ = parse_split(spec)
        if name not in splits:
            raise ConfigError(f"no split '{name}' in {self.source} (splits: {', '.join(splits)})", where=where,
                              fix=f"use one of {', '.join(splits)}, sliced if needed (e.g. {next(iter(splits))}[:90%])")
        data = splits[name]
        _, start, stop = parse_split(spec, len(data))
        rows, long = [], []
        for i in range(start, stop):
            row = data[i]
            p = self._prompt(i, row)
            n = self._length(p)
            if n is not None and n > self.max_prompt_tokens:
                long.append((i, n))
                continue
            rows.append((i, row, p))
        if long and self.on_long == "error":
            i, n = long[0]
            raise ConfigError(f"{len(long)} prompt(s) of split '{spec}' are longer than max_prompt_tokens = "
                              f"{self.max_prompt_tokens} (row {i}: {n} tokens)", where="task.max_prompt_tokens",
                              fix="raise task.max_prompt_tokens, or set task.on_long: filter to leave them out")
        self._extent[where] = {"range": [start, stop], "left_out": [i for i, _ in long]}
        return rows, len(long)

    def _prompt(self, i: int, row: dict[str, Any]) -> Prompt:
        value = self.template(row)
        meta = {"row": i, "data": row}
        if self.answer is not None:
            meta["target"] = str(row[self.answer])
        if _is_messages(value):
            msgs = [{"role": str(m["role"]), "content": str(m["content"])} for m in value]
            if self.system and msgs[0]["role"] != "system":
                msgs.insert(0, {"role": "system", "content": self.system})
            user = [m["content"] for m in msgs if m["role"] == "user"]
            return Prompt(user[-1] if user else msgs[-1]["content"], meta, chat=True, messages=msgs)
        if not isinstance(value, str):
            raise ConfigError(f"row {i}'s prompt is a {type(value).__name__}, not text or chat messages",
                              where="task.prompt", fix="name a text field, a list of {role, content} messages, "
                                                       "or write a template like '{question}'")
        return Prompt(value, meta, chat=self.chat, system=self.system)

    def _length(self, p: Prompt) -> int | None:
        if self.max_prompt_tokens is None:
            return None
        if self._tok is None:
            if self._model_dir is None:
                raise ConfigError("task.max_prompt_tokens needs the model's tokenizer", where="task.max_prompt_tokens")
            from transformers import AutoTokenizer      # heavy: only a length limit needs the tokenizer
            self._tok = AutoTokenizer.from_pretrained(str(self._model_dir()))
        return len(encode(self._tok, p, self.model_name))

    # -- the data order ------------------------------------------------------------------------------
    def order(self, epoch: int) -> list[int]:
        """Indices into the training rows, in the order epoch ``epoch`` visits them."""
        if epoch not in self._orders:
            idx = list(range(len(self.train)))
            if self.shuffle_seed is not None:
                random.Random(f"{self.shuffle_seed}:{epoch}").shuffle(idx)
            self._orders = {epoch: idx}          # one epoch at a time: batches move forward
        return self._orders[epoch]

    def cursor(self, step: int) -> dict[str, int]:
        """Where the data order stands before step ``step``: epoch and position in it."""
        k = step * self.prompts
        return {"epoch": k // len(self.train), "position": k % len(self.train), "rows": len(self.train)}

    def batch(self, step: int) -> list[Prompt]:
        out = []
        for k in range(step * self.prompts, (step + 1) * self.prompts):
            epoch, pos = divmod(k, len(self.train))
            if self.epochs is not None and epoch >= self.epochs:
                raise ConfigError(f"step {step} needs epoch {epoch + 1} of the data but task.epochs = {self.epochs}",
                                  where="task.epochs", fix="raise task.epochs or lower schedule.iterations")
            _, _, p = self.train[self.order(epoch)[pos]]
            out.append(Prompt(p.text, {**p.meta, "epoch": epoch}, chat=p.chat, system=p.system,
                              messages=p.messages))
        return out

    def eval_set(self) -> list[Prompt]:
        return [p for _, _, p in self.eval_rows[:self.eval_prompts]]

    def steps_available(self) -> int | None:
        """Training steps the data allows (None: unbounded)."""
        return None if self.epochs is None else self.epochs * len(self.train) // self.prompts

    def describe(self) -> dict[str, Any]:
        """What ``data.json`` keeps and the run prints; ``split``: the training rows' index range in their split
        and the rows left out as too long (the ledger counts the rows never reached from it)."""
        return {"source": self.source, "fingerprint": self.fingerprint, "rows": len(self.train),
                "split": self._extent["task.split"],
                "filtered": self.filtered, "eval_rows": len(self.eval_rows[:self.eval_prompts]),
                "eval_filtered": self.eval_filtered, "epochs": self.epochs,
                "steps_per_epoch": len(self.train) / self.prompts}
