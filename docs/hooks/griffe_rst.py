"""A griffe extension for the API reference: the docstrings' reStructuredText shown as Markdown.

omnigraph's docstrings are written for Sphinx-style readers and for ``pytest --doctest-modules``: doctest
examples (``>>>``), simple tables (``=====  =====``), roles (``:class:`Plan```) and literal blocks after
``::``. Markdown reads a doctest's output ``[1.0, 0.5]`` after ``x["reward"]`` as a link, and a table as
one paragraph. This extension changes only what mkdocstrings renders, never the source:

- a doctest example becomes a ``pycon`` code block;
- a simple table (``=====  =====`` rules) becomes a Markdown table;
- ``:role:`~pkg.mod.Name``` becomes ```` `Name` ```` (``:role:`target``` becomes ```` `target` ````);
- a paragraph's closing ``::`` becomes ``:`` (the indented block after it is already code in Markdown).
"""

from __future__ import annotations

import re

import griffe

ROLE = re.compile(r":(?:py:)?(?:class|mod|func|meth|attr|data|obj|exc|const|ref|doc):`~?([^`]+)`")
TABLE_RULE = re.compile(r"^\s*=+(?: +=+)+\s*$")


def _indent(line: str) -> str:
    return line[:len(line) - len(line.lstrip())]


def _role(m: re.Match) -> str:
    target = m.group(1)
    whole = m.group(0)
    shown = target.rsplit(".", 1)[-1] if whole.split("`", 1)[1].startswith("~") else target
    return f"`{shown}`"


def _table(block: list[str]) -> list[str]:
    """A reStructuredText simple table (three ``=`` rules: above the header, under it, at the end) as a Markdown
    table; a line whose first column is blank continues the row above."""
    rule = next(line for line in block if TABLE_RULE.match(line))
    starts = [m.start() for m in re.finditer(r"=+", rule)]
    rows: list[list[str]] = []
    head: list[str] | None = None
    for line in block:
        if TABLE_RULE.match(line):
            if rows and head is None:
                head, rows = rows[0], []
            continue
        cells = [line[a:b].strip() for a, b in zip(starts, starts[1:] + [None])]
        if rows and not cells[0]:
            rows[-1] = [f"{old} {new}".strip() for old, new in zip(rows[-1], cells)]
        else:
            rows.append(cells)
    head = head or [""] * len(starts)
    return [_row(head), "| " + " | ".join("---" for _ in starts) + " |"] + [_row(r) for r in rows]


def _row(cells: list[str]) -> str:
    def cell(text: str) -> str:
        parts = re.split(r"(``.*?``)", ROLE.sub(_role, text))     # a pipe outside code would split the cell
        return "".join(p if p.startswith("``") else p.replace("|", "\\|") for p in parts)
    return "| " + " | ".join(cell(c) for c in cells) + " |"


def markdown(text: str) -> str:
    """``text`` (a docstring) with its doctests and tables fenced, its roles as code and ``::`` as ``:``."""
    lines = text.splitlines()
    out: list[str] = []
    i = 0
    fenced = False
    while i < len(lines):
        line = lines[i]
        stripped = line.strip()
        if stripped.startswith("```"):
            fenced = not fenced
            out.append(line)
            i += 1
            continue
        if fenced:
            out.append(line)
            i += 1
            continue
        if stripped.startswith(">>>"):
            pad = _indent(line)
            block = []
            while i < len(lines) and lines[i].strip():
                block.append(lines[i])
                i += 1
            if out and out[-1].strip():
                out.append("")
            out += [f"{pad}```pycon", *block, f"{pad}```", ""]
            continue
        if TABLE_RULE.match(line):
            pad = _indent(line)
            block, rules = [], 0
            while i < len(lines) and rules < 3:
                if TABLE_RULE.match(lines[i]):
                    rules += 1
                block.append(lines[i])
                i += 1
            if out and out[-1].strip():
                out.append("")
            out += [pad + row for row in _table(block)] + [""]
            continue
        line = ROLE.sub(_role, line)
        if line.strip() == "::":
            line = ""
        elif line.rstrip().endswith(" ::"):
            line = line.rstrip()[:-3]
        elif line.rstrip().endswith("::"):
            line = line.rstrip()[:-1]
        out.append(line)
        i += 1
    return "\n".join(out)


class RstToMarkdown(griffe.Extension):
    """Rewrite every docstring griffe loads for the API reference (see the module docstring)."""

    def on_instance(self, *, obj: griffe.Object, **kwargs) -> None:
        if obj.docstring is not None:
            obj.docstring.value = markdown(obj.docstring.value)
