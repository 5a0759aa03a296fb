"""Hostile input: generated YAML documents through the CLI never give a traceback or write anywhere."""

import json
import os

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from omnigraph.cli import main

from conftest import GRAPHS, ROOT

KEYS = ["name", "model", "task", "pools", "nodes", "edges", "schedule", "runtime", "checkpoint", "kind", "pool",
        "delay", "mode", "iterations", "actors", "cpus", "gpus", "path", "backend", "every", "ahead", "lr", "fn",
        "generate", "reward", "update", "sync", "old_logprob", "rollout", "trainer", "max_staleness", "on_stale"]
scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=True),
                    st.text(max_size=12), st.sampled_from(["generate -> reward", "a -> a", "sync", "one_step_off",
                                                            "!!python/object:os.system", "1e309", "tiny"]))
documents = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=6), inner, max_size=5)),
    max_leaves=25)
BASE = yaml.safe_load((GRAPHS / "synthetic_one_step_off.yaml").read_text())


def listing():
    return sorted(os.listdir(ROOT))


@settings(deadline=None, max_examples=1000, suppress_health_check=[HealthCheck.too_slow,
                                                                    HealthCheck.function_scoped_fixture])
@given(st.one_of(documents, st.dictionaries(st.sampled_from(list(BASE)), documents, max_size=4)
                 .map(lambda d: {**BASE, **d})), st.booleans())
def test_generated_documents_never_give_a_traceback_or_write_files(tmp_path, capsys, doc, raw_text):
    before = listing()
    path = tmp_path / "g.yaml"
    try:
        text = yaml.safe_dump(doc, allow_unicode=True)
    except yaml.YAMLError:
        return
    if raw_text:       # and a mangled variant of the same text
        text = text.replace(":", ": [", 1)
    path.write_text(text)
    code = main(["check", str(path), "--json"])
    out = capsys.readouterr().out
    report = json.loads(out)
    assert code in (0, 1) and report["valid"] is (code == 0)
    assert listing() == before
