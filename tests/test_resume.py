"""Checkpoints and exact resume: an interrupted run, resumed, equals an uninterrupted one."""

import json
from pathlib import Path

import pytest
import torch

import omnigraph as og
from omnigraph.errors import GraphError, NodeFailure
from omnigraph.runtime.ledger import read
from omnigraph.runtime import run

from conftest import GRAPHS

KEYS = ("reward_mean", "staleness_max", "version", "loss", "grad_norm", "entropy", "fired")


def compile_(graph, *extra):
    return og.compile(GRAPHS / graph, overrides=["schedule.iterations=9", "checkpoint.every=3", "runtime.executor=local",
                                                 "nodes.generate.eval_every=0", *extra])


def interrupted(graph, tmp_path, monkeypatch, fault="update@7:raise", *extra):
    """Run until the injected fault stops it; return the run directory."""
    monkeypatch.setenv("OMNIGRAPH_INJECT", fault)
    with pytest.raises(NodeFailure):
        run(compile_(graph, *extra), run_dir=tmp_path / "b", progress=False)
    monkeypatch.delenv("OMNIGRAPH_INJECT")
    (d,) = (tmp_path / "b").iterdir()
    return d


def resume(d):
    return run(og.compile(d / "config.yaml"), resume=d, progress=False)


def metrics(d: Path):
    return [{k: r.get(k) for k in KEYS} for r in map(json.loads, (d / "metrics.jsonl").read_text().splitlines())]


@pytest.mark.slow
@pytest.mark.parametrize("executor", ["local", "ray", "ray-tasks"])
def test_resume_is_bit_exact_for_real_training(tmp_path, monkeypatch, request, executor):
    """Interrupted at step 7 and resumed from the step-5 checkpoint: the metrics and the final weights are
    bit-identical to an uninterrupted run's, on every executor."""
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    if executor != "local":
        request.getfixturevalue("ray_session")      # the three runs join one cluster, not three of their own
    on = f"runtime.executor={executor}"
    whole = run(compile_("grpo_one_step_off.yaml", on), run_dir=tmp_path / "a", progress=False).run_dir
    d = interrupted("grpo_one_step_off.yaml", tmp_path, monkeypatch, "update@7:raise", on)
    assert sorted(p.name for p in (d / "checkpoints").iterdir()) == ["step-00000002", "step-00000005"]
    resume(d)
    assert metrics(d) == metrics(whole)
    from safetensors.torch import load_file
    a, b = load_file(whole / "final" / "model.safetensors"), load_file(d / "final" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    s = read(d)
    assert s.ok and s.generated == s.trained_once == 9 * 16


def test_a_corrupt_newest_checkpoint_falls_back_to_the_previous(tmp_path, monkeypatch, capsys):
    whole = run(compile_("synthetic_one_step_off.yaml"), run_dir=tmp_path / "a", progress=False).run_dir
    d = interrupted("synthetic_one_step_off.yaml", tmp_path, monkeypatch)
    newest = sorted((d / "checkpoints").iterdir())[-1]
    victim = next(newest.glob("*.pkl"))
    victim.write_bytes(victim.read_bytes()[:-10] + b"corrupted!")
    resume(d)
    assert "step-00000005 is damaged (" in capsys.readouterr().out
    assert metrics(d) == metrics(whole)
    assert read(d).ok


def test_a_checkpoint_of_another_graph_is_refused(tmp_path, monkeypatch):
    d = interrupted("synthetic_one_step_off.yaml", tmp_path, monkeypatch)
    before = {p: p.read_bytes() for p in d.rglob("*") if p.is_file()}
    cfg = d / "config.yaml"
    cfg.write_text(cfg.read_text().replace("iterations: 9", "iterations: 10"))
    with pytest.raises(GraphError, match="belongs to another graph"):
        resume(d)
    after = {p: p.read_bytes() for p in d.rglob("*") if p.is_file()}
    assert {p: v for p, v in after.items() if p != cfg} == {p: v for p, v in before.items() if p != cfg}


def test_resume_without_a_checkpoint_starts_over(tmp_path, monkeypatch):
    d = interrupted("synthetic_one_step_off.yaml", tmp_path, monkeypatch, "generate@1:raise")
    assert not (d / "checkpoints").exists() or not any((d / "checkpoints").iterdir())
    resume(d)
    assert read(d).ok and read(d).generated == 9 * 8


def test_a_full_disk_stops_with_a_clear_message_and_keeps_the_run(tmp_path, monkeypatch):
    import errno
    from omnigraph.runtime.rundir import RunFiles

    real = RunFiles.write
    calls = {"n": 0}

    def full(self, name, obj):
        calls["n"] += 1
        if calls["n"] > 20:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(self, name, obj)

    monkeypatch.setattr(RunFiles, "write", full)
    with pytest.raises(GraphError, match=r"cannot write to the run directory: No space left on device .*--resume"):
        run(compile_("synthetic_one_step_off.yaml"), run_dir=tmp_path, progress=False)
    monkeypatch.setattr(RunFiles, "write", real)
    (d,) = tmp_path.iterdir()
    resume(d)
    assert read(d).ok and read(d).generated == 9 * 8
