"""Agent programs as the rollout: the real ``openai`` client against the endpoint the rollout serves (chat,
completions, streaming, tools, n, logprobs, refusals), token-exact trajectories, concurrency, command
agents, agents that hang or raise, and the check's refusals."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
import torch

import omnigraph as og
from omnigraph.errors import GraphError
from omnigraph.sdk import Weights
from omnigraph.testing import build_node, prompts

from conftest import GRAPHS

HERE = Path(__file__).resolve().parent
COPY_CHAIN = HERE.parent / "examples" / "agents" / "copy_chain.py"
# the tiny model's tokenizer has no chat template: one in its own alphabet, turns ended by its <eos>
TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}<eos>\n{% endfor %}"
            "{% if add_generation_prompt %}assistant: {% endif %}")


@pytest.fixture(autouse=True)
def _programs_importable(monkeypatch):
    monkeypatch.syspath_prepend(str(HERE))


def generator(agent: str, *extra: str):
    spec = og.load(GRAPHS / "grpo_one_step_off.yaml", [f"nodes.generate.agent={agent}", "task.prompts=4", *extra])
    gen, ctx = build_node(spec, "generate")
    gen.tok.chat_template = TEMPLATE
    return spec, gen, ctx


def run(spec, gen, step: int = 0):
    torch.manual_seed(0)
    batch = gen.generate(step, prompts(spec, step), Weights(version=0))
    return batch, gen.agents


def test_a_two_turn_chat_agent_trains_exactly_the_tokens_it_sampled():
    spec, gen, ctx = generator("{entry: 'agent_programs:copy_twice', max_tokens: 48, batch_wait_s: 2}")
    batch, agents = run(spec, gen)
    n = spec.task.prompts * spec.task.samples_per_prompt
    assert len(batch) == n
    assert agents.stats["agent_requests"] == 2 * n and agents.stats["retokenize_mismatch"] == 0
    assert agents.stats["agent_max_in_flight"] == n            # every agent's turn sampled in one batch
    f, P = batch.fields, batch.meta["prompt_len"]
    for i, ep in enumerate(batch.fields["meta"]):
        e = ep["episode"]
        assert e["turns"] == 2 and e["status"] == "done" and e["retokenize_mismatch"] == 0
    # the region holds: reply 1 (trained), the next turn's tokens (not trained), reply 2 (trained)
    mask, ids = f["response_mask"], f["input_ids"][:, P:]
    for i in range(n):
        row = mask[i].tolist()
        runs = [k for k in range(1, len(row)) if row[k] != row[k - 1]]
        assert len(runs) >= 2, row                          # trained, then not, then trained again
        text = gen.tok.decode(ids[i][f["attention_mask"][i, P:] > 0].tolist(), skip_special_tokens=False)
        assert "user: copy 42:" in text, text
    # token-exact: the trainer's log-probs of the recorded ids are the sampler's
    pol = build_node(spec, "old_logprob", shared={})[0].policy
    with torch.no_grad():
        lp = pol.logprobs(pol.model, batch, slice(0, n), batch.meta.get("temperature", 1.0))
    gap = ((lp - f["logprob"]).abs() * mask).sum() / mask.sum()
    assert float(gap) < 1e-3, float(gap)


def test_an_agent_playing_an_environment_samples_and_trains_what_the_environment_loop_does():
    """``copy_chain`` through the endpoint (an agent over /completions) and through the built-in episode loop
    (one wave, the same seeds): the same tokens, masks, log-probs and rewards, bit for bit."""
    spec = og.load(GRAPHS / "grpo_multiturn.yaml", ["nodes.generate.env.waves=1", "task.prompts=4"])
    env_gen, _ = build_node(spec, "generate")
    torch.manual_seed(0)
    want = env_gen.generate(0, prompts(spec, 0), Weights(version=0))
    max_tokens = spec.nodes["generate"].env.max_tokens
    spec = og.load(GRAPHS / "grpo_multiturn.yaml", [
        "task.prompts=4", "nodes.generate.env=null",
        f"nodes.generate.agent={{entry: '{COPY_CHAIN}:solve', max_tokens: {max_tokens}, batch_wait_s: 5}}"])
    gen, _ = build_node(spec, "generate")
    got, agents = run(spec, gen)
    assert agents.stats["retokenize_mismatch"] == 0
    for key in ("input_ids", "attention_mask", "response_mask", "logprob"):
        assert torch.equal(want.fields[key], got.fields[key]), key
    assert [m["episode"]["reward"] for m in want.fields["meta"]] == [m["episode"]["reward"] for m in got.fields["meta"]]


def test_a_batch_does_not_wait_for_agents_that_finished():
    """Agents that end after one turn or two: once an agent has its last reply, the next batch waits only for
    the agents still running (not ``batch_wait_s`` for a request that will not come)."""
    spec, gen, _ = generator("{entry: 'agent_programs:stops_early_or_late', max_tokens: 16, batch_wait_s: 10}")
    targets = [int(p.meta["target"]) % 2 for p in prompts(spec, 0)]
    assert 0 < sum(targets) < len(targets)                 # both kinds in the batch
    t0 = time.perf_counter()
    run(spec, gen)
    assert gen.agents.stats["agent_batches"] == 2
    assert time.perf_counter() - t0 < 5, "a batch waited for an agent that had finished"


def test_an_agent_that_tidies_the_replies_it_sends_back_is_counted_as_diverging():
    spec = og.load(GRAPHS / "grpo_multiturn.yaml", [
        "task.prompts=2", "nodes.generate.env=null", f"nodes.generate.agent={{entry: '{COPY_CHAIN}:edited'}}"])
    gen, _ = build_node(spec, "generate")
    batch, agents = run(spec, gen)
    assert agents.stats["retokenize_mismatch"] > 0 and batch.fields["response_mask"].sum() > 0


def test_an_agent_that_edits_its_history_is_counted_and_still_trains_what_was_sampled():
    spec, gen, _ = generator("{entry: 'agent_programs:edits_history', max_tokens: 48}")
    batch, agents = run(spec, gen)
    n = len(batch)
    assert agents.stats["retokenize_mismatch"] == n           # every episode's second request diverged
    f = batch.fields
    assert all(e["episode"]["retokenize_mismatch"] == 1 for e in f["meta"])
    trained = int(f["response_mask"].sum())
    assert trained > 0 and agents.stats["agent_requests"] == 2 * n


def test_split_makes_a_sample_of_each_context_the_policy_sampled_from():
    """``on_divergence: split``: the edited history starts a second sample from the request as sent; each
    sample trains one reply, from the context it was sampled in; the two share the episode's advantage."""
    from nodes.rewards.scorer import episodes_of, grpo_advantages
    spec, gen, _ = generator("{entry: 'agent_programs:edits_history', max_tokens: 48, on_divergence: split}")
    batch, agents = run(spec, gen)
    n = spec.task.prompts * spec.task.samples_per_prompt
    assert len(batch) == 2 * n and agents.stats["agent_samples_per_episode"] == 2
    f, P = batch.fields, batch.meta["prompt_len"]
    index = [m["episode"]["index"] for m in f["meta"]]
    assert index == [i for i in range(n) for _ in range(2)]
    assert batch.group_ids[0::2] == batch.group_ids[1::2]
    for i in range(0, 2 * n, 2):
        first, second = f["input_ids"][i], f["input_ids"][i + 1]
        reply = first[P:][f["response_mask"][i] > 0].tolist()
        context = gen.tok.decode(second[:P][f["attention_mask"][i + 1][:P] > 0])
        assert reply and "7" + gen.tok.decode(reply, skip_special_tokens=True) in context   # the edited history
        assert f["response_mask"][i + 1].sum() > 0
        # the second sample's region holds only its own reply: nothing of the agent's turns
        assert f["response_mask"][i + 1][:int(f["attention_mask"][i + 1][P:].sum())].all()
    rewards = [float(i % 4 == 3) for i in range(2 * n)]       # scored on each episode's last sample
    adv = grpo_advantages(rewards, batch.group_ids, False, episodes_of(batch))
    assert adv[0::2] == adv[1::2] and any(adv)


