"""reasoning-gym tasks (``task.source: reasoning_gym``) and their verifier (reward ``reasoning_gym``).

`reasoning-gym <https://pypi.org/project/reasoning-gym/>`_ generates verifiable reasoning problems
procedurally (``chain_sum``, ``basic_arithmetic``, ``word_sorting``, ... about a hundred), each scored by its
dataset's own ``score_answer(answer, entry)``. Item ``k`` of a dataset is a function of its seed and ``k``, so
the stream is endless and deterministic: training position ``k = step * prompts + i`` is item ``k`` (the cursor
is the step, like every omnigraph task). One question in ``HOLD_OUT`` (by a hash of its text) is held out:
training skips those, the eval set is made only of them, so the two never share a question.

``fewshot: k`` puts k solved items before each question as earlier chat turns (their replies written by
``fewshot_answer``), drawn once from a part of the stream that training and evaluation never reach; their
questions are never held out, and training skips them too, so no example is ever trained on or evaluated.

The reward ``reasoning_gym`` reads the answer as reasoning-gym's own pipeline does (``extract_answer``: the
last ``<answer>...</answer>``; a reply without the tags, or without the closing one, has no answer and scores
0.0) and returns the dataset's score of it (1.0 = correct). ``reasoning_gym_lenient`` takes the whole reply,
stripped, where there are no tags: many datasets then give partial credit (the right number inside a
sentence scores 0.17-0.33 on ``basic_arithmetic``), a gentler signal than the library's own evaluation gives.

>>> task = ReasoningGymTask(prompts=2, dataset="chain_sum", config={"min_terms": 2, "max_terms": 2})
>>> [p.meta["target"] for p in task.batch(0)] == [p.meta["data"]["answer"] for p in task.batch(0)]
True
>>> entry = task.batch(0)[0].meta
>>> reasoning_gym(task.batch(0)[0].text, f"<answer>{entry['target']}</answer>", **entry)
1.0
>>> reasoning_gym(task.batch(0)[0].text, entry["target"], **entry), reasoning_gym_lenient(task.batch(0)[0].text, entry["target"], **entry)
(0.0, 1.0)
"""

from __future__ import annotations

import difflib
import json
import zlib
from functools import lru_cache
from typing import Any

from pydantic import Field

from omnigraph.sdk import ConfigError, Options, Prompt

HOLD_OUT = 10
OFFSET = 10 ** 12          # where a held-out position looks for its replacement (item k + j * OFFSET)
SIZE = 10 ** 15
SHOTS = SIZE // 4           # where the few-shot examples come from (training reads from 0, eval from SIZE // 2)


@lru_cache(maxsize=16)
def _dataset(name: str, config_json: str, seed: int):
    import reasoning_gym as rg          # heavy (~1.5 s): only reasoning-gym tasks pay for it
    from reasoning_gym.factory import DATASETS
    if name not in DATASETS:
        close = difflib.get_close_matches(name, list(DATASETS), n=3)
        hint = f"did you mean {' or '.join(repr(c) for c in close)}? " if close else ""
        raise ConfigError(f"reasoning-gym has no dataset '{name}' ({hint}{len(DATASETS)} datasets, e.g. "
                          f"{', '.join(sorted(DATASETS)[:5])})", where="task.options.dataset",
                          fix="name a reasoning-gym dataset (python -c 'import reasoning_gym.factory as f; "
                              "print(sorted(f.DATASETS))')")
    try:
        return rg.create_dataset(name, seed=seed, size=SIZE, **json.loads(config_json))
    except (TypeError, ValueError, AssertionError) as e:
        raise ConfigError(f"reasoning-gym rejected the configuration of '{name}': {e}", where="task.options.config",
                          fix=f"use the fields of {DATASETS[name][1].__name__} with valid values") from None


def _held_out(question: str) -> bool:
    return zlib.crc32(question.encode()) % HOLD_OUT == 0


