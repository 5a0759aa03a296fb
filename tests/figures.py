"""The figure checker (``tests/test_bench_results.py`` runs it on README.md and ``docs/**/*.md``): every measured
figure cites the recorded benchmark result it comes from.

The marker
----------
A measured figure is followed (in the same line, or the same table cell) by a link to the JSON file
``bench/record.py`` wrote and the key path of the value inside that file's ``result``::

    one-step-off 0.223 s/step [src](bench/results/parity-20261201-101112.json#one_step_off_s_per_step)
    | 1 + 1 | 2.78 [src](bench/results/gpu_multi-20261201-101112.json#runtime.1+1%20sync.s_per_step) | ... |
    a full sync takes 800 ms [src](bench/results/weight_sync-20261201-101112.json#full_sync_s*1000)

- The cited figure is the **last number before the marker** in its segment: the text since the previous
  marker on the line, the table cell (``|``), or the line's start. Thousands separators (``4,346``) are
  allowed; ``×1.60`` / ``1.60x`` cite ``1.60``.
- The record's path is relative to the repository root in every page, ``docs/`` ones included (the site's
  build makes each link relative to its page: ``docs/hooks/benchmarks.py``).
- The key path is relative to the record's ``result``: keys separated by ``.``, list items by their index
  (``models.0.sync_total_s``); a key that itself contains dots (``0.5+0.5 sync``) is found as written;
  spaces and other URL-unsafe characters are %-escaped (``%20``). An optional unit scale ends the path:
  ``*1000`` (s -> ms, fraction -> %), ``/1e9`` (bytes -> GB).
- Check: the file exists and is a record (``date``, ``git_rev``, ``machine``, ``result``), the path
  resolves to a number, and that number (scaled) **printed with the README's decimals equals the README's
  figure** (``2.78`` and ``2.8`` both match 2.7812; ``2.79`` does not).

What counts as measured-looking (and so needs a marker): a number followed by a unit of time, rate or
share (``s``, ``ms``, ``µs``, ``s/step``, ``tok/s``, ``tokens/s``, ``GB/s``, ``MB/s``, ``%``), a ratio
written ``×1.6`` / ``x1.60`` / ``1.6×`` / ``1.6x``, and a table cell holding nothing but a decimal
number (with or without such a unit). Not scanned: fenced code blocks (```` ``` ````), inline code
(`` `...` ``), and a line that ends with ``<!-- nosrc -->`` (a setting, a prediction or a bound, not a
measurement: the marker says so where the reviewer can see it).

Three more rules, each with its own test
----------------------------------------
They read the marker's **paragraph**: the lines between blank lines, where a heading, a list item (``- ``,
``1. ``) and a fenced block start a new one; a table row is a paragraph of its own, with the table's caption
(the prose paragraph right above the table, at most one blank line away, not a heading) read before it.

- **Sign** (in ``check``): a figure written with a minus (``-0.03``, ``−0.07``) must cite a negative value, one
  written without must cite a value >= 0. A dash between two numbers is a range, not a sign (``0.1-0.2``,
  ``0.1 - 0.2``, ``3–13``: the en dash is never a minus), and neither is a hyphen after a word (``lr1e-6``).
- **Machine** (``check_machine``): where the paragraph names the machine the figure was taken on, the record
  must have run there. The *nearest* mention before the marker decides (a paragraph naming no machine
  before the marker is not checked); the mentions, read left to right as in ``MACHINES`` (so ``without
  AMX`` is never also ``with AMX``)::

      the page says                                  the record's machine must have
      H100, H200, A100, B200, GH200, L40S, V100 (s)  that name, as a word, in one of gpus[*].name
      AMD EPYC                                       "AMD EPYC" in cpu_model
      Xeon                                           "Xeon" in cpu_model
      with AMX, AMX CPU(s), Sapphire Rapids          cpu_flags.amx_bf16 true
      without AMX, no AMX, AVX2 only, Ice Lake       cpu_flags.amx_bf16 false

- **Age** (``check_age``): a record is as new as the code it measures, or its paragraph says it is not. The
  benchmark's script is ``bench/<bench>.py``, else the record's ``argv[0]`` when that is a ``bench/*.py``
  script other than ``bench/record.py`` (``scale_gpu`` is ``bench/scale.py --gpu``). When the last commit
  that changed the script is not an ancestor of the record's ``git_rev`` (``git merge-base --is-ancestor``),
  the marker's paragraph must hold the record's date as written in it (``2026-12-01``) or the word
  ``predates`` or ``earlier``. Records with no script are not checked: ``make_run``, ``smollm2_run`` and the
  like are an ``omnigraph run``'s ``summary.json`` kept by ``bench/record.py``; the code they measure is the
  whole engine and its graph, so "the last commit that changed it" would be nearly every commit. Where the
  repository has no history to answer from (no ``.git``, a shallow clone, a record's commit not in it) the
  age test is skipped with the reason; the other rules still run.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import re
import subprocess
import sys
import urllib.parse
from dataclasses import dataclass
from pathlib import Path


ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = [README] + sorted(p for p in (ROOT / "docs").rglob("*.md") if "hooks" not in p.relative_to(ROOT / "docs").parts)
sys.path.insert(0, str(ROOT / "bench"))

MARKER = re.compile(r"\[src\]\((bench/results/[^)#\s]+?\.json)#([^)\s]+)\)")
NUM = r"(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?"
NUMBER = re.compile(r"(?<![\w.])([-−]?)(" + NUM + r")(?![\d]|\.\d|[A-Za-wyz_])")   # sign, figure
UNIT = r"(?:s/step|s per step|seconds|tok/s|tokens/s|GB/s|MB/s|GiB/s|ms|µs|us|s|%)"
MEASURED = re.compile(
    r"(?<![\w.])" + NUM + r"\s?" + UNIT + r"(?![A-Za-z])"            # 0.80 s, 349 tok/s, 10%
    r"|(?<![\w.])[×x]" + NUM + r"(?!\w|\.\d)"                       # ×1.60, x1.6
    r"|(?<![\w.])" + NUM + r"[×x](?![A-Za-z0-9])")                   # 2.8×, 5.3x
BARE_CELL = re.compile(r"^[~≈<>]?\s*[-−]?[×x]?\d[\d,]*\.\d+\s*(?:" + UNIT + r"|[×x])?$")
NOSRC = "<!-- nosrc -->"
SCALE = re.compile(r"^(.*?)(?:([*/])([0-9.]+(?:[eE][-+]?\d+)?))?$")


@dataclass
class Cite:
    line: int
    figure: str | None        # the printed number (None: no number before the marker)
    file: str
    path: str
    text: str
    doc: str = "README.md"    # the page, relative to the repository root
    sign: str = ""            # "-" where the figure is written with a minus
    before: str = ""          # its paragraph up to the marker (the machine rule)
    para: str = ""            # its whole paragraph (the age rule)


def _blank_code(line: str) -> str:
    """Inline code spans replaced by spaces (config values and commands are not figures)."""
    return re.sub(r"`[^`]*`", lambda m: " " * len(m.group(0)), line)


def _lines(text: str):
    """``(number, line)`` of the lines outside fenced code blocks."""
    fenced = False
    for i, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if not fenced:
            yield i, line


def _segments(line: str) -> list[str]:
    """A table row's cells, or the whole line."""
    if line.lstrip().startswith("|"):
        return [c for c in line.strip().strip("|").split("|")]
    return [line]


