"""Every measured figure in README.md and in the documentation pages (``docs/**/*.md``) cites the recorded
benchmark result it comes from.

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
"""

from __future__ import annotations

import datetime as dt
import json
import re
import sys
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = [README] + sorted(p for p in (ROOT / "docs").rglob("*.md") if "hooks" not in p.relative_to(ROOT / "docs").parts)
sys.path.insert(0, str(ROOT / "bench"))

MARKER = re.compile(r"\[src\]\((bench/results/[^)#\s]+?\.json)#([^)\s]+)\)")
NUM = r"(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?"
NUMBER = re.compile(r"(?<![\w.])-?(" + NUM + r")(?![\d]|\.\d|[A-Za-wyz_])")
UNIT = r"(?:s/step|s per step|seconds|tok/s|tokens/s|GB/s|MB/s|GiB/s|ms|µs|us|s|%)"
MEASURED = re.compile(
    r"(?<![\w.])" + NUM + r"\s?" + UNIT + r"(?![A-Za-z])"            # 0.80 s, 349 tok/s, 10%
    r"|(?<![\w.])[×x]" + NUM + r"(?!\w|\.\d)"                       # ×1.60, x1.6
    r"|(?<![\w.])" + NUM + r"[×x](?![A-Za-z0-9])")                   # 2.8×, 5.3x
BARE_CELL = re.compile(r"^[~≈<>]?\s*[×x]?\d[\d,]*\.\d+\s*(?:" + UNIT + r"|[×x])?$")
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


def scan(text: str, doc: str = "README.md") -> tuple[list[Cite], list[tuple[int, str, str]]]:
    """The markers of ``text`` (the page ``doc``) with the figure each cites, and the measured-looking figures no
    marker cites: ``(line number, figure, line)``."""
    cites: list[Cite] = []
    loose: list[tuple[int, str, str]] = []
    for n, raw in _lines(text):
        if raw.rstrip().endswith(NOSRC):
            continue
        line = _blank_code(raw)
        for cell in _segments(line):
            pos = 0
            rest = []
            for m in MARKER.finditer(cell):
                before = cell[pos:m.start()]
                nums = list(NUMBER.finditer(before))
                figure = nums[-1].group(1) if nums else None
                cites.append(Cite(n, figure, m.group(1), m.group(2), raw.strip(), doc))
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
        return f"{where}: the page says {cite.figure}, the record holds {value!r} (= {shown} at that precision)"
    return None


# ---------------------------------------------------------------- README.md and docs/

def _name(page: Path) -> str:
    return page.relative_to(ROOT).as_posix()


@pytest.mark.parametrize("page", DOCS, ids=_name)
def test_every_marker_cites_a_recorded_value(page):
    cites, _ = scan(page.read_text(), _name(page))
    errors = [e for c in cites if (e := check(c))]
    if errors:
        pytest.fail(f"{len(errors)} of {len(cites)} figures in {_name(page)} do not match their source:\n"
                    + "\n".join(errors), pytrace=False)


@pytest.mark.parametrize("page", DOCS, ids=_name)
def test_every_measured_figure_has_a_source(page):
    _, loose = scan(page.read_text(), _name(page))
    listing = "\n".join(f"{_name(page)}:{n}: {fig!r} in: {line[:140]}" for n, fig, line in loose)
    if loose:
        pytest.fail(f"{len(loose)} measured-looking figures in {_name(page)} have no "
                    f"[src](bench/results/<file>.json#<key.path>) marker (see tests/test_bench_results.py):\n"
                    + listing, pytrace=False)


# ---------------------------------------------------------------- the checker itself

def _record(tmp_path: Path, result: dict, **over) -> str:
    rec = {"bench": "demo", "date": "2026-12-01T10:11:12+00:00", "git_rev": "0123abc" * 5 + "01234",
           "dirty": False, "argv": ["bench/demo.py"], "machine": {"cpu_model": "x"}, "result": result} | over
    (tmp_path / "bench" / "results").mkdir(parents=True, exist_ok=True)
    name = f"bench/results/demo-{len(list((tmp_path / 'bench' / 'results').iterdir()))}.json"
    (tmp_path / name).write_text(json.dumps(rec))
    return name


