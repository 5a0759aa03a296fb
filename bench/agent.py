"""Agent benchmark: the same episodes through the agents' OpenAI-compatible endpoint and through the built-in
environment loop, side by side; and, with a real model, whether an agent program learns through it.

1. **Endpoint against the loop** (the tiny model, ``graphs/grpo_multiturn.yaml``, ``local``, one wave): the
   ``copy_chain`` environment, and the same episode written as an agent program over ``/completions``
   (``examples/agents/copy_chain.py``), trained for ``--steps`` steps each from the same seed, alternating
   runs ``--repeats`` times. Reported: each side's seconds per step in steady state and their ratio
   (``endpoint_overhead``: agent over loop); ``same_training``: whether the two runs' learning metrics
   (reward, loss, gradient norm, entropy at every step) are equal bit for bit (the endpoint samples and
   trains exactly what the loop does); ``max_in_flight``: the most requests generated in one batch;
   ``token_exact_gap``: the trainer's log-probs of the recorded ids against the sampler's, in nats, at the
   first trained step (both on the initial weights); ``retokenize_mismatch`` for the plain agent and
   ``retokenize_mismatch_edited`` for the one that tidies the replies it sends back.
2. **Learning** (``--learn``; needs the ``vllm`` extra): ``graphs/smollm2_agent.yaml``, SmolLM2-135M through
   vLLM driven by ``examples/agents/calculator.py`` (the OpenAI tools API): reward first and last, held-out
   reward before and after.

    python bench/agent.py [--quick] [--learn] [--steps N]

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

MULTITURN = ROOT / "graphs" / "grpo_multiturn.yaml"
AGENT = ROOT / "examples" / "agents" / "copy_chain.py"
LEARN = ROOT / "graphs" / "smollm2_agent.yaml"
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
    base = [f"schedule.iterations={steps}", "nodes.generate.eval_every=0", "nodes.generate.env.waves=1"]
    budget = og.load(MULTITURN).nodes["generate"].env.max_tokens
    agent = [f"schedule.iterations={steps}", "nodes.generate.eval_every=0", "nodes.generate.env=null",
             f"nodes.generate.agent={{entry: '{AGENT}:solve', max_tokens: {budget}, batch_wait_s: 30}}"]
    edited = agent[:-1] + [f"nodes.generate.agent={{entry: '{AGENT}:edited', max_tokens: {budget}, batch_wait_s: 30}}"]
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
            "endpoint_overhead": statistics.median(agent_s) / statistics.median(loop_s),
            "same_training": same, "repeats": repeats, "steps": steps,
            "max_in_flight": max(r.get("agent_max_in_flight", 0) for r in rows),
            "requests_per_step": statistics.mean(r["agent_requests"] for r in rows if "agent_requests" in r),
            "token_exact_gap": first_trained["behav_vs_old_logprob_absdiff_mean"],
            "token_exact": first_trained["behav_vs_old_logprob_absdiff_mean"] <= 0.05,
            "retokenize_mismatch": sum(r.get("retokenize_mismatch", 0) for r in rows),
            "retokenize_mismatch_edited": sum(r.get("retokenize_mismatch", 0) for r in tidy),
            "tiny_reward_first": rewards[0], "tiny_reward_last": statistics.mean(rewards[-3:])}


def learn(tmp: Path, steps: int) -> dict:
    plan = og.compile(LEARN, overrides=[f"schedule.iterations={steps}", f"nodes.generate.eval_every={steps}"])
    res = run(plan, run_dir=tmp / "learn", executor="ray", progress=False)
    rows = res.metrics
    rewards = [r["reward_mean"] for r in rows if r.get("reward_mean") is not None]
    evals = [r["eval_reward_mean"] for r in rows if r.get("eval_reward_mean") is not None]
    return {"reward_first": rewards[0], "reward_last": statistics.mean(rewards[-3:]),
            "eval_before": evals[0] if evals else None, "eval_after": evals[-1] if len(evals) > 1 else None,
            "learn_steps": steps, "tool_calls_per_episode": rows[-2].get("tool_calls_per_episode"),
            "learn_minutes": res.wall_s / 60}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer steps and repeats")
    ap.add_argument("--steps", type=int, default=None, help="steps of each side-by-side run (8 quick, 30 full)")
    ap.add_argument("--learn", action="store_true", help="also train SmolLM2's tool agent through vLLM")
    ap.add_argument("--learn-steps", type=int, default=20)
    record.add_arguments(ap)
    args = ap.parse_args()
    steps = args.steps or (8 if args.quick else 30)
    t0 = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        print(f"endpoint against the environment loop: {steps} steps, the tiny model", flush=True)
        out = side_by_side(tmp, steps, 2 if args.quick else 3)
        if args.learn:
            if importlib.util.find_spec("vllm") is None:
                out["learn_skipped"] = "vllm is not installed (the vllm extra)"
            else:
                print(f"learning: SmolLM2 through vLLM, {args.learn_steps} steps", flush=True)
                out.update(learn(tmp, args.learn_steps))
    out["minutes"] = (time.time() - t0) / 60
    print(f"\nloop {out['loop_s_per_step']:.3f} s/step, endpoint {out['agent_s_per_step']:.3f} s/step: overhead "
          f"x{out['endpoint_overhead']:.3f}; same training bit for bit: {out['same_training']}; "
          f"max in flight {out['max_in_flight']}; token gap {out['token_exact_gap']:.2e} nats; "
          f"mismatches {out['retokenize_mismatch']} plain, {out['retokenize_mismatch_edited']} edited")
    record.emit("agent", out, args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
