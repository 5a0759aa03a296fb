"""``schedule.lend``: a generator on the trainer's pool fills its idle window; the proof and the plan cover it."""

import json

import pytest

import omnigraph as og
from omnigraph.cli import main
from omnigraph.runtime import run

from conftest import GRAPHS

GRAPH = str(GRAPHS / "grpo_one_step_off.yaml")
GEN_BOUND = ["nodes.generate.cost=2.0", "nodes.reward.cost=0.1", "nodes.old_logprob.cost=0.2",
             "nodes.update.cost=0.6", "nodes.sync.cost=0.05"]


def test_lending_adds_a_generator_on_the_trainer_pool_with_fresh_weights_and_the_bound_holds():
    plan = og.compile(GRAPH, overrides=["schedule.lend=true", *GEN_BOUND])
    nodes = plan.graph.nodes
    assert nodes["generate_lent"].pool == "trainer" and nodes["reward_lent"].pool == "trainer"
    delays = {(e.src, e.dst): e.delay for e in plan.graph.edges}
    assert delays[("sync", "generate_lent")] == 0 and delays[("sync", "generate")] == 1
    assert delays[("reward_lent", "old_logprob")] == delays[("reward", "old_logprob")] == 1
    assert plan.bound == 1
    # rollout 2.1 s a step, trainer 0.85: idle 1.25 s; k = 16 * 1.25 / (2.1 * 2) = 4.76 -> 5 prompts lent
    assert plan.lend["lent_prompts"] == 5 and plan.lend["idle_fraction"] == pytest.approx(0.595, abs=1e-3)
    assert nodes["generate"].spec.prompt_share == (0, 11) and nodes["generate_lent"].spec.prompt_share == (11, 16)
    text = str(plan)
    assert "generate_lent on trainer samples prompts 11..15" in text and "staleness 0" in text
    assert "shares of one step's prompt groups, concatenated" in text
    assert not any("no overlap" in w for w in plan.warnings)
    alone = og.compile(GRAPH, overrides=GEN_BOUND)
    assert plan.prediction.step_s < 0.75 * alone.prediction.step_s, (plan.prediction.step_s, alone.prediction.step_s)


def test_auto_lends_only_when_the_trainer_is_idle_long_enough():
    assert og.compile(GRAPH, overrides=["schedule.lend=auto", *GEN_BOUND]).lend["lent_prompts"] == 5
    trainer_bound = og.compile(GRAPH, overrides=["schedule.lend=auto", "nodes.generate.cost=0.5",
                                                 "nodes.update.cost=0.6"])
    assert trainer_bound.lend["lent_prompts"] == 0 and "generate_lent" not in trainer_bound.graph.nodes
    assert "not lent (auto): the trainer is predicted idle 0%" in str(trainer_bound)
    assert og.compile(GRAPH).lend is None                          # off by default: the shipped graph as it was


@pytest.mark.parametrize("override, words", [
    (["schedule.mode=sync", "edges=[generate -> reward, reward -> old_logprob, old_logprob -> update, "
      "update -> sync, sync -> generate]", "schedule.max_staleness=0"], "sync schedule"),
    (["pools.rollout.actors=2"], "one rollout actor"),
    (["nodes.generate.backend=synthetic", "nodes.generate.cost=1"], "backend hf"),
])
def test_lending_where_it_cannot_be_done_is_one_message(capsys, override, words):
    capsys.readouterr()
    assert main(["check", GRAPH, "schedule.lend=true", *override]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: schedule.lend: ") and words in err and "Traceback" not in err


def test_a_lent_run_trains_every_group_once_and_its_share_at_staleness_zero(tmp_path):
    plan = og.compile(GRAPH, overrides=["schedule.lend=true", "schedule.iterations=5", "runtime.executor=local",
                                        *GEN_BOUND])
    result = run(plan, run_dir=tmp_path, progress=False)
    rows = [json.loads(x) for x in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    trained = [r for r in rows[2:] if "staleness_mean" in r]
    # 11 of 16 prompt groups one version stale (the rollout's), 5 at staleness 0 (the lent generator's)
    assert trained and all(r["staleness_mean"] == pytest.approx(11 / 16) for r in trained), trained
    assert all(r["samples"] == 16 * 8 for r in trained)
    assert result.summary["groups_trained"] == 16 * 5 and not result.summary.get("groups_lost")


def test_a_step_scored_in_two_shares_reports_one_reward_over_all_its_samples():
    from omnigraph.executors.base import StepResult
    from omnigraph.runtime.metrics import step_metrics
    records = [{"node": "reward", "actor": "rollout.0", "seconds": 0.1, "reward_mean": 0.25, "scored": 96},
               {"node": "reward_lent", "actor": "trainer.0", "seconds": 0.1, "reward_mean": 1.0, "scored": 32}]
    row = step_metrics(StepResult(step=3, fired=frozenset({"reward", "reward_lent"}), records=records), 1.0, 0.2)
    assert row["reward_mean"] == pytest.approx((0.25 * 96 + 1.0 * 32) / 128) and row["scored"] == 128
    alone = step_metrics(StepResult(step=3, fired=frozenset({"reward"}), records=records[:1]), 1.0, 0.2)
    assert alone["reward_mean"] == 0.25
