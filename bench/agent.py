"""Agent benchmark: the same episodes through the agents' OpenAI-compatible endpoint and through the built-in
environment loop, side by side; and, with a real model, whether an agent program learns through it.

1. **Endpoint against the loop, SmolLM2** (needs the ``vllm`` extra): the ``calculator`` environment of
   ``graphs/smollm2_calculator.yaml`` and the same protocol written as an agent program over
   ``/chat/completions`` (``examples/agents/calculator.py:tags``), SmolLM2-135M through vLLM, the same prompts
   and seeds, one rollout batch at a time, alternating, after a warm-up batch each. ``endpoint_overhead``: the
   agent's median seconds per batch over the loop's; ``same_episodes``: whether every batch's tokens and
   masks were equal (the endpoint sampled exactly the loop's episodes).
2. **Endpoint against the loop, the tiny model** (``graphs/grpo_multiturn.yaml``, ``local``, one wave): the
   ``copy_chain`` environment, and the same episode written as an agent program over ``/completions``
   (``examples/agents/copy_chain.py``), trained for ``--steps`` steps each from the same seed, alternating
   runs twice. Reported: each side's seconds per step in steady state and their ratio
   (``endpoint_overhead_tiny``: the tiny model generates a batch in milliseconds, so this is the endpoint's
   cost per request laid bare, not what a real model pays); ``same_training``: whether the two runs' learning metrics
   (reward, loss, gradient norm, entropy at every step) are equal bit for bit (the endpoint samples and
   trains exactly what the loop does); ``max_in_flight``: the most requests generated in one batch;
   ``token_exact_gap``: the trainer's log-probs of the recorded ids against the sampler's, in nats, at the
   first trained step (both on the initial weights); ``retokenize_mismatch`` for the plain agent and
   ``retokenize_mismatch_edited`` for the one that tidies the replies it sends back.
3. **Learning** (needs the ``vllm`` extra): ``graphs/smollm2_agent.yaml``, SmolLM2-135M through vLLM
   trained as ``examples/agents/calculator.py:solve`` (the OpenAI tools API, Hermes tool calls) drives it:
   reward first (the initial weights' batch) and last (mean of the last three), greedy held-out reward
   before and after (32 questions), tool calls per episode.

    python bench/agent.py [--quick] [--steps N] [--learn-steps N] [--no-learn]

Prints a table, then one JSON line (last), and saves it under bench/results/ (``bench/record.py``).
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import record  # noqa: E402

import omnigraph as og  # noqa: E402
from omnigraph.runtime import run  # noqa: E402
from omnigraph.testing import initial_reward  # noqa: E402

MULTITURN = ROOT / "graphs" / "grpo_multiturn.yaml"
AGENT = ROOT / "examples" / "agents" / "copy_chain.py"
LEARN = ROOT / "graphs" / "smollm2_agent.yaml"
CALC = ROOT / "graphs" / "smollm2_calculator.yaml"
TOOLS = ROOT / "examples" / "agents" / "calculator.py"
LEARNING = ("reward_mean", "loss", "grad_norm", "entropy")


def one(tmp: Path, name: str, over: list[str]) -> dict:
    plan = og.compile(MULTITURN, overrides=over)
    t0 = time.perf_counter()
    res = run(plan, run_dir=tmp / name, executor="local", progress=False)
    rows = res.metrics
    steady = [r["step_s"] for r in rows[2:-1] if r.get("step_s")]
    return {"rows": rows, "s_per_step": statistics.median(steady) if steady else None,
            "wall_s": time.perf_counter() - t0}


def side_by_side(tmp: Path, steps: int, repeats: int) -> dict:
    """The tiny model: copy_chain through the loop and through the endpoint, whole training runs."""
    base = [f"schedule.iterations={steps}", "nodes.generate.eval_every=0", "nodes.generate.env.waves=1"]
    budget = og.load(MULTITURN).nodes["generate"].env.max_tokens
    agent = [f"schedule.iterations={steps}", "nodes.generate.eval_every=0", "nodes.generate.env=null",
             f"nodes.generate.agent={{entry: '{AGENT}:solve', max_tokens: {budget}, batch_wait_s: 10}}"]
    edited = agent[:-1] + [f"nodes.generate.agent={{entry: '{AGENT}:edited', max_tokens: {budget}, batch_wait_s: 10}}"]
    loop_s, agent_s, same, runs = [], [], True, {}
    for i in range(repeats):                       # alternate, so drifts of a shared machine fall on both
        runs["loop"] = one(tmp, f"loop{i}", base)
        runs["agent"] = one(tmp, f"agent{i}", agent)
        loop_s.append(runs["loop"]["s_per_step"])
        agent_s.append(runs["agent"]["s_per_step"])
        same = same and all({k: a.get(k) for k in LEARNING} == {k: b.get(k) for k in LEARNING}
                            for a, b in zip(runs["loop"]["rows"], runs["agent"]["rows"]))
        print(f"  repeat {i}: loop {loop_s[-1]:.3f} s/step, agent {agent_s[-1]:.3f} s/step", flush=True)
    rows = runs["agent"]["rows"]
    first_trained = next(r for r in rows if r.get("behav_vs_old_logprob_absdiff_mean") is not None)
    tidy = one(tmp, "edited", edited)["rows"]
    rewards = [r["reward_mean"] for r in rows if r.get("reward_mean") is not None]
    return {"loop_s_per_step": statistics.median(loop_s), "agent_s_per_step": statistics.median(agent_s),
            "endpoint_overhead_tiny": statistics.median(agent_s) / statistics.median(loop_s),
            "same_training": same, "repeats": repeats, "steps": steps,
            "max_in_flight": max(r.get("agent_max_in_flight", 0) for r in rows),
            "requests_per_step": statistics.mean(r["agent_requests"] for r in rows if "agent_requests" in r),
            "token_exact_gap": first_trained["behav_vs_old_logprob_absdiff_mean"],
            "token_exact": first_trained["behav_vs_old_logprob_absdiff_mean"] <= 0.05,
            "retokenize_mismatch": sum(r.get("retokenize_mismatch", 0) for r in rows),
            "retokenize_mismatch_edited": sum(r.get("retokenize_mismatch", 0) for r in tidy),
            "tiny_reward_first": rewards[0], "tiny_reward_last": statistics.mean(rewards[-3:])}


def rollouts(batches: int) -> dict:
    """SmolLM2 through vLLM: the calculator environment's episodes through its loop and through the endpoint
    (an agent playing its protocol), one rollout batch at a time, alternating, the same prompts and seeds."""
    import torch
    from omnigraph.sdk import Weights
    from omnigraph.testing import build_node, prompts
    env = og.load(CALC).nodes["generate"].env
    loop_spec = og.load(CALC, ["nodes.generate.env.options.latency_s=0", "nodes.generate.env.waves=1",
                               "nodes.generate.eval_every=0"])
    agent_spec = og.load(CALC, ["nodes.generate.eval_every=0", "nodes.generate.env=null",
                                f"nodes.generate.agent={{entry: '{TOOLS}:tags', options: {{max_turns: {env.max_turns}}}, "
                                f"max_tokens: {env.max_tokens}, batch_wait_s: 10}}"])
    loop, _ = build_node(loop_spec, "generate")
    agent, _ = build_node(agent_spec, "generate")
    loop_s, agent_s, same, requests, mismatch = [], [], True, 0, 0
    for step in range(batches + 1):                   # batch 0 warms both up and is not timed
        times = {}
        for name, node, spec in (("loop", loop, loop_spec), ("agent", agent, agent_spec)):
            torch.manual_seed(step)
            t0 = time.perf_counter()
            times[name] = node.generate(step, prompts(spec, step), Weights(version=0))
            times[name + "_s"] = time.perf_counter() - t0
        same = same and all(torch.equal(times["loop"].fields[k], times["agent"].fields[k])
                            for k in ("input_ids", "response_mask", "logprob"))
        requests += agent.agents.stats["agent_requests"]
        mismatch += agent.agents.stats["retokenize_mismatch"]
        if step:
            loop_s.append(times["loop_s"])
            agent_s.append(times["agent_s"])
            print(f"  batch {step}: loop {loop_s[-1]:.3f} s, agent {agent_s[-1]:.3f} s", flush=True)
    agent.agents.close()
    return {"endpoint_overhead": statistics.median(agent_s) / statistics.median(loop_s),
            "loop_s_per_batch": statistics.median(loop_s), "agent_s_per_batch": statistics.median(agent_s),
            "same_episodes": same, "rollout_batches": batches, "rollout_requests": requests,
            "rollout_retokenize_mismatch": mismatch}


def learn(tmp: Path, steps: int) -> dict:
    plan = og.compile(LEARN, overrides=[f"schedule.iterations={steps}", f"nodes.generate.eval_every={steps}"])
    res = run(plan, run_dir=tmp / "learn", executor="ray", progress=False)
    rows = res.metrics
    rewards = [r["reward_mean"] for r in rows if r.get("reward_mean") is not None]
    evals = [r["eval_reward"] for r in rows if r.get("eval_reward") is not None]
    calls = [r["tool_calls_per_episode"] for r in rows if r.get("tool_calls_per_episode") is not None]
    return {"reward_first": initial_reward(rows), "reward_last": statistics.mean(rewards[-3:]),
            "eval_before": evals[0], "eval_after": evals[-1], "learn_steps": steps,
            "tool_calls_first": calls[0], "tool_calls_last": calls[-1],
            "learn_s_per_step": statistics.median(r["step_s"] for r in rows[1:] if r.get("step_s")),
            "learn_minutes": res.wall_s / 60}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer steps and batches")
    ap.add_argument("--steps", type=int, default=None, help="steps of each tiny side-by-side run (8 quick, 30 full)")
    ap.add_argument("--learn-steps", type=int, default=None, help="steps of the learning run (10 quick, 30 full)")
    ap.add_argument("--no-learn", action="store_true", help="skip the learning run")
    record.add_arguments(ap)
    args = ap.parse_args()
    steps = args.steps or (8 if args.quick else 30)
    learn_steps = args.learn_steps or (10 if args.quick else 30)
    vllm = importlib.util.find_spec("vllm") is not None
    t0 = time.time()
    out: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        if vllm:
            print("endpoint against the environment loop: SmolLM2 through vLLM, rollouts only", flush=True)
            out.update(rollouts(4 if args.quick else 10))
        else:
            out["smollm2_skipped"] = "vllm is not installed (the vllm extra)"
        print(f"endpoint against the environment loop: {steps} steps, the tiny model", flush=True)
        out.update(side_by_side(tmp, steps, 2))
        if vllm and not args.no_learn:
            print(f"learning: SmolLM2 through vLLM, {learn_steps} steps", flush=True)
            out.update(learn(tmp, learn_steps))
    out["minutes"] = (time.time() - t0) / 60
    if "endpoint_overhead" in out:
        print(f"\nSmolLM2: loop {out['loop_s_per_batch']:.3f} s/batch, endpoint {out['agent_s_per_batch']:.3f}: "
              f"overhead x{out['endpoint_overhead']:.3f}; same episodes: {out['same_episodes']}")
    print(f"tiny: loop {out['loop_s_per_step']:.3f} s/step, endpoint {out['agent_s_per_step']:.3f} s/step: overhead "
          f"x{out['endpoint_overhead_tiny']:.3f}; same training bit for bit: {out['same_training']}; "
          f"max in flight {out['max_in_flight']}; token gap {out['token_exact_gap']:.2e} nats; "
          f"mismatches {out['retokenize_mismatch']} plain, {out['retokenize_mismatch_edited']} edited")
    if "reward_first" in out:
        print(f"learning: reward {out['reward_first']:.3f} -> {out['reward_last']:.3f}, held-out "
              f"{out['eval_before']:.3f} -> {out['eval_after']:.3f}, tool calls per episode "
              f"{out['tool_calls_first']:.2f} -> {out['tool_calls_last']:.2f}")
    record.emit("agent", out, args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