PARTIAL = ("{entry: 'agent_programs:copy_twice', max_tokens: 48, batch_wait_s: 5}",
           "nodes.generate.partial={budget_tokens: 1, max_spans: 2}", "schedule.max_staleness=2")


def test_with_partial_rollouts_an_agent_goes_on_in_the_next_firing_under_the_new_weights():
    """A firing's budget spent, each agent's next request waits for the next firing; its reply is sampled by
    the weights that arrived, and every token keeps the version that sampled it."""
    spec, gen, _ = generator(*PARTIAL)
    n = spec.task.prompts * spec.task.samples_per_prompt
    torch.manual_seed(0)
    first = gen.generate(0, prompts(spec, 0), Weights(version=0))
    assert len(first) == 0 and len(gen.in_flight()) == spec.task.prompts    # every agent waits on its 2nd request
    gen.version = 1                                                          # the weights a sync brought
    second = gen.generate(1, [], Weights(version=1))
    assert len(second) == n and gen.in_flight() == []
    f = second.fields
    for i in range(n):
        trained = f["token_version"][i][f["response_mask"][i] > 0].tolist()
        assert trained[0] == 0 and trained[-1] == 1 and sorted(trained) == trained, trained
    assert second.min_version == [0] * n and second.max_version == [1] * n and f["spans"] == [2] * n


