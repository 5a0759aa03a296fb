"""Every measured figure in README.md and in the documentation pages (``docs/**/*.md``) cites the recorded
benchmark result it comes from, with the right value, sign, machine and age; the rules and the checker are in
``tests/figures.py``. Then the checker's own tests, and ``bench/record.py``'s."""

from __future__ import annotations

import datetime as dt
import json
import re
import subprocess
from pathlib import Path

import pytest

from figures import DOCS, ROOT, NoHistory, check, check_age, check_machine, scan


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
def test_every_machine_named_is_the_records(page):
    cites, _ = scan(page.read_text(), _name(page))
    errors = [e for c in cites if (e := check_machine(c))]
    if errors:
        pytest.fail(f"{len(errors)} figures in {_name(page)} cite a record of another machine than the text "
                    f"names:\n" + "\n".join(errors), pytrace=False)


@pytest.mark.parametrize("page", DOCS, ids=_name)
def test_every_record_is_as_new_as_its_script_or_dated(page):
    cites, _ = scan(page.read_text(), _name(page))
    errors, unknown = [], set()
    for c in cites:
        try:
            if e := check_age(c):
                errors.append(e)
        except NoHistory as e:
            unknown.add(str(e))
    if errors:
        pytest.fail(f"{len(errors)} figures in {_name(page)} cite a record older than its benchmark's code, and "
                    f"their paragraph does not say so:\n" + "\n".join(errors), pytrace=False)
    if unknown:
        pytest.skip("the age of some records cannot be checked: " + "; ".join(sorted(unknown)))


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


def test_the_checker_reads_the_sign(tmp_path):
    f = _record(tmp_path, {"neg": -0.025, "pos": 0.025, "ms": -0.0021})
    bad = {f"gap -0.03 [src]({f}#pos)": "not negative",
           f"gap −0.03 [src]({f}#pos)": "not negative",
           f"gap 0.03 [src]({f}#neg)": "write the minus",
           f"| 0.03 [src]({f}#neg) |": "write the minus",
           f"took 2.1 ms [src]({f}#ms*1000)": "write the minus"}
    for text, why in bad.items():
        (cite,), _ = scan(text)
        err = check(cite, tmp_path)
        assert err and why in err, (text, err)
    good = [f"gap -0.03 [src]({f}#neg)", f"gap −0.03 [src]({f}#neg)", f"| -0.03 [src]({f}#neg) |",
            f"(`gap_sigma` -0.03 [src]({f}#neg))", f"gap 0.03 [src]({f}#pos)",
            f"between 0.01-0.03 [src]({f}#pos)", f"0.01 - 0.03 [src]({f}#pos)", f"0.01–0.03 [src]({f}#pos)",
            f"3–0.03 [src]({f}#pos)", f"took -2.1 ms [src]({f}#ms*1000)"]
    for text in good:
        (cite,), _ = scan(text)
        assert check(cite, tmp_path) is None, text


def test_the_checker_matches_the_machine_named(tmp_path):
    h100 = _record(tmp_path, {"s": 2.7812}, machine={
        "cpu_model": "Intel(R) Xeon(R) Processor", "cpu_flags": {"amx_bf16": True},
        "gpus": [{"name": "NVIDIA H100 80GB HBM3", "memory_gb": 79.1}]})
    epyc = _record(tmp_path, {"s": 2.7812}, machine={
        "cpu_model": "AMD EPYC 7B13", "cpu_flags": {"amx_bf16": False}, "gpus": []})
    bad = {f"On one H200, sync took 2.78 s [src]({h100}#s).": "says 'H200'",
           f"On H200s:\nsync took 2.78 s [src]({h100}#s).": "says 'H200s'",
           f"On one A100: 2.78 s [src]({h100}#s)": "says 'A100'",
           f"On the 2-core Xeon with AMX: 2.78 s [src]({epyc}#s)": "says 'with AMX'",
           f"On a 2-core AMD EPYC: 2.78 s [src]({h100}#s)": "says 'AMD EPYC'",
           f"On a CPU without AMX: 2.78 s [src]({h100}#s)": "says 'without AMX'",
           f"an AVX2-only CPU: 2.78 s [src]({h100}#s)": "says 'AVX2-only'",
           f"on the GPU (H100) 2.78 s [src]({h100}#s), on an H200 2.78 s [src]({h100}#s)": "says 'H200'",
           f"Measured on one H200:\n\n| what | s |\n| --- | --- |\n| sync | 2.78 [src]({h100}#s) |": "says 'H200'",
           f"| on the H200 | 2.78 [src]({h100}#s) |": "says 'H200'"}
    for text, why in bad.items():
        cites, _ = scan(text)
        errs = [e for c in cites if (e := check_machine(c, tmp_path))]
        assert len(errs) == 1 and why in errs[0], (text, errs)
    good = [f"On one H100, sync took 2.78 s [src]({h100}#s).",
            f"On an H200 it was slower; on the H100 host 2.78 s [src]({h100}#s).",     # the nearest decides
            f"On the Xeon with AMX (a Sapphire Rapids): 2.78 s [src]({h100}#s)",
            f"On a 2-core AMD EPYC without AMX: 2.78 s [src]({epyc}#s)",
            f"On an H200 it was slower.\n\nHere: 2.78 s [src]({h100}#s)",            # another paragraph
            f"- On an H200 it was slower.\n- Faults: 2.78 s [src]({epyc}#s)",          # another list item
            f"## On an H200\n2.78 s [src]({epyc}#s)",                                  # a heading is its own
            f"2.78 s [src]({epyc}#s) on an H200 host",                                  # after it: not read
            f"`H200` is a setting: 2.78 s [src]({epyc}#s)",                             # inline code
            f"| on the H100 | 2.78 [src]({h100}#s) |\n| on an AMD EPYC | 2.78 [src]({epyc}#s) |",
            f"Measured on one H200:\n\n```\nH200\n```\n\n| sync | 2.78 [src]({h100}#s) |"]
    for text in good:
        cites, _ = scan(text)
        assert cites and [check_machine(c, tmp_path) for c in cites] == [None] * len(cites), text


