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
    (["nodes.generate.backend=synthetic", "nodes.generate.cost=1"], "cannot run as a lent copy"),
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


def test_a_lent_plan_runs_on_another_executor_than_it_was_compiled_for(tmp_path):
    """``run(plan, executor=...)`` compiles the graph as given again, not the planner's rewrite (which already has
    the lent nodes, and would get them twice)."""
    plan = og.compile(GRAPH, overrides=["schedule.lend=true", "schedule.iterations=2", *GEN_BOUND])
    assert plan.graph.spec.runtime.executor == "ray"
    result = run(plan, run_dir=tmp_path, executor="local", progress=False)
    assert result.summary["groups_trained"] == 16 * 2
    assert {"generate_lent", "reward_lent"} <= set(result.metrics[-1]["fired"]) | set(result.metrics[-2]["fired"])


def test_a_step_scored_in_two_shares_reports_one_reward_over_all_its_samples():
    from omnigraph.executors.base import StepResult
    from omnigraph.runtime.metrics import step_metrics
    records = [{"node": "reward", "actor": "rollout.0", "seconds": 0.1, "reward_mean": 0.25, "scored": 96},
               {"node": "reward_lent", "actor": "trainer.0", "seconds": 0.1, "reward_mean": 1.0, "scored": 32}]
    row = step_metrics(StepResult(step=3, fired=frozenset({"reward", "reward_lent"}), records=records), 1.0, 0.2)
    assert row["reward_mean"] == pytest.approx((0.25 * 96 + 1.0 * 32) / 128) and row["scored"] == 128
    alone = step_metrics(StepResult(step=3, fired=frozenset({"reward"}), records=records[:1]), 1.0, 0.2)
    assert alone["reward_mean"] == 0.25


def test_the_share_follows_a_stated_or_measured_trainer_speed():
    # the trainer's pool four times as fast per prompt: k = 16 * 1.25 / (2.1 + 0.25 * 2.1) = 7.6 -> 8
    stated = og.compile(GRAPH, overrides=["schedule.lend=true", "schedule.lend_speed=0.25", *GEN_BOUND])
    assert stated.lend["lent_prompts"] == 8 and stated.lend["speed_from"] == "schedule.lend_speed"
    assert "x0.25 the rollout's time per prompt (schedule.lend_speed)" in str(stated)
    costs = {"generate": 2.0, "reward": 0.1, "old_logprob": 0.2, "update": 0.6, "sync": 0.05}
    measured = og.compile(GRAPH, overrides=["schedule.lend=true"],
                          timings={**costs, "generate_lent": 0.5, "reward_lent": 0.025})
    assert measured.lend["lent_prompts"] == 8 and measured.lend["speed_from"] == "measured"
    assert measured.lend["speed"] == pytest.approx(0.25)
    by_devices = og.compile(GRAPH, overrides=["schedule.lend=true"], timings=costs)
    assert by_devices.lend["lent_prompts"] == 5 and by_devices.lend["speed_from"] == "devices"


def test_a_lent_runs_node_times_are_given_for_whole_steps(tmp_path):
    from omnigraph.planning.compile import to_spec
    from omnigraph.planning.whatif import node_times, steady_medians
    plan = og.compile(GRAPH, overrides=["schedule.lend=true", "schedule.iterations=6", "runtime.executor=local",
                                        *GEN_BOUND])
    d = run(plan, run_dir=tmp_path, progress=False).run_dir
    raw = steady_medians([json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()], plan.fill)
    timings, *_ = node_times(to_spec(GRAPH), d)
    assert timings["generate"] == pytest.approx(raw["generate"] * 16 / 11 + raw.get("apply_weights", 0.0))
    assert timings["generate_lent"] == pytest.approx(raw["generate_lent"] * 16 / 5)
    assert timings["reward_lent"] == pytest.approx(raw["reward_lent"] * 16 / 5)
    assert timings["update"] == pytest.approx(raw["update"])
    again = og.compile(GRAPH, overrides=["schedule.lend=true"], timings=timings)
    assert again.lend["speed_from"] == "measured"


@pytest.mark.slow
def test_a_lent_run_resumes_bit_exact(tmp_path, monkeypatch):
    """Interrupted at step 7, resumed from its step-5 checkpoint: the same metrics and final weights as a lent run
    that was never interrupted (the lent generator's weights come from the restored trainer)."""
    import torch
    from safetensors.torch import load_file
    from omnigraph.errors import NodeFailure
    from omnigraph.runtime.ledger import read
    on = ["schedule.lend=true", "schedule.iterations=9", "checkpoint.every=3", "runtime.executor=local",
          "nodes.generate.eval_every=0", *GEN_BOUND]
    whole = run(og.compile(GRAPH, overrides=on), run_dir=tmp_path / "a", progress=False).run_dir
    monkeypatch.setenv("OMNIGRAPH_INJECT", "update@7:raise")
    with pytest.raises(NodeFailure):
        run(og.compile(GRAPH, overrides=on), run_dir=tmp_path / "b", progress=False)
    monkeypatch.delenv("OMNIGRAPH_INJECT")
    (d,) = (tmp_path / "b").iterdir()
    assert "step-00000005" in {p.name for p in (d / "checkpoints").iterdir()}
    run(og.compile(d / "config.yaml"), resume=d, progress=False)
    keys = ("reward_mean", "staleness_mean", "version", "loss", "fired")

    def rows(x):
        return [{k: r.get(k) for k in keys} for r in map(json.loads, (x / "metrics.jsonl").read_text().splitlines())]

    assert rows(d) == rows(whole)
    a, b = load_file(whole / "final" / "model.safetensors"), load_file(d / "final" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    s = read(d)
    assert s.ok and s.generated == s.trained_once == 9 * 16