LIST_ITEM = re.compile(r"^\s*(?:[-*+]|\d+[.)])\s")
HEADING = re.compile(r"^\s{0,3}#")


def _paragraphs(text: str) -> dict[int, tuple[list[tuple[int, str]], str]]:
    """For each line outside fenced blocks: ``(its paragraph's lines [(number, line)], caption)``, the caption
    being, for a table row, the prose paragraph just above its table (see the module docstring), else ``""``."""
    out: dict[int, tuple[list[tuple[int, str]], str]] = {}
    para: list[tuple[int, str]] = []
    last: list[tuple[int, str]] | None = None          # the last prose paragraph closed
    fenced, caption, in_table = False, "", False

    def close():
        nonlocal para, last
        if para:
            last = para
        para = []

    for n, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            close()
            last, in_table = None, False
            continue
        if fenced:
            continue
        if not line.strip():
            close()
            in_table = False
            continue
        if line.lstrip().startswith("|"):
            if not in_table:
                close()
                in_table = True
                caption = "\n".join(t for _, t in last) if last and last[-1][0] >= n - 2 else ""
                last = None
            out[n] = ([(n, line)], caption)
            continue
        in_table = False
        if HEADING.match(line):
            close()
            last = None
            out[n] = ([(n, line)], "")
            continue
        if LIST_ITEM.match(line):
            close()
        para.append((n, line))
        out[n] = (para, "")
    return out