def test_the_checker_finds_cited_and_uncited_figures(tmp_path):
    f = _record(tmp_path, {"s": 0.2234, "ratio": 1.6012, "tps": 4346.4, "runtime": {"0.5+0.5 sync": {"s": 2.5519}},
                           "models": [{"ms": 0.02213}]})
    text = f"""intro: 0.41 s/step measured, 0.412 predicted <!-- nosrc -->
one-step-off 0.223 s/step [src]({f}#s) (×1.60 [src]({f}#ratio)); 4,346 tok/s [src]({f}#tps)
| layout | sync |
| --- | --- |
| shared | 2.55 [src]({f}#runtime.0.5+0.5%20sync.s) |
| apart | 2.78 |
sync 22 ms [src]({f}#models.0.ms*1000) and an uncited 3.97 s, `timeout 300 s` in code; x86_64 and 16x8 are not
ratios, the tiny model ×1.14.
```
0.5 s in a fence
```
"""
    cites, loose = scan(text)
    assert [(c.line, c.figure) for c in cites] == [(2, "0.223"), (2, "1.60"), (2, "4,346"), (5, "2.55"), (7, "22")]
    assert [check(c, tmp_path) for c in cites] == [None] * 5
    assert [(n, fig) for n, fig, _ in loose] == [(6, "2.78"), (7, "3.97 s"), (8, "×1.14")]


def test_the_checker_rejects_wrong_figures_and_missing_provenance(tmp_path):
    good = _record(tmp_path, {"s": 2.7812, "flag": True, "nested": {"a": [1.5]}})
    bare = _record(tmp_path, {"s": 2.7812}, git_rev=None)
    cases = {f"2.79 [src]({good}#s)": "the page says 2.79",
             f"2.78 [src]({good}#t)": "no key 't'",
             f"2.78 [src]({good}#flag)": "not a number",
             f"2.78 [src]({good}#nested.a.3)": "no item '3'",
             f"2.78 [src]({bare}#s)": "has no git_rev",
             "2.78 [src](bench/results/gone.json#s)": "does not exist",
             f"[src]({good}#s)": "no number before the marker"}
    for text, why in cases.items():
        (cite,), _ = scan(text)
        err = check(cite, tmp_path)
        assert err and why in err, (text, err)
    for ok in ("2.78", "2.8", "3"):
        (cite,), _ = scan(f"{ok} [src]({good}#s)")
        assert check(cite, tmp_path) is None, ok


# ---------------------------------------------------------------- bench/record.py

def test_record_saves_provenance_and_reads_back_the_newest(tmp_path, monkeypatch):
    import record
    monkeypatch.setenv("OMNIGRAPH_BENCH_RESULTS", str(tmp_path))
    assert record.latest("demo") is None
    a = record.save("demo", {"x": 1.0}, argv=["bench/demo.py", "--quick"])
    b = record.save("demo", {"x": 2.0})                     # the same second: a new file, never an overwrite
    record.save("demo_other", {"x": 3.0})
    assert a != b and re.fullmatch(r"demo-\d{8}-\d{6}(-\d+)?\.json", a.name), a.name
    rec = json.loads(a.read_text())
    assert rec["bench"] == "demo" and rec["result"] == {"x": 1.0} and rec["argv"] == ["bench/demo.py", "--quick"]
    assert dt.datetime.fromisoformat(rec["date"]).tzinfo is not None
    assert re.fullmatch(r"[0-9a-f]{40}", rec["git_rev"]) and isinstance(rec["dirty"], bool)
    m = rec["machine"]
    assert set(m["cpu_flags"]) == set(record.FLAGS) and all(isinstance(v, bool) for v in m["cpu_flags"].values())
    assert m["cores"]["os_cpu_count"] >= 1 and m["mem_gb"] > 0 and isinstance(m["gpus"], list)
    assert m["python"] and m["torch"] and m["ray"]
    assert record.latest("demo")["result"] == {"x": 2.0}
    assert record.latest("dem") is None                     # names match whole, not by prefix


def test_emit_prints_the_saved_dict_last(tmp_path, monkeypatch, capsys):
    import argparse
    import record
    monkeypatch.setenv("OMNIGRAPH_BENCH_RESULTS", str(tmp_path))
    path = record.emit("demo", {"a": float("nan"), "b": [1, 2]})
    out = capsys.readouterr().out.strip().splitlines()
    assert out[0] == f"results: {path}" and json.loads(out[-1]) == {"a": None, "b": [1, 2]}
    assert json.loads(path.read_text())["result"] == json.loads(out[-1])
    assert record.emit("demo", {"a": 1}, argparse.Namespace(no_save=True)) is None
    assert len(list(tmp_path.iterdir())) == 1


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
