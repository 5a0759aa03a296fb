"""Hostile YAML is answered at once: alias bombs, recursive aliases, deep and huge documents are refused
(or accepted) within a couple of seconds, through ``omnigraph check --json`` and through ``load_text``."""

import json
import re
import time

import pytest

import omnigraph as og
from omnigraph.cli import main
from omnigraph.errors import GraphError
from omnigraph.graph.yamlio import MAX_NODES, parse_yaml

from conftest import GRAPHS

LIMIT_S = 3.0
"""A couple of seconds, with room for a loaded 2-core machine (the nine-level bomb used to run for minutes)."""
SYNTH = (GRAPHS / "synthetic_one_step_off.yaml").read_text()


def bomb(levels: int = 9, width: int = 9) -> str:
    """A "billion laughs": ``levels`` anchors, each a list of ``width`` aliases of the one before."""
    lines = [f"l0: &l0 [{', '.join(['lol'] * width)}]"]
    lines += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * width)}]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


def check_json(tmp_path, capsys, text: str) -> tuple[int, dict, float]:
    """``omnigraph check PATH --json`` in-process: exit code, its one JSON line, seconds."""
    path = tmp_path / "g.yaml"
    path.write_text(text)
    capsys.readouterr()
    t = time.perf_counter()
    code = main(["check", str(path), "--json"])
    elapsed = time.perf_counter() - t
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 1, out
    return code, json.loads(out[0]), elapsed


def load_timed(text: str) -> tuple[object, float]:
    """``og.load_text``: the spec or the GraphError, and seconds."""
    t = time.perf_counter()
    try:
        result = og.load_text(text, "g.yaml")
    except GraphError as e:
        result = e
    return result, time.perf_counter() - t


REFUSED = {
    "nine levels of nine aliases": (bomb(), r"g\.yaml:\d+: the YAML expands to more than 100000 values.*9\^9.*"
                                            r"\(fix: write the document without repeated aliases\)"),
    "recursive alias in a mapping": (SYNTH.replace("  rollout: {actors: 1, cpus: 1}",
                                                   "  rollout: &r {actors: 1, cpus: 1, more: [*r]}"),
                                     r"g\.yaml:6: the YAML refers to itself.*\(fix: remove the alias"),
    "recursive alias in a list": ("a: &a [*a]\n", r"g\.yaml:1: the YAML refers to itself"),
    "huge flow sequence": ("name: x\nedges: [" + ", ".join(["a -> b"] * 120_000) + "]\n",
                           r"g\.yaml:2: the YAML holds more than 100000 values \(fix: a graph needs a few hundred"),
    "200k numbers": ("pools: [" + ",".join(["1"] * 200_000) + "]\n", r"g\.yaml: the YAML holds more than 100000"),
    "deep": ("a: " + "[" * 40 + "]" * 40 + "\n", r"g\.yaml:1: the YAML nests more than 32 levels deep"),
    "very deep": ("a: " + "[" * 300_000, r"g\.yaml:1: invalid YAML"),
}


@pytest.mark.parametrize("name", list(REFUSED))
def test_hostile_documents_are_refused_quickly(tmp_path, capsys, name):
    text, message = REFUSED[name]
    assert len(text.encode()) < 1_000_000          # under the file limit: refused for what it holds
    code, report, elapsed = check_json(tmp_path, capsys, text)
    assert code == 1 and report["valid"] is False, report
    assert elapsed < LIMIT_S, f"check --json took {elapsed:.1f} s"
    (error,) = report["errors"]
    assert re.search(message.replace(r"g\.yaml", r"/g\.yaml"), error), error
    result, elapsed = load_timed(text)
    assert isinstance(result, GraphError) and elapsed < LIMIT_S, (result, elapsed)
    assert re.match(message, str(result)), str(result)


def test_the_bomb_is_refused_at_the_first_anchor_past_the_limit():
    # l5 expands to 9^6 + ... > 100000 values; l4 to fewer
    assert 9 ** 5 < MAX_NODES < 9 ** 6
    with pytest.raises(GraphError, match=r"^g\.yaml:6: the YAML expands"):
        og.load_text(bomb(), "g.yaml")


def test_a_deep_but_small_alias_chain_is_fine(tmp_path, capsys):
    """Long chains of anchors, each used once by the next: nothing multiplies, so they load. Thirty
    lists nested through aliases (32 levels with the top mapping: the depth limit), and two hundred
    mappings merged into one another (merges do not nest)."""
    nested = "\n".join(["x0: &x0 [1]"] + [f"x{i}: &x{i} [*x{i - 1}]" for i in range(1, 31)])
    merged = "\n".join(["m0: &m0 {k0: 0}"] + [f"m{i}: &m{i} {{<<: *m{i - 1}, k{i}: {i}}}" for i in range(1, 200)])
    t = time.perf_counter()
    data, lines = parse_yaml(nested + "\n" + merged, "g.yaml")
    assert time.perf_counter() - t < LIMIT_S
    want = [1]
    for _ in range(30):
        want = [want]
    assert data["x30"] == want and data["x30"][0] is data["x29"]
    assert data["m199"] == {f"k{i}": i for i in range(200)} and lines[("m199",)] == 231
    text = SYNTH + nested + "\n"
    result, elapsed = load_timed(text)
    assert elapsed < LIMIT_S
    assert isinstance(result, GraphError) and re.search(r"g\.yaml:21: x0: unknown field 'x0'", str(result)), result
    code, report, elapsed = check_json(tmp_path, capsys, text)
    assert code == 1 and elapsed < LIMIT_S and "unknown field 'x0'" in report["errors"][0]


