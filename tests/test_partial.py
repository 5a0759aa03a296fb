"""Partial rollouts (``generate: {partial: ...}``): interruptible generation with per-token versions.

What is checked: the proof's bound includes the spans and equals the largest staleness a run shows, per
sample and per token (synthetic per-token nodes on every schedule, the tiny model on the real backend); the
tokens a sample carries keep the logprobs of the weights that sampled them (the decoupled loss's behaviour
policy, token by token); no prompt group is lost or trained twice; a checkpoint taken with samples in flight
resumes bit-exactly; user errors end in one message naming the field.
"""

import json
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import omnigraph as og
from omnigraph.errors import GraphError, NodeFailure, StalenessError
from omnigraph.executors import checks
from omnigraph.runtime import run
from omnigraph.runtime.ledger import read
from omnigraph.sdk import Prompt, SampleBatch, Weights
from omnigraph.testing import build_node, canonical_spec, export, prompts

from conftest import GRAPHS

GRAPH = GRAPHS / "grpo_partial.yaml"
SMALL = ["task.prompts=8", "task.options={max_len: 30}", "nodes.generate.max_new_tokens=32",
         "nodes.generate.partial={budget_tokens: 8, max_spans: 4}", "schedule.max_staleness=4", "nodes.update.lr=3e-5",
         "nodes.generate.eval_every=0", "runtime.executor=local"]
"""The shipped graph made small: 8 prompts of 3 to 30 digits (many long completions), budget 8 of 32 tokens,
4 spans (bound 4)."""


def rows(d: Path) -> list[dict]:
    return [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]


# ---------------------------------------------------------------- the proof


@pytest.mark.parametrize("mode,kw", [("sync", {}), ("one_step_off", {}), ("async", {"ahead": 2}),
                                     ("one_step_off", {"sync_every": 2})])
@pytest.mark.parametrize("spans", [2, 3])
def test_bound_includes_the_spans_and_a_run_reaches_it(tmp_path, mode, kw, spans):
    """bound = the bound without spans + (spans - 1); a run of per-token synthetic nodes trains samples and
    tokens exactly that stale, never staler, and every group exactly once."""
    spec = canonical_spec(mode, spans=spans, iterations=14, **kw)
    plan = og.compile(spec)
    whole = og.compile(canonical_spec(mode, iterations=14, **kw)).bound
    assert plan.bound == whole + spans - 1 == plan.staleness.bound_whole + spans - 1
    d = run(plan, run_dir=tmp_path, progress=False).run_dir
    m = rows(d)
    assert max(r.get("staleness_max", 0) for r in m) == plan.bound
    assert max(r.get("token_staleness_max", 0) for r in m) == plan.bound
    assert max(r.get("spans_max", 0) for r in m) == spans
    s = read(d)
    assert s.ok and s.generated == s.trained_once == 14 * spec.task.prompts and s.carried > 0


def test_the_plan_prints_the_spans_in_the_bound():
    text = str(og.compile(GRAPH))
    assert "partial rollouts (interruptible generation):" in text
    assert "bound per sample and per token: 3 = 1 without spans + 2" in text
    assert "staleness bound: 3" in text


def test_a_budget_that_cannot_cover_max_new_tokens_is_a_warning():
    plan = og.compile(GRAPH, overrides=["nodes.generate.partial.budget_tokens=8"])
    assert any("budget_tokens 8 x max_spans 3 < max_new_tokens 40" in w for w in plan.warnings)
    assert not og.compile(GRAPH).warnings


@pytest.mark.parametrize("extra,where,says", [
    (["nodes.generate.partial={max_spans: 3}"], "nodes.generate.partial", "exactly one of budget_tokens"),
    (["nodes.generate.partial={budget_tokens: 4, budget_s: 1}"], "nodes.generate.partial", "exactly one"),
    (["schedule.on_stale=wait"], "schedule.on_stale", "would drop the tokens"),
    (["schedule.max_staleness=1"], "schedule.max_staleness", "raise schedule.max_staleness to 3"),
])
def test_user_errors_name_the_field(extra, where, says):
    with pytest.raises(GraphError) as e:
        og.compile(GRAPH, overrides=extra)
    assert where in str(e.value) and says in str(e.value)