def scan(text: str, doc: str = "README.md") -> tuple[list[Cite], list[tuple[int, str, str]]]:
    """The markers of ``text`` (the page ``doc``) with the figure each cites, and the measured-looking figures no
    marker cites: ``(line number, figure, line)``."""
    cites: list[Cite] = []
    loose: list[tuple[int, str, str]] = []
    paragraphs = _paragraphs(text)
    for n, raw in _lines(text):
        if raw.rstrip().endswith(NOSRC):
            continue
        line = _blank_code(raw)
        lines, caption = paragraphs.get(n, ([(n, raw)], ""))
        caption = "\n".join(_blank_code(t) for t in caption.splitlines())
        above = "\n".join([caption] + [_blank_code(t) for k, t in lines if k < n])
        para = "\n".join([caption] + [_blank_code(t) for _, t in lines])
        starts = iter(m.start() for m in MARKER.finditer(line))     # the same markers, in the same order
        for cell in _segments(line):
            pos = 0
            rest = []
            for m in MARKER.finditer(cell):
                before = cell[pos:m.start()]
                nums = list(NUMBER.finditer(before))
                figure = nums[-1].group(2) if nums else None
                sign = nums[-1].group(1) if nums else ""
                if sign and re.search(r"\d\s*$", before[:nums[-1].start()]):
                    sign = ""                                        # 0.1 - 0.2: a range, not a minus
                cites.append(Cite(n, figure, m.group(1), m.group(2), raw.strip(), doc, "-" if sign else "",
                                  above + "\n" + line[:next(starts)], para))
                rest.append(before[:nums[-1].start()] if nums else before)
                pos = m.end()
            tail = cell[pos:]
            rest.append(tail)
            for part in rest:
                loose += [(n, f.group(0), raw.strip()) for f in MEASURED.finditer(part)]
            if pos == 0 and line.lstrip().startswith("|") and BARE_CELL.match(cell.strip()):
                if not MEASURED.search(cell):
                    loose.append((n, cell.strip(), raw.strip()))
    return cites, loose


def lookup(obj, path: str):
    """The value at ``path`` (see the module docstring) in ``obj``; KeyError naming the missing step."""
    parts = path.split(".")
    i = 0
    while i < len(parts):
        if isinstance(obj, list):
            key = urllib.parse.unquote(parts[i])
            if not key.isdigit() or int(key) >= len(obj):
                raise KeyError(f"no item {key!r} in a list of {len(obj)}")
            obj, i = obj[int(key)], i + 1
            continue
        if not isinstance(obj, dict):
            raise KeyError(f"{'.'.join(parts[:i])} is a {type(obj).__name__}, not an object")
        for j in range(len(parts), i, -1):          # the longest key that exists: keys may hold dots
            key = urllib.parse.unquote(".".join(parts[i:j]))
            if key in obj:
                obj, i = obj[key], j
                break
        else:
            raise KeyError(f"no key {urllib.parse.unquote(parts[i])!r} (there: {sorted(obj)[:12]})")
    return obj