def test_anchors_and_merge_keys_a_graph_might_use_still_load(tmp_path, capsys):
    text = SYNTH.replace("  rollout: {actors: 1, cpus: 1}", "  rollout: &pool {actors: 1, cpus: 1}") \
                .replace("  trainer: {actors: 1, cpus: 1}", "  trainer: {<<: *pool}")
    spec = og.load_text(text)
    assert spec.pools["trainer"] == spec.pools["rollout"]
    code, report, elapsed = check_json(tmp_path, capsys, text)
    assert code == 0 and report["valid"] and elapsed < LIMIT_S
    data, lines = parse_yaml(bomb(levels=4), "g.yaml")     # 9^4 values: under the limit
    assert data["l3"][8][8][8] == ["lol"] * 9 and lines[("l3",)] == 4


def test_a_long_list_under_the_limit_is_answered_quickly(tmp_path, capsys):
    text = SYNTH.replace("  - sync -> generate", "  - sync -> generate\n" + "  - sync -> generate\n" * 30_000)
    code, report, elapsed = check_json(tmp_path, capsys, text)
    assert code == 1 and not report["valid"] and elapsed < 2 * LIMIT_S, (elapsed, report["errors"][:1])


def test_the_limits_hold_for_overrides():
    levels = [f"&v0 [{', '.join(['x'] * 9)}]"] + [f"&v{i} [{', '.join([f'*v{i - 1}'] * 9)}]" for i in range(1, 9)]
    t = time.perf_counter()
    with pytest.raises(GraphError, match=r"override 'name=\[.*expands to more than"):
        og.load_text(SYNTH, "g.yaml", [f"name=[{', '.join(levels)}]"])
    assert time.perf_counter() - t < LIMIT_S


def test_load_text_keeps_the_size_limit():
    with pytest.raises(GraphError, match="more than 1000000"):
        og.load_text("name: " + "x" * 1_000_001)


@pytest.mark.parametrize("value,message", [
    ("!!int x", r"cannot read 'x' as int"),
    ("!!bool maybe", r"cannot read 'maybe' as bool"),
    ("!!timestamp 2001-13-45", r"cannot read '2001-13-45' as timestamp: month must be in 1\.\.12"),
    ("!!timestamp soon", r"cannot read 'soon' as timestamp"),
    ("!!float ''", r"cannot read '' as float"),
    ("1" + "0" * 5000, r"cannot read '1000.*' as int: Exceeds the limit \(4300 digits\)"),
])
def test_values_that_cannot_be_built_are_yaml_errors_with_their_line(value, message):
    """PyYAML's constructors raise ValueError, KeyError, AttributeError, IndexError on these: each is one
    GraphError at its line, not a traceback."""
    with pytest.raises(GraphError, match=r"^g\.yaml:3: invalid YAML: " + message + r".*\(fix: quote it"):
        og.load_text(f"name: x\nmodel: {{}}\ntask: {{name: {value}}}\n", "g.yaml")


def test_text_that_is_not_unicode_is_an_error_not_a_traceback():
    with pytest.raises(GraphError, match="not valid text"):
        og.load_text("name: \ud800\n")


def test_without_libyaml_the_pure_python_loader_keeps_the_same_limits(tmp_path):
    """PyYAML built without libyaml: the same refusals (only slower on megabytes)."""
    import subprocess
    import sys
    (tmp_path / "bomb.yaml").write_text(bomb())
    code = f"""
import yaml
del yaml.CSafeLoader
import omnigraph as og
from omnigraph.graph import yamlio
from omnigraph.errors import GraphError
assert yamlio._Loader.__mro__[1] is yaml.SafeLoader
for text, want in [({bomb()!r}, "expands to more than"), ("a: &a [*a]", "refers to itself"),
                   ("a: " + "[" * 40 + "]" * 40, "nests more than 32"), ("name: !!int x", "cannot read 'x' as int")]:
    try:
        og.load_text(text, "g.yaml")
    except GraphError as e:
        assert want in str(e), (want, str(e))
    else:
        raise AssertionError(want)
assert og.load((yamlio.Path({str(GRAPHS)!r}) / "grpo_sync.yaml")).name == "grpo-sync"
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
