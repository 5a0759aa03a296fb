"""The guard against silent corruption (``nodes.nonfinite``): a NaN or inf in rewards, log-probs, advantages,
gradients or received weights is never trained on or loaded; the step is skipped and counted, and after
``runtime.max_nonfinite_steps`` such steps in a row the run stops.

The NaNs come from ``OMNIGRAPH_INJECT``'s ``corrupt`` at the points the nodes mark, in real runs of
``graphs/grpo_one_step_off.yaml`` on the ``local`` executor (the tiny model: about a second a step).
"""

import json

import pytest
import torch

import omnigraph as og
from omnigraph.cli import main
from omnigraph.runtime import run
from omnigraph.testing import build_node

from conftest import GRAPHS

GRAPH = GRAPHS / "grpo_one_step_off.yaml"
FAST = ["runtime.executor=local", "nodes.generate.eval_every=0", "checkpoint.every=null"]


def _checksum(model) -> float:
    return float(sum(p.detach().double().sum() for p in model.parameters()))


def _weights_per_step(monkeypatch, cls, method: str, model_of) -> dict[int, float]:
    """Record a checksum of a node's model right after each call of ``cls.method(step, ...)``."""
    seen: dict[int, float] = {}
    original = getattr(cls, method)

    def wrapped(self, step, *args, **kwargs):
        out = original(self, step, *args, **kwargs)
        seen[step] = _checksum(model_of(self))
        return out

    monkeypatch.setattr(cls, method, wrapped)
    return seen


@pytest.mark.parametrize("fault", ["update@3/advantage:corrupt", "update@3/after_backward:corrupt",
                                   "update@3/logprob:corrupt", "reward@2/rewards:corrupt"])
def test_a_nan_skips_exactly_that_update_and_the_run_finishes(tmp_path, monkeypatch, capsys, fault):
    """A NaN in one advantage, one gradient, one sampler log-prob, or one reward of the batch the update trains
    at step 3 (one-step-off: the reward of step 2): that update is skipped (the weights stay), warned about and
    counted; every other step trains, and the run ends with its final weights."""
    from nodes.trainer.update import Update
    weights = _weights_per_step(monkeypatch, Update, "train", lambda u: u.policy.model)
    monkeypatch.setenv("OMNIGRAPH_INJECT", fault)
    result = run(og.compile(GRAPH, overrides=["schedule.iterations=5", *FAST]), run_dir=tmp_path, progress=False)
    rows = {r["step"]: r for r in result.metrics}
    trained = [s for s in rows if "nonfinite_skipped" in rows[s]]
    assert trained == [1, 2, 3, 4, 5]
    assert [rows[s]["nonfinite_skipped"] for s in trained] == [0, 0, 1, 0, 0]
    assert rows[3]["nonfinite_in_a_row"] == 1 and rows[4]["nonfinite_in_a_row"] == 0
    assert rows[5]["nonfinite_skipped_total"] == 1 and result.summary["nonfinite_skipped"] == 1
    assert "loss" not in rows[3] and "loss" in rows[4]
    assert weights[3] == weights[2]                                      # not trained on
    assert len({weights[s] for s in (1, 2, 4, 5)}) == 4                  # every other step trained
    what = {"advantage": "advantage", "after_backward": "gradients", "logprob": "logprob", "rewards": "reward"}
    point = fault.split("/")[1].split(":")[0]
    err = capsys.readouterr().err
    node = fault.split("@")[0]
    assert f"{node}: step {fault.split('@')[1].split('/')[0]}: 1 non-finite values in {what[point]}" in err
    if node == "reward":
        assert rows[2]["nonfinite_rewards"] == 1 and "update: step 3: " in err
    assert (result.run_dir / "final" / "model.safetensors").exists()


def test_nan_weights_received_at_a_sync_are_not_loaded(tmp_path, monkeypatch, capsys):
    """The weights the rollout receives at step 3 carry a NaN: it keeps the weights it holds (its samples stay
    finite, the trainer trains on), and loads the next ones."""
    from nodes.rollout.hf import Generate
    held = _weights_per_step(monkeypatch, Generate, "generate", lambda g: g.model)
    monkeypatch.setenv("OMNIGRAPH_INJECT", "generate@3/weights:corrupt")
    result = run(og.compile(GRAPH, overrides=["schedule.iterations=5", *FAST]), run_dir=tmp_path, progress=False)
    rows = {r["step"]: r for r in result.metrics}
    assert [rows[s]["nonfinite_weights_skipped"] for s in (2, 3, 4)] == [0, 1, 0]
    assert held[3] == held[2] != held[4]
    assert all(rows[s]["nonfinite_skipped"] == 0 for s in range(1, 6))
    assert "generate: weights version 2: 1 non-finite values in " in capsys.readouterr().err


def test_n_skipped_steps_in_a_row_stop_the_run_naming_the_setting(tmp_path, monkeypatch, capsys):
    """NaN advantages at steps 2, 3 and 4: the third skip in a row (runtime.max_nonfinite_steps: 3) stops the
    run with exit code 1 and a message that names the setting; the metrics of those steps were written."""
    monkeypatch.setenv("OMNIGRAPH_INJECT", ",".join(f"update@{s}/advantage:corrupt" for s in (2, 3, 4)))
    code = main(["run", str(GRAPH), "schedule.iterations=8", *FAST, "--run-dir", str(tmp_path), "--quiet"])
    assert code == 1
    err = capsys.readouterr().err
    assert "error: runtime.max_nonfinite_steps: 3 steps in a row up to step 4" in err
    assert "raise runtime.max_nonfinite_steps (now 3)" in err
    (d,) = tmp_path.iterdir()
    rows = [json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2, 3, 4]
    assert [r.get("nonfinite_in_a_row") for r in rows] == [None, 0, 1, 2, 3]
    assert not (d / "final").exists()


def test_the_count_in_a_row_is_kept_by_the_trainer_state_and_all_ranks_agree_to_skip(monkeypatch):
    """A resume goes on counting (the update's state carries the counts); with several trainer ranks, one
    rank's NaN skips every rank's update (the flag is summed over them)."""
    spec = og.load(GRAPH)
    upd, _ = build_node(spec, "update")
    upd.nonfinite.total, upd.nonfinite.in_a_row = 5, 2
    again, _ = build_node(spec, "update")
    again.load_state_dict(upd.state_dict())
    assert (again.nonfinite.total, again.nonfinite.in_a_row) == (5, 2)

    class Peers:                              # this rank found nothing; another found a NaN
        def all_sum(self, value: float) -> float:
            return value + 1.0
    again.ctx.collectives = Peers()
    assert again._skip(7, {"advantage": 0}) and again.nonfinite.in_a_row == 3
    again.ctx.collectives = None
    assert not again._skip(8, {"advantage": 0})


def test_a_finite_load_is_not_refused():
    from nodes.nonfinite import finite_tensors
    assert finite_tensors([torch.zeros(3), torch.arange(4)])
    assert not finite_tensors([torch.zeros(3), torch.tensor([1.0, float("inf")])])
