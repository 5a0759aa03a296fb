"""Built-in tasks and rule-based rewards: deterministic streams, disjoint splits, the scores."""

import pytest

from nodes.rewards.rules import arithmetic_reward, digits_match
from omnigraph import plugins
from nodes.tasks.procedural import Arithmetic, Digits


@pytest.mark.parametrize("cls", [Digits, Arithmetic])
def test_streams_are_deterministic_and_the_eval_split_is_held_out(cls):
    task = cls(prompts=16, seed=3, eval_prompts=40)
    assert [p.text for p in task.batch(5)] == [p.text for p in cls(prompts=16, seed=3).batch(5)]
    assert [p.text for p in task.batch(5)] != [p.text for p in task.batch(6)]
    train = {p.text for t in range(30) for p in task.batch(t)}
    held = {p.text for p in task.eval_set()}
    assert len(held) > 5 and not train & held


def test_arithmetic_targets_are_the_sums_and_it_is_a_chat_task():
    task = plugins.load("tasks", "arithmetic")(prompts=8, seed=0)
    assert task.chat and task.SYSTEM
    for p in task.batch(0):
        a, b = (int(x) for x in p.text.removeprefix("What is ").split("?")[0].split(" + "))
        assert p.meta["target"] == str(a + b)


@pytest.mark.parametrize("completion, score", [
    ("27", 1.0), (" 27\n", 1.0), ("13 + 14 = 27", 0.8), ("The answer is 27.", 0.8),
    ("25", 0.2), ("27 or 28", 0.0), ("", 0.0), ("twenty-seven", 0.0)])
def test_arithmetic_reward_is_exact_match_plus_format(completion, score):
    assert arithmetic_reward("What is 13 + 14?", completion, target="27") == pytest.approx(score)


def test_digits_match_gives_partial_credit_in_place():
    assert digits_match("copy 4071:", " 4071", target="4071") == 1.0
    assert digits_match("copy 4071:", " 4000", target="4071") == 0.5
    assert digits_match("copy 4071:", "", target="4071") == 0.0


def test_a_chat_task_on_a_model_without_a_chat_template_is_a_clear_error():
    import omnigraph as og
    from omnigraph.sdk import ConfigError
    from omnigraph.testing import build_node, prompts
    from conftest import GRAPHS
    spec = og.load(GRAPHS / "grpo_sync.yaml", ["task.name=arithmetic", "task.prompts=4"])
    gen, _ = build_node(spec, "generate")
    with pytest.raises(ConfigError, match="chat messages but the tokenizer of 'tiny' has no chat template"):
        gen.encode(prompts(spec, 0)[0])


def test_loading_a_model_prints_no_progress_bars(capfd):
    """``--executor local`` printed transformers' "Loading weights" bars: loading a model shows none, and leaves
    the bars as they were."""
    from transformers.utils import logging as hf_logging
    from nodes.models import load
    path = plugins.model_dir("tiny")
    was = hf_logging.is_progress_bar_enabled()
    hf_logging.enable_progress_bar()
    try:
        capfd.readouterr()
        load(path)
        out, err = capfd.readouterr()
        assert "Loading weights" not in out + err and "it/s" not in err, err
        assert hf_logging.is_progress_bar_enabled()
    finally:
        if not was:
            hf_logging.disable_progress_bar()


def test_a_local_run_prints_no_progress_bars_at_its_final_save(tmp_path):
    """The final weights were written under transformers' "Writing model shards" bar, even with --quiet."""
    import subprocess
    import sys
    from pathlib import Path
    exe = str(Path(sys.executable).with_name("omnigraph"))
    graph = Path(__file__).resolve().parents[1] / "graphs" / "grpo_one_step_off.yaml"
    out = subprocess.run([exe, "run", str(graph), "schedule.iterations=1", "nodes.generate.eval_every=0",
                          "--executor", "local", "--quiet", "--run-dir", str(tmp_path)],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "Writing model shards" not in out.stderr + out.stdout and "it/s]" not in out.stderr, out.stderr
    (run_dir,) = tmp_path.iterdir()
    assert (run_dir / "final" / "model.safetensors").exists()
