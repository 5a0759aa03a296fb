"""Multi-turn rollouts (generate: {env: ...}): episodes on the real tiny model, masks, logprobs, overlap."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import omnigraph as og
from omnigraph import testing
from omnigraph.viz.plots import plot_run
from omnigraph.runtime import ledger
from omnigraph.records import read_jsonl
from omnigraph.runtime import run
from omnigraph.sdk import Environment, EnvStep, Weights

ROOT = Path(__file__).resolve().parents[1]
GRAPH = ROOT / "graphs" / "grpo_multiturn.yaml"
EXE = str(Path(sys.executable).with_name("omnigraph"))


class Broken(Environment):
    """Fails on the model's second message."""

    def __init__(self, prompt, **options):
        super().__init__(prompt, **options)
        self.calls = 0

    def step(self, message):                     # a plain function: runs in a worker thread
        self.calls += 1
        if self.calls == 2:
            raise ConnectionError("sandbox went away")
        return EnvStep(observation="copy 11:")


def _episodes(overrides=(), step=0):
    spec = og.load(GRAPH, list(overrides))
    gen, ctx = testing.build_node(spec, "generate")
    batch = gen.generate(step, testing.prompts(spec, step), Weights(0))
    return spec, gen, ctx, batch


@pytest.fixture(scope="module")
def episodes():
    return _episodes(["task.prompts=4"])


def test_env_tokens_are_in_the_sequence_but_not_trained(episodes):
    spec, gen, _, batch = episodes
    f, P = batch.fields, batch.meta["prompt_len"]
    tok = gen.tok
    assert f["input_ids"].shape[1] == P + spec.nodes["generate"].env.max_tokens
    for i in range(len(batch)):
        ep = f["meta"][i]["episode"]
        used = f["attention_mask"][i, P:] > 0
        model = f["response_mask"][i] > 0
        assert ep["turns"] == 3 and ep["done"] and not ep["truncated"]
        assert bool((model <= used).all()) and int(used.sum()) > int(model.sum()) > 0
        comp = f["input_ids"][i, P:]
        env_text = tok.decode(comp[used & ~model].tolist())
        said = [m["content"] for m in ep["messages"] if m["role"] == "user"]
        assert len(said) == 2 and env_text == "".join(said)        # exactly the environment's messages
        assert [m["role"] for m in ep["messages"]] == ["assistant", "user"] * 2 + ["assistant"]
        assert f["completion"][i] == ep["messages"][-1]["content"]
        assert float(f["logprob"][i][~model].abs().sum()) == 0.0


def test_sampled_logprobs_are_what_the_trainer_computes_on_the_same_weights(episodes):
    spec, _, _, batch = episodes
    from nodes.trainer.policy import Policy
    pol = Policy.of(testing.build_node(spec, "update")[1])          # the trainer's model, version 0
    with torch.no_grad():
        lp = pol.logprobs(pol.model, batch, slice(0, len(batch)), batch.meta["temperature"])
    mask = batch.fields["response_mask"]
    diff = float(((lp - batch.fields["logprob"]).abs() * mask).max())
    assert diff < 1e-3, f"the trainer reads other tokens than the rollout sampled (max |dlogprob| {diff})"


def test_the_environment_reward_is_the_reward(episodes):
    spec, _, _, batch = episodes
    reward, _ = testing.build_node(spec, "reward")
    scored = reward.score(0, batch)
    assert scored.fields["reward"] == [m["episode"]["reward"] for m in batch.fields["meta"]]
    assert 0 <= min(scored.fields["reward"]) and max(scored.fields["reward"]) <= 1


def test_metrics_count_turns_and_environment_time(episodes):
    _, gen, _, _ = episodes
    s = gen.episodes.stats
    assert s["turns_mean"] == 3.0 and s["episodes_done"] == 1.0 and s["tool_calls_per_episode"] == 0
    assert s["tokens_per_turn"] > 1 and s["env_tokens_per_episode"] > 0