def check(cite: Cite, root: Path = ROOT) -> str | None:
    """Why ``cite`` is wrong, or None."""
    where = f"{cite.doc}:{cite.line}: [src]({cite.file}#{cite.path})"
    f = root / cite.file
    if not f.is_file():
        return f"{where}: {cite.file} does not exist"
    try:
        rec = json.loads(f.read_text())
    except json.JSONDecodeError as e:
        return f"{where}: {cite.file} is not valid JSON ({e})"
    if not isinstance(rec, dict):
        return f"{where}: {cite.file} does not hold a JSON object"
    missing = [k for k in ("date", "git_rev", "machine", "result") if not rec.get(k)]
    if missing:
        return f"{where}: {cite.file} has no {', '.join(missing)} (write it with bench/record.py)"
    try:
        dt.datetime.fromisoformat(rec["date"])
    except (TypeError, ValueError):
        return f"{where}: date {rec['date']!r} is not an ISO date"
    if not (isinstance(rec["git_rev"], str) and re.fullmatch(r"[0-9a-f]{7,40}", rec["git_rev"])):
        return f"{where}: git_rev {rec['git_rev']!r} is not a commit (OMNIGRAPH_GIT_REV where there is no .git)"
    if not isinstance(rec["machine"], dict) or "cpu_model" not in rec["machine"]:
        return f"{where}: machine does not say what it ran on"
    path, op, factor = SCALE.match(cite.path).groups()
    try:
        value = lookup(rec["result"], path)
    except KeyError as e:
        return f"{where}: {e.args[0]}"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"{where}: the value there is {value!r}, not a number"
    if op:
        value = value * float(factor) if op == "*" else value / float(factor)
    if cite.figure is None:
        return f"{where}: no number before the marker"
    printed = cite.figure.replace(",", "")
    decimals = len(printed.split(".")[1]) if "." in printed else 0
    shown = f"{abs(value):.{decimals}f}"
    if shown != printed:
        return (f"{where}: the page says {cite.sign}{cite.figure}, the record holds {value!r} "
                f"(= {shown} at that precision)")
    if cite.sign and not value < 0:
        return f"{where}: the page says -{cite.figure}, the record holds {value!r}: not negative"
    if not cite.sign and value < 0:
        return f"{where}: the page says {cite.figure}, the record holds {value!r}: write the minus"
    return None


