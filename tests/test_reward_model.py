"""A reward model as a node: tiny-rm (a learned proxy of digits_match) scores on a pool of its own, beside the
trainer's old_logprob, and the update joins the branches; RL against the proxy raises the gold reward too."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import omnigraph as og
from omnigraph.runtime import run
from omnigraph.runtime.ledger import read
from omnigraph.testing import initial_reward

from conftest import GRAPHS, ROOT

EXE = shutil.which("omnigraph", path=str(Path(sys.executable).parent)) or "omnigraph"
RM_GRAPH = GRAPHS / "grpo_reward_model.yaml"


def check(*overrides):
    return subprocess.run([EXE, "check", str(RM_GRAPH), *overrides], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)


class TestInvalid:
    def test_fn_and_model_together_are_one_error_naming_fn(self):
        p = check("nodes.score.fn=digits_match")
        assert p.returncode == 1 and p.stderr.count("\n") == 1 and "Traceback" not in p.stderr
        assert "nodes.score.fn: fn and model are exclusive" in p.stderr and "gold:" in p.stderr

    def test_a_missing_reward_model_is_one_error_naming_model(self):
        p = check("nodes.score.model=/no/such/rm")
        assert p.returncode == 1 and p.stderr.count("\n") == 1 and "Traceback" not in p.stderr
        assert "nodes.score.model: '/no/such/rm' is neither a registered model nor a Hugging Face model" in p.stderr
        assert "tiny-rm" in p.stderr

    def test_a_model_without_a_classification_head_is_refused(self, tmp_path):
        (tmp_path / "config.json").write_text(json.dumps({"architectures": ["Qwen2ForCausalLM"]}))
        with pytest.raises(og.GraphError, match=r"nodes.score.model: .* has no sequence-classification head "
                                                r"\(architectures: Qwen2ForCausalLM\)"):
            og.compile(RM_GRAPH, overrides=[f"nodes.score.model={tmp_path}"])

    def test_model_with_the_python_backend_and_gold_without_a_model_are_refused(self):
        with pytest.raises(og.GraphError, match="nodes.score.model: a reward model is scored by backend model"):
            og.compile(RM_GRAPH, overrides=["nodes.score.backend=python"])
        with pytest.raises(og.GraphError, match="nodes.reward.gold: gold is logged beside a reward model"):
            og.compile(GRAPHS / "grpo_one_step_off.yaml", overrides=["nodes.reward.gold=digits_match"])


class TestPlan:
    def test_model_selects_the_backend_and_the_update_joins_the_branches(self):
        plan = og.compile(RM_GRAPH)
        assert plan.graph.nodes["score"].backend == "model" and plan.graph.spec.nodes["score"].fn is None
        assert "join update.batch <- score, old_logprob" in str(plan)
        assert [t.label for t in plan.order["rm.0"]] == ["score"]              # the reward model's own actor
        delayed = sorted((e.src, e.dst) for e in plan.graph.edges if e.delay and not e.state)
        assert delayed == [("generate", "old_logprob"), ("score", "update")] and plan.bound == 1


class TestNode:
    def test_scores_do_not_depend_on_padding_or_micro_batches(self):
        """Right padding and pad_token_id: last-token pooling reads each row's own last token."""
        from omnigraph.testing import build_node
        node, _ = build_node(og.load(RM_GRAPH, ["nodes.score.micro_batch_size=3"]), "score")
        prompts = ["copy 4071:", "copy 123:", "copy 98765:", "copy 555:"]
        completions = [" 4071", " 1", " 98765 and more", ""]
        together = node.rewards(prompts, completions)
        alone = [node.rewards([p], [c])[0] for p, c in zip(prompts, completions)]
        assert together == pytest.approx(alone, abs=1e-5)
        assert together[0] > 0.6 > together[1]                               # a right copy beats a wrong one


@pytest.mark.slow
def test_rl_against_the_reward_model_raises_the_gold_reward(tmp_path):
    """30 steps on the local executor (about a minute here, tiny-rm's build included once)."""
    plan = og.compile(RM_GRAPH, overrides=["schedule.iterations=30", "runtime.executor=local"])
    res = run(plan, run_dir=tmp_path, progress=False)
    rows = [r for r in res.metrics if "reward_mean" in r]
    assert len(rows) == 30 and all("rm_s" in r for r in rows)

    def mean(key, part):
        return sum(r[key] for r in part) / len(part)
    rm, gold = (mean("reward_mean", rows[:5]), mean("reward_mean", rows[-5:])), \
        (mean("gold_reward_mean", rows[:5]), mean("gold_reward_mean", rows[-5:]))
    assert rm[1] >= rm[0] + 0.2, rm                                          # the proxy is optimised
    start = initial_reward(res.metrics, "gold_reward_mean")      # the batches of the initial weights
    assert start <= 0.3 and gold[1] >= start + 0.3, (start, gold)   # and the true reward rises with it                # and the true reward rises with it
    ledger = read(res.run_dir)
    assert ledger.ok and ledger.trained_once == 30 * 16 and res.summary["observed_max_staleness"] <= 1
    timeline = [json.loads(line) for line in (res.run_dir / "timeline.jsonl").read_text().splitlines()]
    assert {r["actor"] for r in timeline if r["node"] == "score"} == {"rm.0"}
