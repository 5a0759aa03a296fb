"""Proof by an outside package: examples/plugin adds a generate backend, a task and a reward through entry
points, with no edit to omnigraph/ or nodes/; installed into the environment, a graph trains with them."""

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT

PLUGIN = ROOT / "examples" / "plugin"


@pytest.fixture(scope="module")
def installed():
    """pip install -e examples/plugin (no dependencies, no download: it needs only what omnigraph needs)."""
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                           "-e", str(PLUGIN)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return Path(sys.executable).with_name("omnigraph")


def test_the_plugin_imports_only_the_sdk_of_omnigraph():
    for path in (PLUGIN / "omnigraph_example").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            for name in names:
                assert not name.startswith("nodes") and (not name.startswith("omnigraph") or
                                                         name.split(".")[:2] in (["omnigraph", "sdk"], ["omnigraph_example"])
                                                         or name.startswith("omnigraph_example")), (path, name)


def test_check_finds_the_plugins_backend_task_and_reward(installed):
    out = subprocess.run([str(installed), "check", str(PLUGIN / "graph.yaml"), "--json"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    report = json.loads(out.stdout)
    assert out.returncode == 0 and report["valid"] and report["staleness_bound"] == 1, out.stdout + out.stderr
    typo = subprocess.run([str(installed), "check", str(PLUGIN / "graph.yaml"), "nodes.generate.backend=lop"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert typo.returncode == 1 and "did you mean 'loop'" in typo.stderr, typo.stderr


def test_a_misspelt_option_of_the_plugins_task_is_refused_at_check_not_at_run_time(installed, tmp_path):
    """Not a ``TypeError: __init__() got an unexpected keyword argument`` once the actors have started: check
    knows the plugin's keyword arguments, and ``run`` checks before it starts anything."""
    for command in (["check"], ["run", "--run-dir", str(tmp_path)]):
        out = subprocess.run([str(installed), *command, str(PLUGIN / "graph.yaml"), "task.options.max_digit=5"],
                             cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
        assert out.stderr.startswith("error: task.options.max_digit: unknown task even_digits option 'max_digit' "
                                     "(did you mean 'max_digits'?"), out.stderr
    assert not any(tmp_path.iterdir())                    # nothing started, nothing written
    ok = subprocess.run([str(installed), "check", str(PLUGIN / "graph.yaml"), "task.options.max_digits=5"],
                        cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr


@pytest.mark.slow
def test_a_graph_trains_with_the_plugins_backend_task_and_reward(installed, tmp_path):
    out = subprocess.run([str(installed), "run", str(PLUGIN / "graph.yaml"), "schedule.iterations=30", "--quiet",
                          "--run-dir", str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    (run_dir,) = tmp_path.iterdir()
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rewards = [r["reward_mean"] for r in rows if "reward_mean" in r]
    first, last = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    assert last >= first + 0.2, rewards                 # exact copies of even-digit numbers: learned
    assert "generate[loop]" in (run_dir / "plan.txt").read_text()
    ledger = subprocess.run([str(installed), "ledger", str(run_dir), "--json"], capture_output=True, text=True)
    assert json.loads(ledger.stdout)["ok"]