def _git_repo(root: Path) -> callable:
    """A small git repository at ``root``; returns ``commit(path, text) -> sha``."""
    def git(*args):
        return subprocess.run(["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@example.org",
                               "-c", "commit.gpgsign=false", *args], check=True, capture_output=True,
                              text=True).stdout.strip()
    root.mkdir(parents=True, exist_ok=True)
    git("init", "-q")

    def commit(path: str, text: str) -> str:
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
        git("add", path)
        git("commit", "-q", "-m", f"change {path}")
        return git("rev-parse", "HEAD")
    return commit


def test_the_checker_asks_an_old_record_to_say_its_date(tmp_path):
    commit = _git_repo(tmp_path)
    first = commit("bench/demo.py", "print(1)\n")
    old = _record(tmp_path, {"s": 2.7812}, git_rev=first, date="2026-12-01T10:11:12+00:00")
    commit("bench/demo.py", "print(2)\n")                   # the script changed since the old record
    unrelated = commit("README.md", "x\n")                  # a later commit elsewhere: as new as the script
    fresh = _record(tmp_path, {"s": 2.7812}, git_rev=unrelated)
    run = _record(tmp_path, {"s": 2.7812}, bench="demo_run", git_rev=first, argv=["bench/record.py", "demo_run"])
    other = _record(tmp_path, {"s": 2.7812}, bench="demo_gpu", git_rev=first, argv=["bench/demo.py", "--gpu"])
    bad = {f"sync took 2.78 s [src]({old}#s)": "before",
           f"sync took 2.78 s [src]({other}#s)": "changed bench/demo.py",          # its script by argv
           f"On 2026-12-02: 2.78 s [src]({old}#s)": "2026-12-01",                  # another date
           f"Earlier figures are below.\n\nsync took 2.78 s [src]({old}#s)": "before"}
    for text, why in bad.items():
        cites, _ = scan(text)
        errs = [e for c in cites if (e := check_age(c, tmp_path))]
        assert len(errs) == 1 and why in errs[0], (text, errs)
    good = [f"sync took 2.78 s [src]({fresh}#s)",
            f"sync took 2.78 s [src]({old}#s) (2026-12-01)",
            f"On 2026-12-01,\nsync took 2.78 s [src]({old}#s).",
            f"A figure that predates the new script: 2.78 s [src]({old}#s)",
            f"| sync, an earlier run | 2.78 [src]({old}#s) |",
            f"Recorded 2026-12-01:\n\n| sync | 2.78 [src]({old}#s) |",                 # the table's caption
            f"a run's summary: 2.78 s [src]({run}#s)"]                                # no script: not checked
    for text in good:
        (cite,), _ = scan(text)
        assert check_age(cite, tmp_path) is None, text
    gone = _record(tmp_path, {"s": 2.7812}, git_rev="0123abc" * 5 + "01234")
    (cite,), _ = scan(f"2.78 s [src]({gone}#s)")
    with pytest.raises(NoHistory, match="does not know commit"):
        check_age(cite, tmp_path)


def test_the_age_rule_is_skipped_without_history(tmp_path, monkeypatch):
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))
    origin, copy, bare = tmp_path / "origin", tmp_path / "shallow", tmp_path / "bare"
    commit = _git_repo(origin)
    commit("bench/demo.py", "print(1)\n")
    rev = commit("bench/demo.py", "print(2)\n")
    subprocess.run(["git", "clone", "-q", "--depth", "1", f"file://{origin}", str(copy)], check=True)
    bare.mkdir()
    (bare / "bench").mkdir()
    (bare / "bench" / "demo.py").write_text("print(2)\n")
    for root, why in ((copy, "shallow clone"), (bare, "not a git repository")):
        rec = _record(root, {"s": 2.7812}, git_rev=rev)
        (cite,), _ = scan(f"2.78 s [src]({rec}#s)")
        with pytest.raises(NoHistory, match=why):
            check_age(cite, root)


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