def test_partial_episodes_are_refused_with_one_message():
    exe = shutil.which("omnigraph", path=str(Path(sys.executable).parent)) or "omnigraph"
    out = subprocess.run([exe, "check", str(GRAPHS / "grpo_multiturn.yaml"),
                          "nodes.generate.partial={budget_tokens: 4}", "schedule.max_staleness=9"],
                         capture_output=True, text=True)
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert "nodes.generate.partial" in out.stderr and "remove partial, or remove env" in out.stderr


# ---------------------------------------------------------------- the engine's checks


def test_the_engine_refuses_a_lost_group_and_a_sample_made_to_look_fresh():
    b = SampleBatch(1, [10, 10], [1, 1], [1, 1], {})
    given = [Prompt("p", group=10), Prompt("q", group=11)]
    with pytest.raises(ValueError, match="lost groups"):        # group 11 neither returned nor in flight
        checks.rollout("generate", b, given, Weights(1), spans=2)
    checks.rollout("generate", b, given, Weights(1), carried_out={11}, spans=2)
    with pytest.raises(ValueError, match="spans 3 firings"):
        checks.rollout("generate", b.with_fields(spans=[3, 1]), given, Weights(1), carried_out={11}, spans=2)
    lie = SampleBatch(1, [10], [2], [2], {"token_version": torch.tensor([[0, 2, -1]])})
    with pytest.raises(StalenessError, match="min_version 2 but has a token sampled at version 0"):
        checks.token_staleness(lie, 3)


# ---------------------------------------------------------------- the hf backend


def _logprobs_under(policy, batch, state, T):
    model = policy.model
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    model.load_state_dict(state)
    try:
        with torch.no_grad():
            return policy.logprobs(model.eval(), batch, slice(0, len(batch)), T)
    finally:
        model.load_state_dict(saved)


def test_carried_tokens_keep_the_version_and_logprob_that_sampled_them():
    """Step 0 on weights v0, step 1 on perturbed weights v1: a sample begun at step 0 and finished at step 1
    has tokens of both versions, each token's logprob is its own version's (the trainer's forward pass), so the
    decoupled loss's importance weight is 1 on the new tokens and not on the carried ones."""
    spec = og.load(GRAPH, [*SMALL, "nodes.generate.partial.max_spans=2"])   # step 0's groups all end at step 1
    sync, _ = build_node(spec, "sync")
    gen, ctx = build_node(spec, "generate")
    pol = sync.policy
    v0 = {k: v.clone() for k, v in pol.model.state_dict().items()}
    first = gen.generate(0, prompts(spec, 0), Weights(0))
    assert gen.in_flight(), "nothing carried: the test needs a long sample"
    with torch.no_grad():
        for p in pol.model.parameters():
            p.add_(0.03 * torch.randn_like(p))
    w1 = export(spec, sync, 1)
    gen.load_weights(w1)
    second = gen.generate(1, prompts(spec, 1), w1)
    f = second.fields
    tv, mask = f["token_version"], f["response_mask"]
    both = [i for i in range(len(second)) if (tv[i] == 0).any() and (tv[i] == 1).any()]
    assert both, "no sample spans two versions"
    assert all(second.min_version[i] == 0 and second.max_version[i] == 1 and f["spans"][i] == 2 for i in both)
    assert ((tv >= 0) == (mask > 0)).all()
    T = second.meta["temperature"]
    lp0 = _logprobs_under(pol, second, v0, T)
    lp1 = _logprobs_under(pol, second, pol.model.state_dict(), T)
    expect = torch.where(tv == 0, lp0, lp1) * mask
    assert float((expect - f["logprob"]).abs().max()) < 1e-4
    w = torch.exp(lp1 - f["logprob"])                            # proximal = current weights (v1)
    assert float(((w - 1).abs() * (tv == 1)).max()) < 1e-3
    assert float(((w - 1).abs() * (tv == 0)).max()) > 1e-2
    assert set(first.group_ids) | set(second.group_ids) | set(gen.in_flight()) == \
        {p.group for s in (0, 1) for p in prompts(spec, s)}