def test_a_checkpoint_keeps_agents_in_flight_and_the_resumed_run_continues_them_exactly():
    """The checkpoint holds each episode in flight as its trajectory and the answers it was given; a fresh
    rollout loading it runs each agent again from its task, gives it those answers without sampling, and
    samples the request it was waiting on: the same batch as the run that did not stop."""
    def firings(resume: bool):
        spec, gen, _ = generator(*PARTIAL)
        torch.manual_seed(0)
        gen.generate(0, prompts(spec, 0), Weights(version=0))
        if resume:
            state = gen.carry_state()
            gen.agents.close()
            spec, gen, _ = generator(*PARTIAL)
            gen.load_carry(state)
            assert len(gen.in_flight()) == spec.task.prompts
        gen.version = 1
        return gen.generate(1, [], Weights(version=1)), gen
    whole, _ = firings(False)
    resumed, gen = firings(True)
    for key in ("input_ids", "attention_mask", "response_mask", "logprob", "token_version"):
        assert torch.equal(whole.fields[key], resumed.fields[key]), key
    assert gen.agents.stats["agent_requests"] == len(resumed)          # one live request each: the rest replayed


def test_the_endpoint_serves_what_clients_send_and_refuses_the_rest_in_openais_shape():
    spec, gen, _ = generator("{entry: 'agent_programs:probes', max_tokens: 64, max_n: 2}", "task.prompts=1",
                             "task.samples_per_prompt=1")
    batch, agents = run(spec, gen)
    (e,) = [m["episode"] for m in batch.fields["meta"]]
    assert e["status"] == "done", e
    seen = e["info"]
    assert seen["models"] == ["policy"] or seen["models"]
    assert seen["stream_usage"] and isinstance(seen["stream_text"], str)
    assert seen["n"] == 2 and len(seen["logprobs"]) >= 1 and all(lp <= 0 for lp in seen["logprobs"])
    assert seen["bad_n"][0] == 400 and seen["bad_messages"][0] == 400 and seen["bad_max"][0] == 400
    assert seen["top_logprobs"][0] == 400
    assert seen["huge"][0] == 413 and seen["wrong_key"][0] == 401


def test_the_completions_endpoint_needs_no_chat_template():
    spec, gen, _ = generator("{entry: 'agent_programs:completes', max_tokens: 16}")
    gen.tok.chat_template = None
    batch, agents = run(spec, gen)
    assert agents.stats["agent_requests"] == len(batch) and batch.fields["response_mask"].sum() > 0


def test_a_command_agent_runs_in_its_own_process_with_the_endpoint_in_its_environment():
    spec, gen, _ = generator(f"{{command: ['{sys.executable}', '{HERE / 'agent_command.py'}'], max_tokens: 16}}",
                             "task.prompts=2", "task.samples_per_prompt=2")
    batch, agents = run(spec, gen)
    eps = [m["episode"] for m in batch.fields["meta"]]
    assert all(e["status"] == "done" and e["info"].get("pid_seen") for e in eps), eps
    assert agents.stats["agent_requests"] == 4


def test_a_command_agent_needs_nothing_but_http():
    """The stdlib example, run with ``python -S`` (no site packages: not omnigraph's, not openai's)."""
    program = HERE.parent / "examples" / "agents" / "stdlib_agent.py"
    spec, gen, _ = generator(f"{{command: ['{sys.executable}', '-S', '{program}'], max_tokens: 16}}",
                             "task.prompts=1", "task.samples_per_prompt=2")
    batch, agents = run(spec, gen)
    eps = [m["episode"] for m in batch.fields["meta"]]
    assert all(e["status"] == "done" and "reply" in e["info"] for e in eps), eps
    assert agents.stats["agent_requests"] == 2 and batch.fields["response_mask"].sum() > 0


