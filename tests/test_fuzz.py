"""Hostile input: generated YAML documents through the CLI never give a traceback, hang or write anywhere."""

import os
import signal
import sys

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import GRAPHS, ROOT

sys.path.append(str(ROOT / "bench"))
from fuzzcheck import check_document, fuzz  # noqa: E402

DOC_LIMIT_S = 10.0
"""The most one document may take through ``omnigraph check --json`` (they take milliseconds)."""

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
def test_generated_documents_never_give_a_traceback_hang_or_write_files(tmp_path, doc, raw_text):
    before = listing()
    path = tmp_path / "g.yaml"
    try:
        text = yaml.safe_dump(doc, allow_unicode=True)
    except yaml.YAMLError:
        return
    if raw_text:       # and a mangled variant of the same text
        text = text.replace(":", ": [", 1)
    path.write_text(text)
    # one JSON line, valid exactly when the exit code is 0, within DOC_LIMIT_S (cut by SIGALRM)
    outcome, detail, seconds = check_document(path, time_limit_s=DOC_LIMIT_S)
    assert outcome == "ok", f"{outcome} after {seconds:.1f} s: {detail}\n--- the document:\n{text[:3000]}"
    assert listing() == before


def test_mutated_graphs_never_give_a_traceback_or_hang(tmp_path):
    """bench/fuzzcheck.py: 1,000 mutated copies of the shipped graphs (alias bombs, recursive aliases,
    huge numbers, deep nesting, tags, unicode, ...) each answered with one JSON line within 5 s."""
    before = listing()
    res = fuzz(1000, tmp_path, time_limit_s=5.0, seed=0)
    assert res["cases"] == 1000
    assert (res["tracebacks"], res["hangs"], res["bad_output"]) == (0, 0, 0), \
        "\n\n".join(f"{e['outcome']} after {e['seconds']} s: {e['detail']}\n--- document:\n{e['document']}"
                    for e in res["examples"])
    assert listing() == before


class TestTheHarness:
    """The harness itself counts what it should, and always cancels its timer."""

    def outcome(self, tmp_path, monkeypatch, fake_main, limit=0.5):
        import omnigraph.cli
        monkeypatch.setattr(omnigraph.cli, "main", fake_main)
        path = tmp_path / "g.yaml"
        path.write_text("name: x\n")
        handler = signal.getsignal(signal.SIGALRM)
        result = check_document(path, time_limit_s=limit)
        assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0) and signal.getsignal(signal.SIGALRM) is handler
        return result

    def test_a_document_that_runs_forever_is_a_hang(self, tmp_path, monkeypatch):
        def forever(argv):
            while True:
                pass
        outcome, detail, seconds = self.outcome(tmp_path, monkeypatch, forever)
        assert outcome == "hang" and 0.5 <= seconds < 5, (outcome, seconds)

    def test_an_exception_that_catches_everything_does_not_hide_a_hang(self, tmp_path, monkeypatch):
        def swallowing(argv):
            while True:
                try:
                    sum(range(10**6))
                except Exception:  # noqa: BLE001 - the point
                    pass
        assert self.outcome(tmp_path, monkeypatch, swallowing)[0] == "hang"

    def test_an_escaping_exception_is_a_traceback(self, tmp_path, monkeypatch):
        def boom(argv):
            raise KeyError("boom")
        outcome, detail, _ = self.outcome(tmp_path, monkeypatch, boom)
        assert outcome == "traceback" and "KeyError: 'boom'" in detail

    @pytest.mark.parametrize("printed,code", [("", 1), ('{"valid": true}\n{"valid": true}\n', 0),
                                              ("not json\n", 1), ('{"valid": true, "errors": []}\n', 1),
                                              ('{"valid": false, "errors": []}\n', 1)])
    def test_anything_but_one_consistent_json_line_is_bad_output(self, tmp_path, monkeypatch, printed, code):
        def fake(argv):
            print(printed, end="")
            return code
        assert self.outcome(tmp_path, monkeypatch, fake)[0] == "bad_output"

    def test_a_good_answer_is_ok(self, tmp_path, monkeypatch):
        def good(argv):
            print('{"valid": false, "errors": ["g.yaml: nope"]}')
            return 1
        assert self.outcome(tmp_path, monkeypatch, good)[:2] == ("ok", "")

    def test_a_timer_already_running_is_set_again(self, tmp_path, monkeypatch):
        fired = []
        previous = signal.signal(signal.SIGALRM, lambda *_: fired.append(1))
        try:
            signal.setitimer(signal.ITIMER_REAL, 30.0)
            import omnigraph.cli
            monkeypatch.setattr(omnigraph.cli, "main", lambda argv: print('{"valid": true}') or 0)
            path = tmp_path / "g.yaml"
            path.write_text("name: x\n")
            assert check_document(path, time_limit_s=5.0)[0] == "ok"
            left, _ = signal.getitimer(signal.ITIMER_REAL)
            assert 25.0 < left <= 30.0 and not fired
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
