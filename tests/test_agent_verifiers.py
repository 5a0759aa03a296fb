"""A verifiers 0.4 environment trained as it is: ``examples/agents/verifiers_agent.py`` runs in a virtualenv of
its own (built here from the package index, once, and cached), as a command agent, against the rollout's
endpoint. Nothing of omnigraph is importable there, and no data comes from a hub."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from nodes.models import cache_root

from test_agents import generator, run

HERE = Path(__file__).resolve().parent
AGENT = HERE.parent / "examples" / "agents" / "verifiers_agent.py"
VERSION = "0.4.0"


def verifiers_venv() -> Path:
    """``$OMNIGRAPH_CACHE/venvs/verifiers-VERSION``, built on first use (atomically: a half-built one is never
    taken for a built one)."""
    venv = cache_root() / "venvs" / f"verifiers-{VERSION}"
    if (venv / "bin" / "python").exists():
        return venv
    part = venv.with_name(venv.name + f".part-{os.getpid()}")
    shutil.rmtree(part, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", str(part)], check=True)
    subprocess.run([str(part / "bin" / "python"), "-m", "pip", "install", "-q", f"verifiers=={VERSION}"], check=True)
    try:
        part.rename(venv)
    except OSError:                      # another process built it meanwhile
        shutil.rmtree(part, ignore_errors=True)
    return venv


@pytest.mark.slow
def test_a_verifiers_environment_runs_unchanged_in_its_own_virtualenv(monkeypatch):
    python = verifiers_venv() / "bin" / "python"
    alone = subprocess.run([str(python), "-c", "import omnigraph"], capture_output=True)
    assert alone.returncode != 0                   # its own environment: omnigraph is not there
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")      # a hub download would fail, not pass unseen
    spec, gen, _ = generator(f"{{command: ['{python}', '{AGENT}'], max_tokens: 96, timeout_s: 240, "
                             "options: {max_tokens: 8, max_turns: 2}}", "task.prompts=1", "task.samples_per_prompt=2")
    batch, agents = run(spec, gen)
    episodes = [m["episode"] for m in batch.fields["meta"]]
    assert [e["status"] for e in episodes] == ["done", "done"], [e["info"] for e in episodes]
    assert all(e["info"]["errors"] == [] and 1 <= e["info"]["turns"] <= 2 for e in episodes)
    assert agents.stats["agent_requests"] == sum(e["info"]["turns"] for e in episodes)
    assert batch.fields["response_mask"].sum() > 0              # what the endpoint sampled is trained