class ReasoningGymTask:
    chat = False

    class Options(Options):
        """``task.options`` of ``reasoning_gym`` (``task.source: reasoning_gym``)."""

        dataset: str
        """The reasoning-gym dataset (``chain_sum``, ``basic_arithmetic``, ...)."""
        config: dict[str, Any] = {}
        """The dataset's configuration (e.g. ``{min_terms: 2, max_terms: 2}``)."""
        fewshot: int = Field(0, ge=0, le=64)
        """Solved examples shown before each question, as earlier turns of a chat (drawn once from a part of the
        stream training never reaches; the prompt then goes through the chat template). Small models learn the
        expected answer format from them."""
        fewshot_answer: str = "{answer}"
        """The examples' replies: a template over the item (``{answer}``, ``{metadata[expression]}``), e.g.
        ``"{metadata[expression]} = {answer}\n<answer>{answer}</answer>"``."""

    def __init__(self, prompts: int, seed: int = 0, eval_prompts: int = 64, *, dataset: str,
                 config: dict[str, Any] | None = None, prompt: str = "{question}", chat: bool = False,
                 system: str | None = None, fewshot: int = 0, fewshot_answer: str = "{answer}"):
        self.prompts, self.seed, self.eval_prompts = prompts, seed, eval_prompts
        self.name, self.config = dataset, dict(config or {})
        self.template = prompt if prompt != "prompt" else "{question}"    # "prompt": the data default
        self.chat, self.system = chat, system
        self.data = _dataset(dataset, json.dumps(self.config, sort_keys=True), seed)
        self._eval: list[Prompt] | None = None
        self.shots: list[dict[str, str]] = []
        for where, template in (("task.prompt", self.template), ("task.options.fewshot_answer", fewshot_answer)):
            try:
                template.format_map(self.data[0])
            except (KeyError, IndexError, ValueError) as e:
                raise ConfigError(f"the template names {e}, which reasoning-gym items do not have (they have "
                                  f"question, answer, metadata: {', '.join(self.data[0]['metadata'])})", where=where,
                                  fix="write a template over {question}, {answer} or {metadata[...]}, e.g. "
                                      "'{question} Reply with the answer only.'") from None
        self._shown: set[str] = set()                  # the examples' questions, which training skips
        j = SHOTS
        while len(self.shots) < 2 * fewshot:          # user/assistant turns, from where training never goes
            item = self.data[j]
            if not _held_out(item["question"]) and item["question"] not in self._shown:
                self._shown.add(item["question"])
                self.shots += [{"role": "user", "content": self.template.format_map(item)},
                               {"role": "assistant", "content": fewshot_answer.format_map(item)}]
            j += 1

    def _prompt(self, index: int, item: dict[str, Any]) -> Prompt:
        meta = {"row": index, "target": str(item["answer"]), "data": item,
                "rg": {"dataset": self.name, "config": self.config, "seed": self.seed}}
        text = self.template.format_map(item)
        if not self.shots:
            return Prompt(text, meta, chat=self.chat, system=self.system)
        head = [{"role": "system", "content": self.system}] if self.system else []
        return Prompt(text, meta, chat=True, system=self.system,
                      messages=head + self.shots + [{"role": "user", "content": text}])

    def _train_item(self, k: int) -> tuple[int, dict]:
        j = k
        while True:
            item = self.data[j]
            if not _held_out(item["question"]) and item["question"] not in self._shown:
                return j, item
            j += OFFSET

    def batch(self, step: int) -> list[Prompt]:
        out = []
        for k in range(step * self.prompts, (step + 1) * self.prompts):
            index, item = self._train_item(k)
            p = self._prompt(index, item)
            out.append(Prompt(p.text, {**p.meta, "epoch": 0}, chat=p.chat, system=p.system, messages=p.messages))
        return out

    def eval_set(self) -> list[Prompt]:
        if self._eval is None:
            seen, out, j = set(), [], SIZE // 2
            while len(out) < self.eval_prompts and j < SIZE // 2 + 1000 * max(self.eval_prompts, 1):
                item = self.data[j]
                if _held_out(item["question"]) and item["question"] not in seen:
                    seen.add(item["question"])
                    out.append(self._prompt(j, item))
                j += 1
            self._eval = out
        return self._eval

    def cursor(self, step: int) -> dict[str, int]:
        return {"epoch": 0, "position": step * self.prompts, "rows": None}

    def steps_available(self) -> int | None:
        return None

    def describe(self) -> dict[str, Any]:
        return {"source": "reasoning_gym", "dataset": self.name, "config": self.config, "seed": self.seed,
                "fingerprint": f"{self.name}:{zlib.crc32(json.dumps(self.config, sort_keys=True).encode()):08x}:"
                               f"{self.seed}",
                "rows": None, "filtered": 0, "eval_rows": len(self.eval_set()), "held_out": f"1 in {HOLD_OUT}",
                "fewshot": len(self.shots) // 2}


def extract(completion: str) -> str | None:
    """The answer as reasoning-gym's own pipeline reads it: inside the last ``<answer>...</answer>``, else None."""
    from reasoning_gym.utils import extract_answer
    return extract_answer(completion)


def extract_lenient(completion: str) -> str:
    """The answer inside the last ``<answer>...</answer>``, else the whole reply, stripped."""
    tagged = extract(completion)
    return tagged if tagged is not None else completion.strip()


def _score(answer: str | None, rg: dict, data: dict) -> float:
    ds = _dataset(rg["dataset"], json.dumps(rg["config"], sort_keys=True), rg["seed"])
    return float(ds.score_answer(answer, data))


def reasoning_gym(prompt: str, completion: str, *, rg: dict, data: dict, **meta) -> float:
    """The reasoning-gym dataset's own score of the reply, read as the library reads it (registered reward
    ``reasoning_gym``): no ``<answer>`` tags, no answer, 0.0."""
    return _score(extract(completion), rg, data)


def reasoning_gym_lenient(prompt: str, completion: str, *, rg: dict, data: dict, **meta) -> float:
    """The dataset's score of the tagged answer, or of the whole reply where it has no tags (registered reward
    ``reasoning_gym_lenient``: partial credit for a right answer outside the tags)."""
    return _score(extract_lenient(completion), rg, data)
