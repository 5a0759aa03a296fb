"""Fault injection itself (``OMNIGRAPH_INJECT``): in a first attempt only, or once each over every attempt and
process (``OMNIGRAPH_INJECT_ONCE``), so that a long run meets many faults in turn."""

from __future__ import annotations

import omnigraph as og
from omnigraph.executors.faults import Faults, fired_items
from omnigraph.runtime import run
from omnigraph.runtime.ledger import read

from conftest import GRAPHS

FAULTS = "generate@3:raise, update@6:raise, reward@8:raise"
OVER = ["schedule.iterations=10", "checkpoint.every=2", "runtime.max_restarts=5"]


def test_without_a_once_file_faults_fire_in_the_first_attempt_only(monkeypatch):
    monkeypatch.setenv("OMNIGRAPH_INJECT", FAULTS)
    monkeypatch.setenv("OMNIGRAPH_ATTEMPT", "1")
    assert Faults(0).plan == {}
    monkeypatch.setenv("OMNIGRAPH_ATTEMPT", "0")
    assert len(Faults(0).plan) == 3


def test_with_a_once_file_each_fault_fires_once_in_the_attempt_that_reaches_it(tmp_path, monkeypatch):
    once = tmp_path / "fired.txt"
    monkeypatch.setenv("OMNIGRAPH_INJECT", FAULTS)
    monkeypatch.setenv("OMNIGRAPH_INJECT_ONCE", str(once))
    res = run(og.compile(GRAPHS / "synthetic_one_step_off.yaml", overrides=OVER), run_dir=tmp_path / "r",
              executor="local", progress=False)
    causes = [r["cause"] for r in res.summary["restarts"]]
    assert len(causes) == 3, causes                    # each fault once, each after the restart before it
    for node, step in (("generate", 3), ("update", 6), ("reward", 8)):
        assert any(f"injected fault in {node} at step {step}" in c for c in causes), causes
    assert fired_items(str(once)) == ["generate#*@3/.1:raise", "update#*@6/.1:raise", "reward#*@8/.1:raise"]
    s = read(res.run_dir)
    assert s.ok and s.generated == s.trained_once, s
    monkeypatch.setenv("OMNIGRAPH_ATTEMPT", "0")
    assert Faults(0).plan == {}                        # all fired: a requeued job meets none again
