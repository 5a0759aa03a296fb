"""Fuzz ``omnigraph check --json``: mutated copies of the shipped graphs, each under a time limit.

Every document must be answered by ``main(["check", PATH, "--json"])`` in-process with exactly one
JSON line on stdout (``valid`` true with exit code 0, or false with 1), within ``time_limit_s``.
An exception escaping ``main()`` is a *traceback*; a document still running at its time limit is
cut by SIGALRM and counted as a *hang*; anything else wrong with the answer is *bad output*.

The mutations: the line edits of ``bench/faults.py`` (delete, duplicate, a hostile value, a stray
character), hostile values (alias bombs, recursive aliases, huge and odd numbers, deep nesting,
tags, unicode, long strings and lists, merge keys), edits of the parsed document (a random field
set to a hostile Python value), and whole-document edits (several documents, directives, a BOM,
truncation, bytes that are not UTF-8).

    python bench/fuzzcheck.py [--cases 1000] [--time-limit 5] [--seed 0]

Prints the offending documents, then one JSON line (last). ``bench/faults.py`` runs ``fuzz``.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import random
import signal
import sys
import tempfile
import time
import traceback
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

EXAMPLES = 5
"""The offending documents kept (each cut to ``EXAMPLE_CHARS``)."""
EXAMPLE_CHARS = 2000


class _Hang(BaseException):
    """Raised by the SIGALRM handler at the time limit. A BaseException, so that no ``except Exception``
    in the code under test takes it for an error of its own."""


@contextlib.contextmanager
def time_limit(seconds: float):
    """Raise ``_Hang`` in the main thread if the body runs longer than ``seconds`` (ITIMER_REAL + SIGALRM).

    The timer is one-shot and always cancelled; the previous SIGALRM handler is put back, and a timer
    someone else had running (e.g. pytest-timeout's signal method) is set again to what it had left.
    Main thread only, as every signal handler.
    """
    armed = [True]

    def on_alarm(signum, frame):
        if armed[0]:
            armed[0] = False
            raise _Hang()

    previous = signal.signal(signal.SIGALRM, on_alarm)
    start = time.monotonic()
    outer = (0.0, 0.0)
    try:
        outer = signal.setitimer(signal.ITIMER_REAL, seconds)
        try:
            yield
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            armed[0] = False
    finally:
        signal.signal(signal.SIGALRM, previous)
        if outer[0] > 0:
            signal.setitimer(signal.ITIMER_REAL, max(outer[0] - (time.monotonic() - start), 1e-3), outer[1])


def check_document(path: Path, time_limit_s: float = 5.0) -> tuple[str, str, float]:
    """``omnigraph check PATH --json`` in-process under a time limit.

    Returns (outcome, detail, seconds): outcome ``ok``, ``hang``, ``traceback`` or ``bad_output``.
    """
    from omnigraph.cli import main
    out, err = io.StringIO(), io.StringIO()
    t = time.perf_counter()
    try:
        try:
            with time_limit(time_limit_s), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                code = main(["check", str(path), "--json"])
        except _Hang:
            return "hang", f"still running after {time_limit_s:g} s", time.perf_counter() - t
        except (Exception, SystemExit):  # noqa: BLE001 - what we count
            return "traceback", traceback.format_exc(limit=-8), time.perf_counter() - t
    except _Hang:           # the alarm went off on the way out: it ran to the limit all the same
        return "hang", f"still running after {time_limit_s:g} s", time.perf_counter() - t
    seconds = time.perf_counter() - t
    lines = out.getvalue().splitlines()
    if len(lines) != 1:
        return "bad_output", f"{len(lines)} lines on stdout (exit code {code}): {out.getvalue()[:500]!r} " \
                             f"stderr {err.getvalue()[:500]!r}", seconds
    try:
        report = json.loads(lines[0])
    except ValueError as e:
        return "bad_output", f"not JSON ({e}): {lines[0][:500]!r}", seconds
    if not isinstance(report, dict) or code not in (0, 1) or report.get("valid") is not (code == 0) \
            or (code == 1 and not report.get("errors")):
        return "bad_output", f"exit code {code} with {lines[0][:500]!r}", seconds
    return "ok", "", seconds


# ----------------------------------------------------------------------------------------------------------
# mutations

def _bomb(rng: random.Random, flow: bool) -> str:
    """A "billion laughs": nested lists of aliases, in flow style (one value) or as block lines."""
    levels, width = rng.randint(6, 10), rng.randint(6, 10)
    tag = f"b{rng.randrange(10**6)}"
    anchors = [f"&{tag}0 [{', '.join(['lol'] * width)}]"]
    anchors += [f"&{tag}{i} [{', '.join([f'*{tag}{i - 1}'] * width)}]" for i in range(1, levels)]
    if flow:
        return f"[{', '.join(anchors)}]"
    return "\n" + "\n".join(f"  - {a}" for a in anchors)


def _deep(rng: random.Random) -> str:
    n = rng.choice([31, 32, 33, 40, 200, 999, 1001, 5000, 100_000])
    return rng.choice(["[" * n + "]" * n, "{a: " * n + "1" + "}" * n, "[" * n])


def _hostile_value(rng: random.Random) -> str:
    """A YAML value (text) meant to hurt."""
    kind = rng.randrange(12)
    if kind == 0:
        return _bomb(rng, flow=True)
    if kind == 1:
        return rng.choice(["&a [*a]", "&a {x: *a}", "&a [1, [2, *a]]", "&a {<<: *a}", "*nowhere",
                           "{<<: *nowhere}", "&a 1", "{<<: [1, 2]}", "{<<: {a: 1}, a: 2}"])
    if kind == 2:
        return rng.choice(["-1", "0", "-0", "1e309", "-1e309", ".inf", "-.inf", ".nan", "1e-400", "0x7fffffffffffffff",
                           "99999999999999999999", "1" + "0" * rng.choice([30, 400, 5000]), "-" + "9" * 4300,
                           "0o777", "1_000_000", "0b1010", "1:30:00", "3.", "+.5", "1e1000000000"])
    if kind == 3:
        return _deep(rng)
    if kind == 4:
        return rng.choice(["!!python/object:os.system", "!!python/object/apply:os.system ['true']",
                           "!!python/name:os.system", "!!python/module:os", "!!binary aGVsbG8=", "!!set {a, b}",
                           "!!omap [a: 1, b: 2]", "!!pairs [a: 1]", "!!timestamp 2001-12-14", "!!float '1'",
                           "!!int 'x'", "!custom 1", "!<tag:example.com,2000:x> 1", "!!str 3", "!!null ''",
                           "!!bool yes", "!!map []", "!!seq {}", "!!int 1e400", "!!float 1e400", "!!bool x",
                           "!!timestamp x", "!!int ''", "!!float ''", "!!timestamp 2001-13-45", "!!merge x",
                           "!!value x", "!!str [1]", "!!set [1]", "!!binary 1", "!!int " + "1" * 5000])
    if kind == 5:
        return rng.choice(["'\u00e9\u2603'", "\u202eevil", "\U0001F600", "\ufeffbom", "a\u0301", "\u200b", "Ω -> ω",
                           '"\\0"', '"\\ud800"', '"\\x00\\x01"', '"\\U0010FFFF"', "'\u4e2d\u6587'", "\u00a0",
                           "\u2028", "'\\'", "\"\\u202e\""])
    if kind == 6:
        return rng.choice(["null", "~", "true", "no", "off", "[]", "{}", "''", "\"\"", "'a -> a'", "'x -> y'",
                           "{delay: -1}", "{delay: 1e309}", "[[[[[[[[]]]]]]]]", "\t", "|\n  block", ">-\n  folded",
                           "? [a]\n  : b", "{[1]: 2}", "{{a: 1}: 2}", "{a: 1, a: 2}", "[a, b", "{a: 1", "-", "---",
                           "...", "%", "@x", "`x`", "&", "*", "!", "|", ">", "? ", ": x", "- - - -"])
    if kind == 7:
        return "x" * rng.choice([1000, 100_000, 600_000])
    if kind == 8:
        return "[" + ", ".join(["1"] * rng.choice([1000, 60_000, 120_000])) + "]"
    if kind == 9:
        return "{" + ", ".join(f"k{i}: {i}" for i in range(rng.choice([100, 30_000]))) + "}"
    if kind == 10:
        return _bomb(rng, flow=False)
    return rng.choice(["'generate -> reward'", "generate.out -> reward.in", "{'a -> b': {delay: 2}}",
                       "[generate -> generate]", "sync -> generate", "{kind: update, pool: nowhere}",
                       "{kind: '__import__', pool: rollout}", "{kind: os:system, pool: rollout}",
                       "{backend: '../../etc/passwd'}", "nodes.rollout:GENERATE_HF", "os:system"])


_HOSTILE_PY = [-1, 0, 10**30, -(10**30), 2**63, 1e308, float("inf"), float("nan"), "", "\u202e", None, True, [], {},
               [[[[[]]]]], {"kind": "update"}, "a -> a", 10**9, 10**6, 10**5, 3.5, [1] * 50, {"x": [None] * 20},
               "async", "sync", "one_step_off", "generate -> generate", {"generate -> reward": {"delay": 10**6}}]


def _mutate_tree(rng: random.Random, text: str) -> str:
    """Set a random field of the parsed document to a hostile Python value, and dump it back."""
    data = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    if not isinstance(data, dict) or not data:
        return text
    target, key = data, rng.choice(list(data))
    for _ in range(rng.randint(0, 3)):
        value = target[key]
        if isinstance(value, dict) and value:
            target, key = value, rng.choice(list(value))
        elif isinstance(value, list) and value:
            target, key = value, rng.randrange(len(value))
        else:
            break
    target[key] = rng.choice(_HOSTILE_PY)
    return yaml.safe_dump(data, sort_keys=False, allow_unicode=True)


def _mutate_lines(rng: random.Random, text: str) -> str:
    lines = text.splitlines() or [""]
    for _ in range(rng.randint(1, 3)):
        i = rng.randrange(len(lines))
        op = rng.randrange(6)
        if op == 0:
            del lines[i]
        elif op in (1, 2) and ":" in lines[i]:
            key = lines[i].split(":")[0]
            value = _hostile_value(rng)
            lines[i] = f"{key}: {value}" if "\n" not in value else f"{key}:{value}"
        elif op == 3:
            j = rng.randrange(len(lines[i]) + 1)
            lines[i] = lines[i][:j] + rng.choice("{}[]:-#\"'&*!|>%@`,? \té\u2028") + lines[i][j:]
        elif op == 4 and "," in lines[i]:
            tokens = lines[i].split(",")
            tokens[rng.randrange(len(tokens))] = " " + _hostile_value(rng).replace("\n", " ")
            lines[i] = ",".join(tokens)
        else:
            lines.insert(i, lines[rng.randrange(len(lines))])
        lines = lines or [""]
    return "\n".join(lines)


def _mutate_document(rng: random.Random, text: str) -> str:
    op = rng.randrange(8)
    if op == 0:
        return text + "\n---\n" + text
    if op == 1:
        return rng.choice(["%YAML 1.1\n---\n", "%YAML 9.9\n---\n", "%TAG ! tag:evil.com,2000:\n---\n", "---\n",
                           "--- !!map\n", "\ufeff"]) + text
    if op == 2:
        return text[: rng.randrange(len(text) + 1)]
    if op == 3:
        return text.replace("  ", "\t", 1)
    if op == 4:
        return "bomb:" + _bomb(rng, flow=False) + "\n" + text
    if op == 5:
        return text.replace("\n", "\r\n") if rng.random() < 0.5 else text.replace("\n", "\r")
    if op == 6:
        return "&root\n" + text + "\nself: *root\n"
    return text + "\n" + "x: " + "[" * 31 + "1" + "]" * 31


def mutate(rng: random.Random, source: str) -> bytes:
    """One hostile variant of ``source``, as the bytes of a file."""
    text = source
    for _ in range(rng.choice([1, 1, 1, 2])):
        r = rng.random()
        try:
            text = _mutate_lines(rng, text) if r < 0.5 else _mutate_tree(rng, text) if r < 0.8 else \
                _mutate_document(rng, text)
        except Exception:  # noqa: BLE001 - _mutate_tree on a document that does not load
            text = _mutate_lines(rng, text)
    data = text.encode("utf-8", errors="surrogatepass")
    if rng.random() < 0.03:         # bytes that are not UTF-8, or a NUL
        i = rng.randrange(len(data) + 1)
        data = data[:i] + rng.choice([b"\xff", b"\xc3", b"\x00", b"\xed\xa0\x80", b"\xfe\xff"]) + data[i:]
    return data[:1_200_000]


# ----------------------------------------------------------------------------------------------------------

def sources() -> list[str]:
    return [p.read_text() for p in sorted((ROOT / "graphs").rglob("*.yaml"))]


def fuzz(cases: int, tmp: Path, time_limit_s: float = 5.0, seed: int = 0) -> dict:
    """``cases`` mutated graphs through ``omnigraph check --json``, each under ``time_limit_s``.

    Returns {"cases", "tracebacks", "hangs", "bad_output", "examples", "seconds", "slowest_s"}: the
    examples are a few offending documents with what went wrong.
    """
    rng = random.Random(seed)
    texts = sources()
    tmp = Path(tmp)
    tmp.mkdir(parents=True, exist_ok=True)
    path = tmp / "fuzz.yaml"
    path.write_text(texts[0])
    check_document(path, time_limit_s=max(60.0, time_limit_s))     # warm up: imports, entry points
    counts = {"traceback": 0, "hang": 0, "bad_output": 0}
    examples: list[dict] = []
    slowest = 0.0
    start = time.perf_counter()
    for case in range(cases):
        data = mutate(rng, rng.choice(texts))
        path.write_bytes(data)
        outcome, detail, seconds = check_document(path, time_limit_s)
        slowest = max(slowest, seconds)
        if outcome == "ok":
            continue
        counts[outcome] += 1
        if len(examples) < EXAMPLES:
            doc, half = data.decode("utf-8", errors="replace"), EXAMPLE_CHARS // 2
            if len(doc) > EXAMPLE_CHARS:
                doc = f"{doc[:half]}\n... ({len(doc)} characters in all) ...\n{doc[-half:]}"
            examples.append({"case": case, "outcome": outcome, "seconds": round(seconds, 3),
                             "detail": detail[-EXAMPLE_CHARS:], "document": doc})
    return {"cases": cases, "tracebacks": counts["traceback"], "hangs": counts["hang"],
            "bad_output": counts["bad_output"], "examples": examples,
            "seconds": round(time.perf_counter() - start, 2), "slowest_s": round(slowest, 3)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=1000)
    ap.add_argument("--time-limit", type=float, default=5.0, help="seconds per document")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    os.chdir(ROOT)
    with tempfile.TemporaryDirectory() as tmp:
        res = fuzz(args.cases, Path(tmp), args.time_limit, args.seed)
    for ex in res["examples"]:
        print(f"--- case {ex['case']}: {ex['outcome']} after {ex['seconds']} s\n{ex['detail']}\n"
              f"--- document:\n{ex['document']}\n")
    print(f"fuzz: {res['cases']} mutated graphs through 'omnigraph check --json' in {res['seconds']} s "
          f"(slowest {res['slowest_s']} s): {res['tracebacks']} tracebacks, {res['hangs']} hangs, "
          f"{res['bad_output']} bad outputs")
    print(json.dumps({k: v for k, v in res.items() if k != "examples"}))
    return 0 if not (res["tracebacks"] or res["hangs"] or res["bad_output"]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