def test_a_time_budget_stops_the_rows_not_in_their_last_firing():
    """budget_s on hf: when the deadline has passed, rows not final stop after the token in flight; final rows run
    to their budget or their stop token. A graph with budget_s trains, and its ledger holds."""
    import time
    spec = og.load(GRAPH, SMALL)
    gen, _ = build_node(spec, "generate")
    ids = [gen.encode(p) for p in prompts(spec, 0)[:2]]
    cut, full = gen.continue_rows(ids, [30, 30], seed=1, deadline=time.perf_counter() - 1, final=[False, True])
    assert len(cut[0]) == 1 and not cut[2] and len(cut[1]) == 1
    assert full[2] or len(full[0]) == 30


def test_one_span_is_bit_identical_to_no_partial_rollouts(tmp_path):
    """max_spans: 1 runs every sample to its end in its firing: the partial path then samples the same tokens
    (same rows, same seed) and trains the same weights as generation without partial rollouts."""
    base = [*SMALL, "schedule.iterations=3", "schedule.max_staleness=1"]
    keys = ("reward_mean", "loss", "grad_norm", "response_len", "returned_tokens")
    out = []
    for extra in (["nodes.generate.partial=null"], ["nodes.generate.partial.max_spans=1"]):
        d = run(og.compile(GRAPH, overrides=base + extra), run_dir=tmp_path / extra[0][-4:], progress=False).run_dir
        out.append([{k: r.get(k) for k in keys} for r in rows(d)])
    assert out[0] == out[1] and out[0][1]["loss"] is not None


@pytest.mark.slow
@pytest.mark.parametrize("executor", ["local", "ray"])
def test_resume_with_samples_in_flight_is_bit_exact(tmp_path, monkeypatch, executor):
    """Interrupted at step 5, resumed from the step-3 checkpoint, which holds unfinished samples: metrics and
    final weights equal an uninterrupted run's; every group trained once."""
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    over = [*SMALL, "task.prompts=4", "task.samples_per_prompt=4", "schedule.iterations=7", "checkpoint.every=2",
            f"runtime.executor={executor}"]
    whole = run(og.compile(GRAPH, overrides=over), run_dir=tmp_path / "a", progress=False).run_dir
    monkeypatch.setenv("OMNIGRAPH_INJECT", "update@5:raise")
    with pytest.raises(NodeFailure):
        run(og.compile(GRAPH, overrides=over), run_dir=tmp_path / "b", progress=False)
    monkeypatch.delenv("OMNIGRAPH_INJECT")
    (d,) = (tmp_path / "b").iterdir()
    snap = pickle.loads((d / "checkpoints" / "step-00000003" / "rollout.0.pkl").read_bytes())
    assert snap["in_flight"]["generate"], "the checkpoint holds no samples in flight"
    carry = snap["nodes"]["generate"]["carry"]["groups"]
    assert any(s["tokens"] for _, _, samples in carry.values() for s in samples)
    run(og.compile(d / "config.yaml"), resume=d, progress=False)
    keys = ("reward_mean", "staleness_max", "token_staleness_max", "carried_groups_out", "spans_max", "loss",
            "version")
    assert [{k: r.get(k) for k in keys} for r in rows(d)] == [{k: r.get(k) for k in keys} for r in rows(whole)]
    from safetensors.torch import load_file
    a, b = load_file(whole / "final" / "model.safetensors"), load_file(d / "final" / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)
    s = read(d)
    assert s.ok and s.generated == s.trained_once == 7 * 4 and s.carried > 0


def test_a_real_run_reaches_its_bound_and_plots_the_carried_samples(tmp_path):
    d = run(og.compile(GRAPH, overrides=[*SMALL, "schedule.iterations=6"]), run_dir=tmp_path,
            progress=False).run_dir
    m = rows(d)
    assert max(r.get("token_staleness_max", 0) for r in m) <= 4
    assert max(r.get("spans_max", 0) for r in m) >= 2 and sum(r.get("carried_tokens", 0) for r in m) > 0
    from omnigraph.viz.plots import plot_run                      # what `omnigraph run` draws at the end
    assert d / "partial.png" in plot_run(d)
    tl = [json.loads(x) for x in (d / "timeline.jsonl").read_text().splitlines()]
    parts = [r["part"] for r in tl if r.get("node") == "generate" and "part" in r]
    assert parts[0] == "64 new + 0 carried rows" and any(not p.endswith(" 0 carried rows") for p in parts)
    assert read(d).ok
