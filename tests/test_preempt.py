"""Preemption: a signal checkpoints and stops the run, and the same command continues it.

Real runs of the CLI in a subprocess: the signal is sent while steps are running, the process must
end within the grace period with exit code 75 and a checkpoint, leave no process behind, and the
job script run again must continue the run to the metrics and final weights of an uninterrupted one.
"""

import json
import signal
import time
from pathlib import Path

import pytest
import torch

from omnigraph.cli import main
from omnigraph.runtime.interrupt import EXIT_PREEMPTED, EXIT_STOPPED

from cli_process import omnigraph
from conftest import GRAPHS

KEYS = ("step", "reward_mean", "staleness_max", "version", "loss", "grad_norm", "entropy", "fired")
SYNTH = str(GRAPHS / "synthetic_one_step_off.yaml")


def stepped(parent: Path, n: int):
    """True once a run under ``parent`` has written ``n`` steps."""
    return lambda: any(p.read_text().count("\n") >= n for p in parent.glob("*/metrics.jsonl"))


def stalled(parent: Path, n: int, quiet_s: float = 1.5):
    """True once a run under ``parent`` has written ``n`` steps and no step for ``quiet_s`` (it hangs)."""
    def check() -> bool:
        files = [p for p in parent.glob("*/metrics.jsonl") if p.read_text().count("\n") >= n]
        return any(time.time() - p.stat().st_mtime > quiet_s for p in files)
    return check


def metrics(d: Path):
    return [{k: r.get(k) for k in KEYS} for r in map(json.loads, (d / "metrics.jsonl").read_text().splitlines())]


AGENT = ["nodes.generate.env=null",        # the copy_chain episodes played by an agent program, over HTTP
         f"nodes.generate.agent={{entry: '{GRAPHS.parent / 'examples' / 'agents' / 'copy_chain.py'}:solve', "
         "max_tokens: 40, batch_wait_s: 10}"]

LOOKER = [f"nodes.generate.agent={{entry: '{Path(__file__).parent / 'agent_programs.py'}:looks_twice', "
          "max_tokens: 64, batch_wait_s: 10}"]       # an agent shown the task's picture twice


GRID = ["model.path={grid}"]     # a Qwen2.5-VL (random weights, built in the test): pictures placed by 3-D positions


@pytest.mark.slow
@pytest.mark.parametrize("graph, executor, extra", [
    ("grpo_one_step_off", "local", []), ("grpo_one_step_off", "ray", []),
    ("grpo_partial", "local", []),                   # unfinished groups in the checkpoint
    ("vlm_one_step_off", "ray", []),                 # pictures in the prompts, a batch of them in the checkpoint
    ("vlm_one_step_off", "local", [                  # prompts with pictures unfinished in the checkpoint
        "nodes.generate.partial={budget_tokens: 2, max_spans: 4}", "schedule.max_staleness=4"]),
    ("grpo_multiturn", "ray", AGENT),                # agent programs: the same episodes after the resume
    ("grpo_multiturn", "local", AGENT + [            # agents in flight in the checkpoint, run again from it
        "nodes.generate.partial={budget_tokens: 4, max_spans: 3}", "schedule.max_staleness=3"]),
    ("vlm_one_step_off", "ray", LOOKER),             # agents with pictures, a batch of their episodes in the checkpoint
    ("vlm_one_step_off", "local", LOOKER + [         # agents with pictures in flight in the checkpoint
        "nodes.generate.partial={budget_tokens: 2, max_spans: 4}", "schedule.max_staleness=4"]),
    ("vlm_one_step_off", "local", GRID + [           # a patch-grid model's prompts unfinished in the checkpoint,
        "nodes.generate.partial={budget_tokens: 2, max_spans: 4}", "schedule.max_staleness=4",
        "model.freeze=[vision]"])])                  # its frozen tower's output kept (not checkpointed)