def test_a_slow_tool_hides_behind_the_other_waves_generation():
    # The tool is as slow as one wave's turn of generation on this machine (measured, so that a fast
    # CPU does not make every tool look slow): alone it doubles a turn, with two waves it hides.
    # Three interleaved pairs, medians compared, so that a burst of load on a shared machine (which
    # slows generation and so flatters either side) does not decide the result.
    per_turn = []
    for _ in range(2):                                                                   # warm-up, and the measure
        _, gen, _, _ = _episodes(["nodes.generate.env.waves=2", "task.prompts=4"])
        s = gen.episodes.stats
        per_turn.append(s["episode_gen_s"] / (2 * s["turns_mean"]))
    latency = max(min(per_turn), 0.005)
    eff = {1: [], 2: []}
    for _ in range(3):
        for waves in (1, 2):
            _, gen, _, _ = _episodes([f"nodes.generate.env.waves={waves}",
                                      f"nodes.generate.env.options.latency_s={latency}", "task.prompts=4"])
            s = gen.episodes.stats
            assert s["env_latency_s"] >= latency
            assert s["env_wait_s"] < s["env_s"] / 8             # the 32 episodes' steps ran concurrently
            eff[waves].append(s["env_overlap_efficiency"])
    median = {w: sorted(v)[1] for w, v in eff.items()}
    assert median[2] > median[1] + 0.1, (latency, eff)


def test_a_failing_environment_is_named():
    with pytest.raises(RuntimeError, match="environment test_multiturn:Broken failed in step\\(\\): "
                                           "ConnectionError: sandbox went away"):
        _episodes(["nodes.generate.env.name=test_multiturn:Broken", "task.prompts=2"])


def test_environments_ship_and_plug_in():
    from nodes.envs.simple import Calculator
    calc = Calculator(og.sdk.Prompt("What is 2 * 3?", {"target": "6"}))
    assert asyncio.run(calc.step("<calc>2*3</calc>")).tool_calls == 1
    assert asyncio.run(calc.step("6")).done


@pytest.mark.parametrize("override, message", [
    ("nodes.generate.env.name=copy_chian", "nodes.generate.env.name: nothing is registered as 'copy_chian' under "
                                           "omnigraph.environments \\(did you mean 'copy_chain'"),
    ("nodes.generate.backend=synthetic", "nodes.generate.env: multi-turn episodes need a token generator"),
])
def test_bad_env_configs_are_refused_with_the_field(override, message):
    with pytest.raises(og.GraphError, match=message):
        og.compile(GRAPH, overrides=[override])


def test_the_env_reward_without_episodes_is_refused():
    with pytest.raises(og.GraphError, match="nodes.reward.fn: fn: env scores multi-turn episodes or agent runs, "
                                            "but no generate node has an env or an agent"):
        og.compile(ROOT / "graphs" / "grpo_one_step_off.yaml", overrides=["nodes.reward.fn=env"])


def test_the_plan_says_what_the_episodes_are():
    out = subprocess.run([EXE, "check", str(GRAPH)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "generate: environment copy_chain, at most 3 model turns of 8 tokens, 40 tokens per episode" in out.stdout
    assert "staleness bound: 1" in out.stdout


@pytest.mark.slow
def test_the_multiturn_graph_trains_on_the_tiny_model(tmp_path):
    res = run(og.compile(GRAPH, overrides=["runtime.executor=local", "checkpoint.every=null", "schedule.iterations=24"]),
              run_dir=tmp_path,
              progress=False)
    rows = [r for r in res.metrics if "reward_mean" in r]
    first, last = testing.initial_reward(res.metrics), sum(r["reward_mean"] for r in rows[-5:]) / 5
    assert min(r["turns_mean"] for r in rows) >= 2
    assert last >= first + 0.2, (first, last)
    assert res.summary["observed_max_staleness"] <= 1 and ledger.read(res.run_dir).ok
    parts = [r for r in read_jsonl(res.run_dir / "timeline.jsonl") if "part" in r]
    assert {"turn 1", "turn 2", "turn 3"} <= {r["part"] for r in parts}          # the turns, in the timeline
    assert all(r["node"] == "generate" and r["t_end"] >= r["t_start"] for r in parts)
    assert {p.name for p in plot_run(res.run_dir)} == {"reward.png", "timing.png", "timeline.png"}