def _record_of(cite: Cite, root: Path) -> dict | None:
    """The cited record, or None where ``check`` already says what is wrong with it."""
    try:
        rec = json.loads((root / cite.file).read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return rec if isinstance(rec, dict) and isinstance(rec.get("machine"), dict) else None


# The machines a page may name: (pattern, what the record's machine must have). Read left to right with
# one alternation, so the longer phrase wins where two overlap ("without AMX" is not also "with AMX").
GPU_NAMES = r"GH200|H100|H200|A100|B200|L40S|V100"
MACHINES: list[tuple[str, str, object]] = [
    # pattern in the text (a regex)                           field of machine      must be / contain
    (r"\b(?:without|no) AMX\b", "amx", False),
    (r"\bAVX2[ -]only\b", "amx", False),
    (r"\bIce Lake\b", "amx", False),
    (r"\bwith AMX\b", "amx", True),
    (r"\bAMX CPUs?\b", "amx", True),
    (r"\bSapphire Rapids\b", "amx", True),
    (r"\bAMD EPYCs?\b", "cpu_model", "AMD EPYC"),
    (r"\bXeons?\b", "cpu_model", "Xeon"),
    (r"\b(?:" + GPU_NAMES + r")s?\b", "gpus", None),            # None: the name the text uses
]
MACHINE = re.compile("|".join(f"(?P<m{i}>{p})" for i, (p, _, _) in enumerate(MACHINES)))


def machine_named(text: str) -> tuple[str, str, object] | None:
    """The last machine mention of ``text``: ``(the words, field, expected)``, or None."""
    found = None
    for m in MACHINE.finditer(text):
        i = int(m.lastgroup[1:])
        _, field, want = MACHINES[i]
        if field == "gpus":
            want = re.match(GPU_NAMES, m.group(0)).group(0)
        found = (m.group(0), field, want)
    return found


def check_machine(cite: Cite, root: Path = ROOT) -> str | None:
    """Where the paragraph names the machine before the marker, whether the record ran on it."""
    named = machine_named(cite.before)
    rec = _record_of(cite, root)
    if named is None or rec is None:
        return None
    words, field, want = named
    m = rec["machine"]
    if field == "gpus":
        gpus = [g.get("name", "") for g in m.get("gpus") or [] if isinstance(g, dict)]
        ok, has = any(re.search(rf"\b{want}\b", g) for g in gpus), f"GPUs {gpus}"
    elif field == "cpu_model":
        ok, has = want in (m.get("cpu_model") or ""), f"CPU {m.get('cpu_model')!r}"
    else:
        amx = (m.get("cpu_flags") or {}).get("amx_bf16")
        ok, has = amx is want, f"amx_bf16 {amx}"
    if ok:
        return None
    return (f"{cite.doc}:{cite.line}: [src]({cite.file}#{cite.path}): the paragraph says {words!r} before "
            f"it, the record ran on {has}")


# ---------------------------------------------------------------- the age rule: git

class NoHistory(Exception):
    """The repository cannot say whether a record is as new as its script."""


def _git(root: Path, *args: str) -> subprocess.CompletedProcess | None:
    try:
        return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None


@functools.lru_cache(maxsize=None)
def history_missing(root: Path) -> str | None:
    """Why ``root`` has no history to check records' age against, or None."""
    done = _git(root, "rev-parse", "--is-shallow-repository")
    if done is None:
        return "git is not installed"
    if done.returncode != 0:
        return f"{root} is not a git repository git can read ({done.stderr.strip()[:120]})"
    if done.stdout.strip() == "true":
        return "a shallow clone: the commits the records were taken at are not here"
    return None


@functools.lru_cache(maxsize=None)
def last_change(root: Path, script: str) -> str | None:
    """The last commit that changed ``script``, or None (never committed)."""
    done = _git(root, "log", "-1", "--format=%H", "--", script)
    if done is None or done.returncode != 0:
        return None
    return done.stdout.strip() or None


@functools.lru_cache(maxsize=None)
def is_ancestor(root: Path, older: str, newer: str) -> bool:
    """Whether ``older`` is ``newer`` or an ancestor of it; NoHistory where git does not know a commit."""
    done = _git(root, "merge-base", "--is-ancestor", older, newer)
    if done is None or done.returncode not in (0, 1):
        raise NoHistory(f"git does not know commit {newer} ({(done.stderr.strip() if done else '')[:120]})")
    return done.returncode == 0


def script_of(rec: dict, root: Path = ROOT) -> str | None:
    """The benchmark script a record measures (module docstring), or None."""
    own = f"bench/{rec.get('bench')}.py"
    if (root / own).is_file():
        return own
    argv0 = (rec.get("argv") or [None])[0]
    if (isinstance(argv0, str) and re.fullmatch(r"bench/\w+\.py", argv0) and argv0 != "bench/record.py"
            and (root / argv0).is_file()):
        return argv0
    return None


PREDATES = re.compile(r"\b(?:predates|earlier)\b", re.IGNORECASE)


def check_age(cite: Cite, root: Path = ROOT) -> str | None:
    """Whether the record is as new as its script's last change, or its paragraph says when it was taken.
    Raises NoHistory where the repository cannot say."""
    rec = _record_of(cite, root)
    if rec is None or not isinstance(rec.get("git_rev"), str) or not isinstance(rec.get("date"), str):
        return None
    script = script_of(rec, root)
    if script is None:
        return None
    why = history_missing(root)
    if why:
        raise NoHistory(why)
    last = last_change(root, script)
    if last is None or is_ancestor(root, last, rec["git_rev"]):
        return None
    date = rec["date"][:10]
    if date in cite.para or PREDATES.search(cite.para):
        return None
    return (f"{cite.doc}:{cite.line}: [src]({cite.file}#{cite.path}): recorded at {rec['git_rev'][:10]} "
            f"({date}), before {last[:10]} changed {script}; say so in its paragraph ({date}, or "
            f"'predates ...' / 'earlier')")