@pytest.mark.parametrize("program, status", [("hangs", "timeout"), ("raises", "error")])
def test_an_agent_that_hangs_or_raises_is_scored_and_the_rollout_goes_on(program, status, capsys):
    spec, gen, _ = generator(f"{{entry: 'agent_programs:{program}', timeout_s: 3, max_tokens: 16}}",
                             "task.prompts=2", "task.samples_per_prompt=2")
    t0 = time.perf_counter()
    batch, agents = run(spec, gen)
    assert time.perf_counter() - t0 < 30
    eps = [m["episode"] for m in batch.fields["meta"]]
    assert [e["status"] for e in eps] == [status] * 4 and all(e["reward"] == 0.0 for e in eps)
    assert agents.stats[f"agent_{'timeouts' if status == 'timeout' else 'errors'}"] == 4
    if status == "error":
        err = capsys.readouterr().err
        assert "the agent's own bug" in err and "agent_programs.py" in err      # the traceback, to its line
    batch2, _ = run(spec, gen, step=1)                          # the endpoint still serves
    assert len(batch2) == 4


def test_drop_masks_a_failed_agents_tokens():
    spec, gen, _ = generator("{entry: 'agent_programs:raises', on_timeout: drop, max_tokens: 16}",
                             "task.prompts=1", "task.samples_per_prompt=2")
    batch, _ = run(spec, gen)
    assert float(batch.fields["response_mask"].sum()) == 0


@pytest.mark.parametrize("override, where, says", [
    ("nodes.generate.agent={entry: 'agent_programs:copy_twice'}", "nodes.generate.agent",
     "an agent drives its own turns"),
    ("nodes.generate.agent={entry: 'no_such_module:fn'}", "nodes.generate.agent.entry", "cannot load the agent"),
    ("nodes.generate.agent={entry: 'a:b', command: [x]}", "nodes.generate.agent", "exactly one of entry"),
    ("nodes.generate.agent={entry: 'a:b', batch_wait_s: 30}", "nodes.generate.agent.batch_wait_s", "less than or equal"),
])
def test_check_refuses_an_agent_it_cannot_run(override, where, says):
    graph = "smollm2_calculator.yaml" if "copy_twice" in override else "grpo_one_step_off.yaml"
    with pytest.raises(GraphError) as e:
        og.compile(GRAPHS / graph, overrides=[override])
    assert e.value.where.startswith(where) and says in str(e.value), str(e.value)


@pytest.mark.parametrize("executor", ["local", pytest.param("ray", marks=pytest.mark.slow)])
def test_a_graph_trains_with_an_agent_from_a_file_and_keeps_its_errors(tmp_path, executor, request):
    from omnigraph.runtime import run as run_graph
    from omnigraph.runtime.ledger import read
    if executor == "ray":
        request.getfixturevalue("ray_session")
    good = f"{HERE / 'agent_programs.py'}:completes"
    plan = og.compile(GRAPHS / "grpo_one_step_off.yaml", overrides=[
        f"nodes.generate.agent={{entry: '{good}', max_tokens: 16}}", "nodes.reward.fn=env", "schedule.iterations=3",
        "nodes.generate.eval_every=0"])
    res = run_graph(plan, run_dir=tmp_path / "good", executor=executor, progress=False)
    rows = res.metrics
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    per_step = plan.graph.spec.task.prompts * plan.graph.spec.task.samples_per_prompt
    assert [r["agent_requests"] for r in rows if "agent_requests" in r] == [per_step] * 3, rows[0]
    assert all(r["retokenize_mismatch"] == 0 for r in rows if "agent_requests" in r)
    assert any(r.get("loss") is not None for r in rows) and read(res.run_dir).ok
    bad = f"{HERE / 'agent_programs.py'}:raises"
    plan = og.compile(GRAPHS / "grpo_one_step_off.yaml", overrides=[
        f"nodes.generate.agent={{entry: '{bad}', max_tokens: 16}}", "nodes.reward.fn=env", "schedule.iterations=1",
        "nodes.generate.eval_every=0", "task.prompts=2"])
    res = run_graph(plan, run_dir=tmp_path / "bad", executor=executor, progress=False)
    log = (res.run_dir / "agent_errors.log").read_text()
    assert "the agent's own bug" in log and "agent_programs.py" in log
