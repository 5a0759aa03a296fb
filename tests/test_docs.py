"""The documentation: the site builds without a warning, its examples run, and the README stays a front page.

- ``mkdocs build --strict`` (``mkdocs.yml`` at the repository root, pages under ``docs/``, the API reference
  generated from the docstrings) must succeed without one warning: a broken link or anchor, a page left out
  of the navigation, a docstring mkdocstrings cannot render. The benchmarks page must hold a table for
  every benchmark that has a record in ``bench/results/``.
- The code blocks of the pages (``docs/**/*.md``) follow one convention:

  - ```` ```pycon ```` blocks are **doctests**: a page's blocks run in order, in one namespace, from the
    repository root, with ``ELLIPSIS`` and ``NORMALIZE_WHITESPACE`` (as the library's own doctests), and
    their output must match. Keep them fast: compiling a graph and reading its plan is fine, training is not.
  - ```` ```python ```` blocks are examples to read (a plugin's skeleton, a run directory read back): they
    must compile, and are not run.
  - ```` ```yaml ```` and ```` ```toml ```` blocks must parse.
- ``README.md`` is under 200 lines and opens (after its title) with exactly the two commands ``make run`` and
  ``make test`` in a bash block.

Every measured figure in the pages is checked against its benchmark record by ``tests/test_bench_results.py``.
"""

from __future__ import annotations

import doctest
import io
import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = sorted(p for p in DOCS.rglob("*.md") if "hooks" not in p.relative_to(DOCS).parts)
README = ROOT / "README.md"
FENCE = re.compile(r"^(?P<indent>\s*)```(?P<lang>[\w+-]*)")


def _name(page: Path) -> str:
    return page.relative_to(ROOT).as_posix()


def blocks(text: str) -> list[tuple[str, int, str]]:
    """``(language, line number of its first line, body)`` of every fenced code block of a page."""
    out, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, lang, start, body = m.group("indent"), m.group("lang"), i + 2, []
        i += 1
        while i < len(lines) and not (lines[i].startswith(indent) and lines[i].strip().startswith("```")):
            body.append(lines[i][len(indent):] if lines[i].startswith(indent) else lines[i].lstrip())
            i += 1
        out.append((lang, start, "\n".join(body) + "\n"))
        i += 1
    return out


# ---------------------------------------------------------------- the site

def test_the_site_builds_without_a_warning(tmp_path):
    site = tmp_path / "site"
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(ROOT / "mkdocs.yml"),
                           "-d", str(site)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    output = done.stdout + done.stderr
    warnings = [line for line in output.splitlines() if "WARNING" in line or "ERROR" in line]
    assert done.returncode == 0 and not warnings, f"mkdocs build --strict failed:\n{output[-6000:]}"
    benchmarks = (site / "benchmarks" / "index.html").read_text()
    benches = {json.loads(p.read_text()).get("bench", p.stem.rsplit("-", 2)[0])
               for p in (ROOT / "bench" / "results").glob("*.json")}
    missing = sorted(b for b in benches if f'id="{b}"' not in benchmarks)
    assert not missing, f"the benchmarks page has no table for {missing}"
    assert (site / "bench" / "results").is_dir(), "the records are not on the site: the [src] links would break"


# ---------------------------------------------------------------- the pages' examples

@pytest.mark.parametrize("page", [p for p in PAGES if any(b[0] == "pycon" for b in blocks(p.read_text()))],
                         ids=_name)
def test_the_pycon_examples_run(page, monkeypatch):
    monkeypatch.chdir(ROOT)
    monkeypatch.syspath_prepend(str(ROOT))
    parser = doctest.DocTestParser()
    examples = []
    for lang, line, body in blocks(page.read_text()):
        if lang == "pycon":
            for ex in parser.get_examples(body, name=_name(page)):
                ex.lineno += line - 1
                examples.append(ex)
    test = doctest.DocTest(examples, {"__name__": "__docs__"}, _name(page), str(page), 0, None)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    report = io.StringIO()
    result = runner.run(test, out=report.write)
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples in {_name(page)} failed:\n" \
                               + report.getvalue()


def test_every_other_code_block_parses():
    problems = []
    for page in PAGES:
        for lang, line, body in blocks(page.read_text()):
            where = f"{_name(page)}:{line}"
            try:
                if lang == "python":
                    compile(body, where, "exec")
                elif lang == "yaml":
                    list(yaml.safe_load_all(body))
                elif lang == "toml":
                    tomllib.loads(body)
            except (SyntaxError, yaml.YAMLError, tomllib.TOMLDecodeError) as e:
                problems.append(f"{where} ({lang}): {e}")
    assert not problems, "code blocks that do not parse:\n" + "\n".join(problems)


def test_the_pages_have_examples_that_run():
    """The convention is in use: the pages that explain the API show it running."""
    with_pycon = {_name(p) for p in PAGES if any(b[0] == "pycon" for b in blocks(p.read_text()))}
    for page in ("docs/quickstart.md", "docs/concepts.md", "docs/reference/plugins.md"):
        assert page in with_pycon, f"{page} has no ```pycon example"


# ---------------------------------------------------------------- the README

def test_the_readme_is_a_front_page_that_opens_with_the_two_commands():
    lines = README.read_text().splitlines()
    assert len(lines) < 200, f"README.md has {len(lines)} lines: move sections into docs/ (it must stay under 200)"
    body = [line for line in lines if line.strip()]
    assert body[0].startswith("# "), "README.md opens with its title"
    assert body[1:5] == [
        "```bash",
        "make run    # set up .venv from pyproject.toml, then: omnigraph run graphs/grpo_one_step_off.yaml",
        "make test   # set up .venv, then the test suite",
        "```",
    ], f"README.md must open with the two commands, make run and make test, in a bash block; it opens with:\n" \
       + "\n".join(body[:5])


def test_the_blocks_parser_reads_fences():
    text = "a\n\n```pycon\n>>> 1 + 1\n2\n```\n\n- item\n\n  ```python\n  x = 1\n  ```\n"
    assert blocks(text) == [("pycon", 4, ">>> 1 + 1\n2\n"), ("python", 11, "x = 1\n")]
