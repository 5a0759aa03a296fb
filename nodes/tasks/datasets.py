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
(the ``answer`` field), ``data`` (the whole row) and, where the rows have one (``id_field``), ``id`` (the row's
own id, as a string), for the reward and the ledger.

Rows without a prompt or an answer (the field absent or null, or empty) are left out and counted
(``on_missing: filter``) or refused (``on_missing: error``). Prompts longer than ``max_prompt_tokens`` (in the
model's tokens, chat template included; by default the model's context minus the graph's largest
``max_new_tokens``) are left out and counted (``on_long: filter``) or refused (``on_long: error``); nothing is
truncated.

With ``image`` (the field holding each row's pictures, for an image-text model: :mod:`nodes.tasks.pictures`)
every picture is read and checked when the task is built, and travels with its prompt (``Prompt.images``); a
row whose picture field is absent, null or empty counts as missing.
"""
from __future__ import annotations

import random
import string
from pathlib import Path
from typing import Any, Callable

from omnigraph.sdk import ConfigError, Options, Prompt

from nodes.tasks.files import parse_split, fingerprint, resolve_source, load_splits, context_length, blank
from nodes.models.vision import processor
from nodes.tasks import pictures
from nodes.tasks.prompting import lengths, picture_lengths


class Template:
    """``prompt``: a field name, or a template with ``{field}`` placeholders."""

    def __init__(self, text: str, columns: list[str], where: str = "task.prompt"):
        self.text = text
        fields = [f for _, f, _, _ in string.Formatter().parse(text) if f is not None]
        self.field = None if fields else text
        self.names = list(dict.fromkeys(f.split(".")[0].split("[")[0] for f in (fields or [text])))
        """The fields the prompt reads."""
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
    fields (``task.prompt``, ``answer``, ``split``, ...) and no options of its own; ``max_new_tokens`` (the
    graph's largest, over the generators that run a model) sets the default prompt limit with the model's
    context."""

    class Options(Options):
        """``dataset`` takes no ``task.options``: its settings are the task's data fields."""

    def __init__(self, prompts: int, seed: int = 0, eval_prompts: int = 64, *, source: str,
                 prompt: str = "prompt", answer: str | None = "answer", split: str = "train",
                 eval_split: str | None = None, shuffle_seed: int | None = 0, epochs: int | None = None,
                 max_prompt_tokens: int | None = None, on_long: str = "filter", on_missing: str = "filter",
                 id_field: str | None = "id", chat: bool = False, system: str | None = None,
                 model_dir: Callable[[], Path] | None = None, model_name: str = "",
                 max_new_tokens: int | None = None, image: str | None = None,
                 max_image_pixels: int = 4096 * 4096):
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
        if id_field is not None and id_field not in self.columns:
            if id_field != "id":                    # the default applies where the rows have an id
                raise ConfigError(f"the rows have no field '{id_field}' (fields: {', '.join(self.columns)})",
                                  where="task.id_field", fix="name the field holding each row's id, or null to "
                                                             "know rows by their position")
            id_field = None
        self.answer, self.id_field = answer, id_field
        if image is not None and image not in self.columns:
            raise ConfigError(f"the rows have no field '{image}' (fields: {', '.join(self.columns)})",
                              where="task.image", fix="name the field holding each row's picture path(s), or null")
        self.image, self.max_image_pixels = image, max_image_pixels
        self.base = path if path.is_dir() else path.parent      # where relative picture paths start
        self._tok, self._model_dir, self._dir, self.model_name = None, model_dir, None, model_name
        self.max_prompt_tokens, self.on_long, self.on_missing = max_prompt_tokens, on_long, on_missing
        self.limit = self._limit(max_new_tokens)
        self._extent: dict[str, dict] = {}
        self.train, self.filtered, self.missing = self._rows(splits, split, "task.split")
        if not self.train:
            raise ConfigError(f"split '{split}' has no usable rows", where="task.split",
                              fix="choose a split with rows (or raise task.max_prompt_tokens; or give the rows "
                                  "a prompt and an answer)")
        self.eval_rows, self.eval_filtered, self.eval_missing = ([], 0, 0) if eval_split is None else \
            self._rows(splits, eval_split, "task.eval_split")
        self._orders: dict[int, list[int]] = {}

    # -- reading ------------------------------------------------------------------------------------
    def _rows(self, splits: dict[str, Any], spec: str, where: str
              ) -> tuple[list[tuple[int, dict, Prompt]], int, int]:
        """The usable rows of split ``spec`` as ``(index, row, prompt)``, and the counts of those left out as too
        long and as missing a prompt or answer."""
        name, _, _ = parse_split(spec)
        if name not in splits:
            raise ConfigError(f"no split '{name}' in {self.source} (splits: {', '.join(splits)})", where=where,
                              fix=f"use one of {', '.join(splits)}, sliced if needed (e.g. {next(iter(splits))}[:90%])")
        data = splits[name]
        _, start, stop = parse_split(spec, len(data))
        read, missing = [], []
        for i in range(start, stop):
            row = data[i]
            gap = self._missing(row)
            value = None
            if gap is None:
                value = self.template(row)
                if blank(value):
                    gap = ("prompt", "the template gives an empty prompt" if self.template.field is None
                           else f"field '{self.template.field}' is empty")
            if gap is not None:
                missing.append((i, row, gap))
                continue
            read.append((i, row, self._prompt(i, row, value)))
        if missing and self.on_missing == "error":
            i, row, (kind, why) = missing[0]
            raise ConfigError(f"row {i}{self._named(row)} of split '{spec}' has no {kind}: {why} ({len(missing)} "
                              f"row(s) of the split have no prompt or answer)", where=f"task.{kind}",
                              fix=f"fill in the rows' {kind}, or set task.on_missing: filter to leave them out")
        sizes = self._lengths([p for _, _, p in read]) if self.limit else []
        long = [(i, n) for (i, _, _), n in zip(read, sizes) if n > self.limit["tokens"]]
        if long and self.on_long == "error":
            i, n = long[0]
            raise ConfigError(f"{len(long)} prompt(s) of split '{spec}' are longer than {self._said()} (row {i}: {n} "
                              "tokens)", where="task.max_prompt_tokens",
                              fix="raise task.max_prompt_tokens, or set task.on_long: filter to leave them out"
                              if self.max_prompt_tokens is not None else "shorten them, lower the generator's "
                              "max_new_tokens or set task.max_prompt_tokens; or set task.on_long: filter to leave "
                              "them out")
        too_long = {i for i, _ in long}
        rows = [r for r in read if r[0] not in too_long]
        self._check_ids(rows, spec)
        out = sorted(too_long | {i for i, _, _ in missing})
        self._extent[where] = {"range": [start, stop], "left_out": out}
        if self.id_field is not None:
            ids: list[str | None] = [None] * (stop - start)
            for i, _, p in rows:
                ids[i - start] = p.meta["id"]
            self._extent[where]["ids"] = ids
        return rows, len(long), len(missing)

    def _missing(self, row: dict[str, Any]) -> tuple[str, str] | None:
        """``(kind, why)`` where the row has no prompt or answer (a field absent, null or empty), else None."""
        for f in self.template.names:
            if row.get(f) is None:
                return "prompt", f"field '{f}' is {'null' if f in row else 'absent'}"
        if self.image is not None and (row.get(self.image) is None or blank(row.get(self.image))):
            return "image", f"field '{self.image}' is {'absent' if self.image not in row else 'empty or null'}"
        if self.answer is not None:
            a = row.get(self.answer)
            if a is None:
                return "answer", f"field '{self.answer}' is {'null' if self.answer in row else 'absent'}"
            if blank(a):
                return "answer", f"field '{self.answer}' is empty"
        return None

    def _named(self, row: dict[str, Any]) -> str:
        v = row.get(self.id_field) if self.id_field is not None else None
        return f" ({self.id_field} '{v}')" if v is not None else ""

    def _check_ids(self, rows: list[tuple[int, dict, Prompt]], spec: str) -> None:
        """Every usable row has an id, and no two the same: the ledger names rows by them."""
        if self.id_field is None:
            return
        seen: dict[str, int] = {}
        for i, _, p in rows:
            rid = p.meta.get("id")
            if rid is None:
                raise ConfigError(f"row {i} of split '{spec}' has no {self.id_field} (null or empty)",
                                  where="task.id_field", fix=f"give every row its {self.id_field}, or set "
                                  "task.id_field: null to know rows by their position")
            if rid in seen:
                raise ConfigError(f"rows {seen[rid]} and {i} of split '{spec}' have the same {self.id_field} "
                                  f"'{rid}'", where="task.id_field", fix="make the ids unique, name a field of "
                                  "unique values, or set task.id_field: null to know rows by their position")
            seen[rid] = i

    def _prompt(self, i: int, row: dict[str, Any], value: Any) -> Prompt:
        shown = () if self.image is None else pictures.read(row[self.image], self.base, f"row {i}{self._named(row)}",
                                                             self.max_image_pixels)
        if shown:
            row = {k: v for k, v in row.items() if k != self.image}      # meta keeps the row's text, not its pictures
        meta = {"row": i, "data": row}
        if self.answer is not None:
            meta["target"] = str(row[self.answer])
        if self.id_field is not None:
            rid = row.get(self.id_field)
            if rid is not None and not blank(rid):
                meta["id"] = str(rid)
        if _is_messages(value):
            msgs = [{"role": str(m["role"]), "content": str(m["content"])} for m in value]
            if self.system and msgs[0]["role"] != "system":
                msgs.insert(0, {"role": "system", "content": self.system})
            user = [m["content"] for m in msgs if m["role"] == "user"]
            msgs = pictures.into_messages(msgs, len(shown)) if shown else msgs
            return Prompt(user[-1] if user else msgs[-1]["content"], meta, chat=True, messages=msgs, images=shown)
        if not isinstance(value, str):
            raise ConfigError(f"row {i}'s prompt is a {type(value).__name__}, not text or chat messages",
                              where="task.prompt", fix="name a text field, a list of {role, content} messages, "
                                                       "or write a template like '{question}'")
        if shown and self.chat:
            head = [{"role": "system", "content": self.system}] if self.system else []
            msgs = pictures.into_messages(head + [{"role": "user", "content": value}], len(shown))
            return Prompt(value, meta, chat=True, messages=msgs, images=shown)
        return Prompt(pictures.place(value, len(shown)) if shown else value, meta, chat=self.chat, system=self.system,
                      images=shown)

    # -- the prompt limit --------------------------------------------------------------------------
    def _model(self) -> Path:
        if self._dir is None:
            if self._model_dir is None:
                raise ConfigError("task.max_prompt_tokens needs the model's tokenizer", where="task.max_prompt_tokens")
            self._dir = Path(self._model_dir())
        return self._dir

    def _tokenizer(self):
        if self._tok is None:                           # loaded once, for every row of every split
            from transformers import AutoTokenizer      # heavy: only a length limit needs the tokenizer
            self._tok = AutoTokenizer.from_pretrained(str(self._model()))
        return self._tok

    def _lengths(self, prompts: list[Prompt]) -> list[int]:
        """Each prompt's length in the model's tokens; a picture counts the image tokens it expands to."""
        if self.image is None:
            return lengths(self._tokenizer(), prompts, self.model_name)
        proc = processor(self._model())
        return picture_lengths(self._tokenizer(), proc, prompts, self.model_name)

    def _limit(self, max_new_tokens: int | None) -> dict[str, int] | None:
        """The longest prompt in tokens: ``max_prompt_tokens``; else the model's context less the graph's largest
        ``max_new_tokens`` (where both are known); else none."""
        if self.max_prompt_tokens is not None:
            return {"tokens": self.max_prompt_tokens}
        if max_new_tokens is None or self._model_dir is None:
            return None
        context = context_length(self._model())
        if context is None:
            return None
        if context - max_new_tokens < 1:
            raise ConfigError(f"max_new_tokens {max_new_tokens} leaves no room for a prompt in the model's context "
                              f"of {context} tokens", where="task.max_prompt_tokens",
                              fix=f"lower the generator's max_new_tokens below {context}")
        return {"tokens": context - max_new_tokens, "context": context, "max_new_tokens": max_new_tokens}

    def _said(self) -> str:
        lim = self.limit or {}
        if "context" in lim:
            return (f"the model's context {lim['context']} - max_new_tokens {lim['max_new_tokens']} = "
                    f"{lim['tokens']} tokens")
        return f"max_prompt_tokens = {lim.get('tokens')}"

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
                              messages=p.messages, images=p.images))
        return out

    def eval_set(self) -> list[Prompt]:
        return [p for _, _, p in self.eval_rows[:self.eval_prompts]]

    def steps_available(self) -> int | None:
        """Training steps the data allows (None: unbounded)."""
        return None if self.epochs is None else self.epochs * len(self.train) // self.prompts

    def describe(self) -> dict[str, Any]:
        """What ``data.json`` keeps and the run prints. ``split``: the training rows' index range in their split,
        the rows left out (too long, or without a prompt or answer) and, with ``id_field``, the id of each row of
        the range (None where left out): the ledger counts the rows never reached from it and names them.
        ``filtered`` / ``missing``: rows left out as too long / as missing a prompt or answer (``eval_``: of the
        held-out split); ``limit``: the prompt limit in ``tokens`` and, when it is the default, the model's
        ``context`` and the ``max_new_tokens`` it leaves room for."""
        return {"source": self.source, "fingerprint": self.fingerprint, "rows": len(self.train),
                "split": self._extent["task.split"], "id_field": self.id_field,
                "filtered": self.filtered, "missing": self.missing, "limit": self.limit,
                "eval_rows": len(self.eval_rows[:self.eval_prompts]),
                "eval_filtered": self.eval_filtered, "eval_missing": self.eval_missing, "epochs": self.epochs,
                "steps_per_epoch": len(self.train) / self.prompts}
