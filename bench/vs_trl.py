"""omnigraph vs TRL's ``GRPOTrainer``: the same GRPO job on this CPU, in one run.

Both sides train the embedded ``tiny`` model (``nodes.models.resolve("tiny", 0)``,
the same weights on disk) on the ``digits`` task with the same settings:

- the same prompts, in the same order: step ``i`` uses ``Digits(16, seed=0).batch(i)``
  (16 prompts x 8 samples = 128 completions per optimizer step), each prompt
  tokenized as ``bos + text``;
- sampling at temperature 1.0, top-p 1.0, no top-k, at most 16 new tokens, stop at eos;
- reward ``nodes.rewards.digits_match``; GRPO advantages normalised by the group's std;
- PPO-clip (epsilon 0.2), token-mean loss over the whole batch (TRL ``loss_type="dapo"``),
  no KL (``beta=0``), one optimizer step per generated batch (``num_iterations=1``);
- AdamW at lr 1e-3, weight decay 0, constant schedule, no warm-up, grad-norm clip 1.0, float32.

Three runs, one after another: TRL (``GRPOTrainer`` in this process), then
omnigraph ``graphs/grpo_one_step_off.yaml`` and ``graphs/grpo_sync.yaml`` on the
``ray`` executor (Ray Compiled Graphs). ``speedup`` is TRL's s/step over the
one-step-off graph's.

s/step is steady state: the median wall time between consecutive finished steps,
without start-up (model loading, Ray and actor start): omnigraph's rows' ``step_s``
after the first 2 steps; TRL's ``on_step_end`` to ``on_step_end`` intervals after
its first step (so generation, reward, the update and TRL's logging all count, as
they do in omnigraph's ``step_s``). Final reward: the mean training reward of the
last 5 steps (TRL's ``reward`` log key, omnigraph's ``reward_mean``).

Fairness caveats:

- Cores: this machine has few CPU cores. TRL runs in one process with
  ``torch.set_num_threads(2)``, generation and training taking turns on both cores.
  omnigraph runs a rollout actor and a trainer actor, 1 CPU (1 torch thread) each:
  in the sync graph they take turns (one core idle at a time), in the one-step-off
  graph they overlap. Neither side gets more than 2 cores of compute.
- Work per step is not identical: omnigraph's trainer runs an extra no-grad forward
  pass (``old_logprob``) and trains in micro-batches of 16, and ships the full
  weights to the rollout actor every step; TRL with ``num_iterations=1`` skips the
  old-logprob pass (its ratio is 1 by construction) and runs the 128 completions
  as one batch. Both generate with transformers ``generate``.
- omnigraph's periodic greedy eval (``eval_every``) is switched off, as TRL evaluates
  nothing here.
- The one-step-off graph trains on samples one version stale (by design), so its
  reward curve can lag the synchronous ones'; TRL and the sync graph are on-policy.
- Sampling is random and seeded differently on the two sides, so rewards agree only
  statistically; with few steps (``--quick``) the reward columns are noisy.
- The machine may be shared: absolute times vary between runs; the three runs
  happen back to back, so their ratio is the figure to read.

    python bench/vs_trl.py [--quick] [--steps N]

Prints a table, then one JSON line (last).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("RAY_AUTH_MODE", "disabled")     # a local, loopback-only cluster
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

PROMPTS, SAMPLES = 16, 8
LR, MAX_NEW_TOKENS, CLIP = 1e-3, 16, 0.2
TRL_THREADS = 2
SEED = 0
LAST = 5


def median(xs):
    return statistics.median(xs) if xs else None


def tail_mean(xs, n=LAST):
    xs = [x for x in xs if x is not None]
    return sum(xs[-n:]) / len(xs[-n:]) if xs else None


# -- TRL ---------------------------------------------------------------------

def run_trl(steps: int, workdir: str) -> dict:
    import torch
    import trl
    from datasets import Dataset
    from transformers import PrinterCallback, TrainerCallback
    from transformers.utils import logging as hf_logging
    from trl import GRPOConfig, GRPOTrainer

    from nodes import models
    from nodes.rewards import digits_match
    from nodes.tasks import Digits

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    torch.set_num_threads(TRL_THREADS)
    t0 = time.perf_counter()
    model, tok = models.load(models.resolve("tiny", SEED))
    assert tok.pad_token == "<pad>" and tok.padding_side == "left"
    # omnigraph tokenizes bos + text without other special tokens; TRL calls the tokenizer with its
    # defaults, which add none for this tokenizer: check, so both sides see the same prompt tokens
    probe = tok.bos_token + "copy 123:"
    assert tok(probe)["input_ids"] == tok(probe, add_special_tokens=False)["input_ids"]

    task = Digits(prompts=PROMPTS, seed=SEED)
    rows = [{"prompt": tok.bos_token + p.text, "target": p.meta["target"]}
            for step in range(steps) for p in task.batch(step)]
    dataset = Dataset.from_list(rows)

    def digits_reward(prompts, completions, target, **kwargs):
        return [digits_match(p, c, target=t) for p, c, t in zip(prompts, completions, target)]

    args = GRPOConfig(
        output_dir=os.path.join(workdir, "trl"),
        max_steps=steps,
        per_device_train_batch_size=PROMPTS * SAMPLES,    # 128 completions = 16 prompts x 8
        gradient_accumulation_steps=1,
        steps_per_generation=1,                            # one generation batch per optimizer step
        num_generations=SAMPLES,
        num_iterations=1,
        max_completion_length=MAX_NEW_TOKENS,
        temperature=1.0, top_p=1.0, top_k=0,
        beta=0.0, epsilon=CLIP,
        loss_type="dapo",                                  # token-mean over the batch, like omnigraph
        scale_rewards="group",                             # like omnigraph's normalize_std
        learning_rate=LR, weight_decay=0.0, max_grad_norm=1.0,
        optim="adamw_torch", lr_scheduler_type="constant", warmup_steps=0,
        shuffle_dataset=False,                             # step i sees Digits.batch(i)
        remove_unused_columns=False,                       # keep `target` for the reward
        gradient_checkpointing=False, bf16=False, fp16=False, use_cpu=True,
        logging_steps=1, report_to=[], save_strategy="no", disable_tqdm=True,
        seed=SEED, dataloader_num_workers=0,
    )

    class Timer(TrainerCallback):
        def __init__(self):
            self.begin, self.end, self.rewards = [], [], {}

        def on_step_begin(self, args, state, control, **kw):
            self.begin.append(time.perf_counter())

        def on_step_end(self, args, state, control, **kw):
            self.end.append(time.perf_counter())

        def on_log(self, args, state, control, logs=None, **kw):
            if logs and "reward" in logs:
                self.rewards[state.global_step] = float(logs["reward"])

    timer = Timer()
    trainer = GRPOTrainer(model=model, processing_class=tok, reward_funcs=[digits_reward], args=args,
                          train_dataset=dataset, callbacks=[timer])
    trainer.remove_callback(PrinterCallback)          # the per-step log dicts; the table reports them
    t_train = time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - t0
    intervals = [b - a for a, b in zip(timer.end, timer.end[1:])]       # excludes the first step
    inside = [e - b for b, e in zip(timer.begin, timer.end)][1:]
    rewards = [timer.rewards[k] for k in sorted(timer.rewards)]
    return {"name": "TRL GRPOTrainer", "version": trl.__version__, "how": f"1 process, {TRL_THREADS} torch threads",
            "steps": len(timer.end), "s_per_step": median(intervals), "s_per_step_begin_end": median(inside),
            "startup_s": timer.begin[0] - t0 if timer.begin else None,     # load, build the trainer, until step 1
            "setup_s": t_train - t0, "wall_s": wall,
            "reward_first": rewards[0] if rewards else None, "reward_final": tail_mean(rewards),
            "rewards": rewards}


# -- omnigraph ---------------------------------------------------------------

def run_omnigraph(graph: str, steps: int, workdir: str) -> dict:
    import omnigraph as og
    from omnigraph.runtime import run

    overrides = [f"schedule.iterations={steps}", "nodes.generate.eval_every=0",
                 f"task.prompts={PROMPTS}", f"task.samples_per_prompt={SAMPLES}",
                 f"nodes.update.lr={LR}", f"nodes.update.clip={CLIP}", "nodes.update.max_grad_norm=1.0",
                 f"nodes.generate.max_new_tokens={MAX_NEW_TOKENS}", "nodes.generate.temperature=1.0",
                 "nodes.generate.top_p=1.0"]
    plan = og.compile(str(ROOT / "graphs" / graph), overrides=overrides)
    t0 = time.perf_counter()
    res = run(plan, run_dir=os.path.join(workdir, "omnigraph"), executor="ray", progress=False)
    wall = time.perf_counter() - t0
    rows = res.metrics
    rewards = [r["reward_mean"] for r in rows if "reward_mean" in r]
    pools = plan.graph.spec.pools
    how = ", ".join(f"{name}: {p.actors}x{p.cpus:g} CPU" for name, p in pools.items())
    return {"name": f"omnigraph {plan.graph.spec.schedule.mode}", "graph": f"graphs/{graph}", "how": how,
            "steps": len(rows), "s_per_step": median([r["step_s"] for r in rows[2:]]),
            "runtime_s_per_step": res.summary.get("s_per_step"), "startup_s": res.summary.get("startup_s"),
            "wall_s": wall, "staleness_max": res.summary.get("observed_max_staleness"),
            "reward_first": rewards[0] if rewards else None, "reward_final": tail_mean(rewards),
            "rewards": rewards}


# -- report ------------------------------------------------------------------

def fmt(x, spec):
    return "-" if x is None else format(x, spec)


def table(results: list[dict], trl_s: float | None) -> str:
    head = ["system", "compute", "steps", "s/step", "vs TRL", "start-up s", "reward first", f"reward last {LAST}"]
    lines = []
    for r in results:
        speed = trl_s / r["s_per_step"] if trl_s and r["s_per_step"] else None
        lines.append([r["name"], r["how"], str(r["steps"]), fmt(r["s_per_step"], ".3f"), fmt(speed, ".2f") + "x",
                      fmt(r["startup_s"], ".1f"), fmt(r["reward_first"], ".3f"), fmt(r["reward_final"], ".3f")])
    widths = [max(len(h), *(len(l[i]) for l in lines)) for i, h in enumerate(head)]
    out = ["  ".join(h.ljust(w) for h, w in zip(head, widths)), "  ".join("-" * w for w in widths)]
    out += ["  ".join(c.ljust(w) for c, w in zip(l, widths)) for l in lines]
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="20 steps each instead of 60 (a few minutes)")
    ap.add_argument("--steps", type=int, default=None, help="steps per system (default 60, --quick 20)")
    args = ap.parse_args()
    steps = args.steps or (20 if args.quick else 60)
    if steps < 4:
        ap.error("--steps must be at least 4 (the first steps are start-up)")

    from nodes import models
    models.resolve("tiny", SEED)           # build the embedded model once, outside every timing

    with tempfile.TemporaryDirectory(prefix="omnigraph-vs-trl-") as work:
        print(f"TRL GRPOTrainer, {steps} steps ...", flush=True)
        trl_r = run_trl(steps, work)
        print(f"omnigraph one-step-off (ray), {steps} steps ...", flush=True)
        off = run_omnigraph("grpo_one_step_off.yaml", steps, work)
        print(f"omnigraph sync (ray), {steps} steps ...", flush=True)
        sync = run_omnigraph("grpo_sync.yaml", steps, work)

    print()
    print(f"GRPO on the embedded tiny model, digits task: {PROMPTS} prompts x {SAMPLES} samples = "
          f"{PROMPTS * SAMPLES} completions/step, lr {LR:g}, {MAX_NEW_TOKENS} new tokens, beta 0; "
          f"{os.cpu_count()} CPU cores")
    print(table([trl_r, off, sync], trl_r["s_per_step"]))
    print(f"s/step: steady-state median (omnigraph: steps after the first 2; TRL: after the first). "
          f"TRL {trl_r['version']}: {TRL_THREADS} torch threads in one process; omnigraph: rollout and trainer "
          f"actors of 1 CPU (1 thread) each, overlapped in one-step-off, alternating in sync.")
    print("start-up: TRL: model load and trainer set-up until its first step; omnigraph: Ray and actor start "
          "(models loaded in the actors). steps: omnigraph one-step-off has one extra fill step (the same "
          f"{steps} optimizer steps).")

    speedup = trl_r["s_per_step"] / off["s_per_step"] if trl_r["s_per_step"] and off["s_per_step"] else None
    speedup_sync = trl_r["s_per_step"] / sync["s_per_step"] if trl_r["s_per_step"] and sync["s_per_step"] else None

    def r4(x):
        return None if x is None else round(x, 4)

    out = {
        "trl_s_per_step": r4(trl_r["s_per_step"]),
        "omnigraph_s_per_step": r4(off["s_per_step"]),
        "speedup": r4(speedup),
        "trl_final_reward": r4(trl_r["reward_final"]),
        "omnigraph_final_reward": r4(off["reward_final"]),
        "omnigraph_sync_s_per_step": r4(sync["s_per_step"]),
        "speedup_sync": r4(speedup_sync),
        "omnigraph_sync_final_reward": r4(sync["reward_final"]),
        "trl_first_reward": r4(trl_r["reward_first"]),
        "omnigraph_first_reward": r4(off["reward_first"]),
        "omnigraph_sync_first_reward": r4(sync["reward_first"]),
        "trl_steps": trl_r["steps"], "omnigraph_steps": off["steps"], "omnigraph_sync_steps": sync["steps"],
        "trl_startup_s": r4(trl_r["startup_s"]), "omnigraph_startup_s": off["startup_s"],
        "omnigraph_sync_startup_s": sync["startup_s"],
        "trl_s_per_step_begin_end": r4(trl_r["s_per_step_begin_end"]),
        "omnigraph_runtime_s_per_step": off["runtime_s_per_step"],
        "omnigraph_sync_runtime_s_per_step": sync["runtime_s_per_step"],
        "omnigraph_observed_max_staleness": off["staleness_max"],
        "batch": {"prompts": PROMPTS, "samples_per_prompt": SAMPLES, "completions": PROMPTS * SAMPLES},
        "lr": LR, "max_new_tokens": MAX_NEW_TOKENS, "trl_version": trl_r["version"], "trl_threads": TRL_THREADS,
        "omnigraph_actor_cpus": 1, "executor": "ray", "cpu_count": os.cpu_count(), "reward_window": LAST,
    }
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