def test_sigterm_checkpoints_and_the_same_command_continues_to_the_same_weights(tmp_path, graph, executor, extra):
    if GRID[0] in extra:
        from nodes.zoo import grid_vl
        extra = [x.replace("{grid}", str(grid_vl.build(tmp_path / "grid-vl"))) for x in extra]
    job = ["run", str(GRAPHS / f"{graph}.yaml"), "schedule.iterations=9", "nodes.generate.eval_every=0",
           "runtime.grace_s=60", *extra, "--executor", executor, "--quiet"]
    code, _, err, _, _, _ = omnigraph(job + ["--run-dir", str(tmp_path / "whole")])
    assert code == 0, err
    (whole,) = (tmp_path / "whole").iterdir()

    parent = tmp_path / "job"
    code, _, err, took, alive, _ = omnigraph(job + ["--run-dir", str(parent)], [(stepped(parent, 3), signal.SIGTERM)])
    assert code == EXIT_PREEMPTED, err
    (d,) = parent.iterdir()
    done = (d / "metrics.jsonl").read_text().count("\n")
    assert 3 <= done < 10, "the signal came after the run's end: nothing was preempted"
    assert took < 60, f"took {took:.1f} s, past runtime.grace_s"
    assert [p.name for p in (d / "checkpoints").iterdir()] == [f"step-{done - 1:08d}"]
    lines = err.strip().splitlines()
    assert lines[-2] == (f"preempted (SIGTERM): stopped after step {done - 1} ({done} of 10 done); "
                         f"checkpoint step-{done - 1:08d} in {d}")
    assert lines[-1].startswith(f"continue with: omnigraph run --resume {d}")
    assert "Traceback" not in err and "SIGTERM received" not in err     # not Ray's stack dump
    assert not alive, f"left behind: {alive}"
    if "partial" in graph or any("partial" in x for x in extra):      # the checkpoint holds work in flight
        rows = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]
        assert [r.get("carried_groups_out") for r in rows if r["step"] == done - 1][0] > 0

    code, out, err, _, _, _ = omnigraph(job + ["--run-dir", str(parent)])    # the job, requeued unchanged
    assert code == 0, err
    assert f"continuing {d}" in out and [p.name for p in parent.iterdir()] == [d.name]
    assert metrics(d) == metrics(whole)
    from safetensors.torch import load_file
    a, b = load_file(whole / "final" / "model.safetensors"), load_file(d / "final" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    from omnigraph.runtime.ledger import read
    s = read(d)
    assert s.ok and s.generated == s.trained_once == read(whole).trained_once


def test_a_hanging_step_ends_at_once_after_the_grace_period(tmp_path):
    """The signal is honoured at the next step boundary; a step that never ends is cut at runtime.grace_s."""
    code, _, err, took, alive, _ = omnigraph(
        ["run", SYNTH, "schedule.iterations=10000", "checkpoint.every=2", "runtime.grace_s=3", "--quiet",
         "--run-dir", str(tmp_path)], [(stalled(tmp_path, 2), signal.SIGTERM)], {"OMNIGRAPH_INJECT": "update@4:hang"})
    assert code == EXIT_STOPPED, err
    assert 3 <= took < 30, took
    assert "interrupt: the grace period (runtime.grace_s) is over: stopping at once" in err
    (d,) = tmp_path.iterdir()
    newest = sorted(p.name for p in (d / "checkpoints").iterdir())[-1]
    assert f"its newest checkpoint is {newest}" in err and f"continue with: omnigraph run --resume {d}" in err
    assert "Traceback" not in err and not alive, alive


def test_a_second_signal_stops_at_once(tmp_path):
    sent = []

    def after_the_first() -> bool:
        sent.append(time.monotonic())
        return time.monotonic() - sent[0] > 1.0
    code, _, err, took, alive, _ = omnigraph(
        ["run", SYNTH, "schedule.iterations=10000", "runtime.grace_s=300", "--quiet", "--executor", "local",
         "--run-dir", str(tmp_path)],
        [(stalled(tmp_path, 1), signal.SIGTERM), (after_the_first, signal.SIGINT)], {"OMNIGRAPH_INJECT": "update@3:hang"})
    assert code == EXIT_STOPPED, err
    assert took < 30 and "it has no checkpoint (a resume starts over)" in err and "Traceback" not in err
    assert not alive


def test_the_early_warning_signal_is_configurable(tmp_path):
    code, _, err, _, _, _ = omnigraph(
        ["run", SYNTH, "schedule.iterations=10000", "runtime.preempt_signal=USR1", "--quiet", "--executor", "local",
         "--run-dir", str(tmp_path)], [(stepped(tmp_path, 2), signal.SIGUSR1)])
    assert code == EXIT_PREEMPTED, err
    assert "preempted (SIGUSR1): stopped after step" in err


class TestRequeue:
    ARGS = ["--executor", "local", "--quiet"]

    def preempted_run(self, tmp_path, *over) -> Path:
        code, _, err, _, _, _ = omnigraph(["run", SYNTH, "schedule.iterations=10000", *over, *self.ARGS,
                                        "--run-dir", str(tmp_path)], [(stepped(tmp_path, 2), signal.SIGTERM)])
        assert code == EXIT_PREEMPTED, err
        (d,) = tmp_path.iterdir()
        return d

    def test_other_settings_on_a_run_directory_are_refused_naming_the_fields(self, tmp_path, capsys):
        d = self.preempted_run(tmp_path)
        assert main(["run", SYNTH, "schedule.iterations=20", "runtime.seed=3", *self.ARGS, "--run-dir", str(d)]) == 1
        err = capsys.readouterr().err
        assert err.startswith(f"error: --run-dir: {d} is a run of other settings (")
        assert "schedule.iterations: run 10000, now 20; runtime.seed: run 0, now 3)" in err and "fix: " in err
        assert "Traceback" not in err

    def test_other_settings_in_the_parent_start_a_new_run(self, tmp_path):
        d = self.preempted_run(tmp_path)
        assert main(["run", SYNTH, "schedule.iterations=3", *self.ARGS, "--run-dir", str(tmp_path)]) == 0
        assert len(list(tmp_path.iterdir())) == 2 and not (d / "summary.json").exists()

    def test_fresh_starts_a_new_run(self, tmp_path):
        old = self.preempted_run(tmp_path, "schedule.iterations=10000")
        steps = len(metrics(old))

        def new_run_stepping() -> bool:
            return sum(p.read_text().count("\n") for p in tmp_path.glob("*/metrics.jsonl")) >= steps + 2
        code, _, err, _, _, _ = omnigraph(["run", SYNTH, "schedule.iterations=10000", *self.ARGS, "--fresh",
                                        "--run-dir", str(tmp_path)], [(new_run_stepping, signal.SIGTERM)])
        assert code == EXIT_PREEMPTED and len(list(tmp_path.iterdir())) == 2, err

    def test_a_finished_run_directory_is_refused(self, tmp_path, capsys):
        assert main(["run", SYNTH, "schedule.iterations=3", *self.ARGS, "--run-dir", str(tmp_path)]) == 0
        (d,) = tmp_path.iterdir()
        assert main(["run", SYNTH, "schedule.iterations=3", *self.ARGS, "--run-dir", str(d)]) == 1
        assert f"{d} is a finished run" in capsys.readouterr().err


def test_a_bad_preempt_signal_names_the_field(capsys):
    assert main(["check", SYNTH, "runtime.preempt_signal=KILL"]) == 1
    assert "runtime.preempt_signal" in capsys.readouterr().err


@pytest.mark.slow
def test_the_documented_slurm_line_requeues_on_the_early_warning_and_the_requeued_job_finishes(tmp_path):
    """The job script line of the runs guide, as written there: overrides after ``--run-dir``; the early-warning
    signal makes ``omnigraph`` exit 75, which calls ``scontrol requeue``; the same line again continues the run to
    its end (exit 0) and requeues nothing."""
    import os
    import subprocess
    import sys

    import psutil

    from conftest import ROOT
    text = (ROOT / "docs" / "guides" / "runs.md").read_text()
    block = next(b for b in text.split("\n\n") if "scontrol requeue" in b)
    line = " ".join(part.strip() for part in block.replace("\\\n", " ").splitlines())
    assert line.startswith("omnigraph run graphs/grpo_one_step_off.yaml --run-dir") and "|| scontrol requeue" in line
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(f'#!/bin/sh\necho "$@" >> {tmp_path / "requeued"}\n')
    (bin_dir / "scontrol").chmod(0o755)
    env = {**os.environ, "SCRATCH": str(tmp_path / "scratch"), "SLURM_JOB_ID": "4242",
           "PATH": os.pathsep.join([str(bin_dir), str(Path(sys.executable).parent), os.environ["PATH"]])}
    job = subprocess.Popen(["bash", "-c", line], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True)
    runs = tmp_path / "scratch" / "runs"
    deadline = time.time() + 300
    while time.time() < deadline and not stepped(runs, 3)():
        time.sleep(0.2)
    for child in psutil.Process(job.pid).children():
        if "omnigraph" in " ".join(child.cmdline()):
            child.send_signal(signal.SIGUSR1)
    out, err = job.communicate(timeout=300)
    assert job.returncode == 0, err[-2000:]                  # 75, then the requeue succeeded
    assert (tmp_path / "requeued").read_text().split() == ["requeue", "4242"], err[-2000:]
    (d,) = runs.iterdir()
    assert (d / "metrics.jsonl").read_text().count("\n") < 61        # stopped short of the end
    again = subprocess.run(["bash", "-c", line], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0 and f"continuing {d}" in again.stdout, again.stderr[-2000:]
    assert (d / "metrics.jsonl").read_text().count("\n") == 61
    assert (tmp_path / "requeued").read_text().split() == ["requeue", "4242"]     # nothing requeued the second time
