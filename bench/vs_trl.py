"""omnigraph vs TRL's ``GRPOTrainer``: the same GRPO job on this CPU, in one run, like for like.

Both sides train the embedded ``tiny`` model (``nodes.zoo.tiny(0)``, the same weights on
disk) on the ``digits`` task with the same settings:

- the same prompts, in the same order: step ``i`` uses ``Digits(16, seed=0).batch(i)``
  (16 prompts x 8 samples = 128 completions per optimizer step), each prompt
  tokenized as ``bos + text``;
- sampling at temperature 1.0, top-p 1.0, no top-k, at most 16 new tokens, stop at eos;
- reward ``nodes.rewards.rules.digits_match``; GRPO advantages normalised by the group's std;
- PPO-clip (epsilon 0.2), token-mean loss over the whole batch (TRL ``loss_type="dapo"``),
  no KL (``beta=0``), one optimizer step per generated batch (TRL ``num_iterations=1``;
  omnigraph: no ``mini_batch_size``), the 128 completions in one micro-batch on both sides
  (TRL ``per_device_train_batch_size=128``; omnigraph ``micro_batch_size: 128``, set here
  and in the graphs);
- AdamW at lr 1e-3, weight decay 0, constant schedule, no warm-up, grad-norm clip 1.0, float32.

Runs, one after another (``ray`` executor, Ray Compiled Graphs, for every omnigraph row):

1. TRL, one process, ``THREADS`` (2) torch threads, pinned to the same cores as row 2;
2. omnigraph sync, **colocated**: ``graphs/grpo_sync.yaml`` as shipped, every node on one actor
   of ``THREADS`` CPUs (``THREADS`` torch threads, pinned): the same cores and threads as TRL,
   generation and training taking turns on both, on-policy;
3. omnigraph sync on two 1-CPU pools (the same graph split, :data:`SPLIT`: one thread each,
   taking turns, so one core is idle at any time; ``omnigraph check`` warns about it), on-policy;
4. omnigraph one-step-off on two 1-CPU pools (``graphs/grpo_one_step_off.yaml``): generation
   of batch i overlaps the update on batch i-1; trains on samples one version stale.

Figures: ``speedup_sync`` (the headline) = TRL s/step / row 2's s/step: same cores, same threads,
both on-policy. ``speedup`` (= ``speedup_best``) = TRL s/step / the fastest omnigraph row, named by
``best_layout`` (a different layout, and for one-step-off a different algorithm: one version off-policy).
``omnigraph_startup_s``: the longest of the omnigraph rows' start-up (``run`` called to step 1 begun:
Ray, the actors, their imports and models, the compiled graph), against ``trl_startup_s``.

s/step is steady state: the median wall time between consecutive finished steps,
without start-up (model loading, Ray and actor start): omnigraph's rows' ``step_s``
after the first 2 steps; TRL's ``on_step_end`` to ``on_step_end`` intervals after
its first step (so generation, reward, the update and TRL's logging all count, as
they do in omnigraph's ``step_s``). Final reward: the mean training reward of the
last 5 steps (TRL's ``reward`` log key, omnigraph's ``reward_mean``).

What differs (the work per step is the same algorithm, not the same code):

- ``old_logprob``: with one optimizer step per batch omnigraph fuses it into the update's
  forward (``nodes.trainer.logprob.Logprob.fusable``): no second forward, as TRL with
  ``num_iterations=1`` (its old logprobs are the detached current ones). The JSON's
  ``*_old_logprob_fused`` says whether each run did fuse (from its metrics).
- Prompts: a group's 8 samples share their prompt. omnigraph runs each distinct prompt through the
  model once, in the rollout's prefill and in the trainer's forward (``nodes.models.prefix``; the trainer's
  gradients flow back through the shared keys and values: the same logprobs and gradients, to float
  rounding); TRL runs the prompt once per sample. ``nodes.update.share_prompts=false`` turns it off in
  the trainer.
- Padding: where a few completions are much longer than the rest, omnigraph's trainer scores the short
  and the long ones in forwards of their own (``nodes.trainer.buckets``: one token-mean loss, the same
  gradients), TRL pads every completion to the longest.
- Generation: both call transformers ``generate``; omnigraph also asks it for the logits
  and keeps the sampling logprobs (the behaviour policy of its decoupled PPO loss), TRL
  does not.
- Weights: TRL generates with the model it trains (no copy). omnigraph's rollout holds a
  model of its own and loads the trainer's weights every step (``sync``: packed into a
  ``/dev/shm`` file, then ``load_state_dict``), also when colocated on one actor.
- Process layout: TRL is one Python process; omnigraph runs its nodes in Ray actors
  driven by the compiled graph (batches cross actors through shared memory; colocated,
  they stay in the actor).
- omnigraph's periodic greedy eval (``eval_every``) is switched off, as TRL evaluates nothing.
- Sampling is random and seeded differently on the two sides, so rewards agree only
  statistically; with few steps (``--quick``) the reward columns are noisy.
- The machine may be shared: absolute times vary between runs; the runs happen back to
  back, so their ratios are the figures to read (the load average is recorded).

    python bench/vs_trl.py [--quick] [--steps N] [--no-save]

Needs the ``bench`` extra (``pip install -e '.[bench]'``: TRL, datasets). Prints a table, then one JSON
line (last), also saved under ``bench/results/`` (``bench/record.py``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
os.environ.setdefault("RAY_AUTH_MODE", "disabled")     # a local, loopback-only cluster
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import record  # noqa: E402

PROMPTS, SAMPLES = 16, 8
LR, MAX_NEW_TOKENS, CLIP = 3e-4, 16, 0.2
MICRO = PROMPTS * SAMPLES          # one micro-batch of all 128 completions, on both sides
THREADS = 2                        # TRL's torch threads = the colocated omnigraph actor's CPUs
SEED = 0
LAST = 5


def median(xs):
    return statistics.median(xs) if xs else None


def tail_mean(xs, n=LAST):
    xs = [x for x in xs if x is not None]
    return sum(xs[-n:]) / len(xs[-n:]) if xs else None


def cores(n: int) -> list[int]:
    """The ``n`` cores omnigraph's executor gives the first actor (``placement.core_layout``), for TRL too."""
    try:
        from omnigraph.executors.ray.placement import physical_first
        free = physical_first(sorted(os.sched_getaffinity(0)))
    except Exception:  # noqa: BLE001 - no affinity API: every core
        return []
    return free[:n] if len(free) >= n else []


@contextlib.contextmanager
def pinned(cpus: list[int]):
    """This thread (and the threads it starts, e.g. torch's OpenMP pool) on ``cpus`` while inside."""
    if not cpus:
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


# -- TRL ---------------------------------------------------------------------

def run_trl(steps: int, workdir: str) -> dict:
    import pyarrow
    import torch
    import trl
    from datasets import Dataset
    from transformers import PrinterCallback, TrainerCallback
    from transformers.utils import logging as hf_logging
    from trl import GRPOConfig, GRPOTrainer

    from nodes import models, zoo
    from nodes.rewards.rules import digits_match
    from nodes.tasks.procedural import Digits

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    torch.set_num_threads(THREADS)
    t0 = time.perf_counter()
    model, tok = models.load(zoo.tiny(SEED))
    assert tok.pad_token == "<pad>" and tok.padding_side == "left"
    # omnigraph tokenizes bos + text without other special tokens; TRL calls the tokenizer with its
    # defaults, which add none for this tokenizer: check, so both sides see the same prompt tokens
    probe = tok.bos_token + "copy 123:"
    assert tok(probe)["input_ids"] == tok(probe, add_special_tokens=False)["input_ids"]

    task = Digits(prompts=PROMPTS, seed=SEED)
    rows = [{"prompt": tok.bos_token + p.text, "target": p.meta["target"]}
            for step in range(steps) for p in task.batch(step)]
    # in memory, with a fixed fingerprint: nothing is cached, and datasets' content hashing (dill) fails on
    # some dill/pyarrow pairs ("Can't pickle <class 'MonthDayNano'>")
    dataset = Dataset(pyarrow.Table.from_pylist(rows), fingerprint=f"omnigraph-vs-trl-{steps}")

    def digits_reward(prompts, completions, target, **kwargs):
        return [digits_match(p, c, target=t) for p, c, t in zip(prompts, completions, target)]

    args = GRPOConfig(
        output_dir=os.path.join(workdir, "trl"),
        max_steps=steps,
        per_device_train_batch_size=MICRO,                 # 128 completions = 16 prompts x 8, one micro-batch
        gradient_accumulation_steps=1,
        steps_per_generation=1,                            # one generation batch per optimizer step
        num_generations=SAMPLES,
        num_iterations=1,                                  # old logprobs = the detached current ones
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
    return {"key": "trl", "name": "TRL GRPOTrainer", "version": trl.__version__,
            "how": f"1 process, {torch.get_num_threads()} torch threads", "threads": torch.get_num_threads(),
            "on_policy": True, "steps": len(timer.end), "s_per_step": median(intervals), "intervals": intervals,
            "s_per_step_begin_end": median(inside),
            "startup_s": timer.begin[0] - t0 if timer.begin else None,     # load, build the trainer, until step 1
            "setup_s": t_train - t0, "wall_s": wall,
            "reward_first": rewards[0] if rewards else None, "reward_final": tail_mean(rewards),
            "rewards": rewards}


# -- omnigraph ---------------------------------------------------------------

SPLIT = ["pools.rollout={actors: 1, cpus: 1, gpus: 0}", "nodes.generate.pool=rollout", "nodes.reward.pool=rollout",
         "pools.trainer.cpus=1"]
"""The shipped sync graph (one pool) on two 1-CPU pools: the layout ``omnigraph check`` warns about."""

LAYOUTS = {
    # key: (graph, overrides, label)
    "colocated_sync": ("grpo_sync.yaml", [f"pools.trainer.cpus={THREADS}"], f"sync, 1 actor x {THREADS} CPUs"),
    "sync": ("grpo_sync.yaml", SPLIT, "sync, 2 pools x 1 CPU"),
    "one_step_off": ("grpo_one_step_off.yaml", [], "one-step-off, 2 pools x 1 CPU"),
}


def run_omnigraph(key: str, steps: int, workdir: str) -> dict:
    import omnigraph as og
    from omnigraph.runtime import run

    graph, layout, label = LAYOUTS[key]
    overrides = [f"schedule.iterations={steps}", "nodes.generate.eval_every=0", "checkpoint.every=null",
                 f"task.prompts={PROMPTS}", f"task.samples_per_prompt={SAMPLES}", f"task.seed={SEED}",
                 f"model.seed={SEED}", f"nodes.update.lr={LR}", f"nodes.update.clip={CLIP}",
                 "nodes.update.max_grad_norm=1.0", "nodes.update.mini_batch_size=null",
                 f"nodes.update.micro_batch_size={MICRO}", f"nodes.old_logprob.micro_batch_size={MICRO}",
                 f"nodes.generate.max_new_tokens={MAX_NEW_TOKENS}", "nodes.generate.temperature=1.0",
                 "nodes.generate.top_p=1.0", "runtime.executor=ray", "runtime.pin_cpus=true"]
    spec = og.load(ROOT / "graphs" / graph, layout + overrides)
    plan = og.compile(spec)
    t0 = time.perf_counter()
    res = run(plan, run_dir=os.path.join(workdir, "omnigraph"), executor="ray", progress=False)
    wall = time.perf_counter() - t0
    rows = res.metrics
    rewards = [r["reward_mean"] for r in rows if "reward_mean" in r]
    steady = rows[2:]
    fused = bool(steady) and all("behav_vs_old_logprob_maxdiff_max" in r for r in steady) and \
        not any("behav_vs_old_logprob_maxdiff" in r for r in steady)
    pools = plan.graph.spec.pools
    how = ", ".join(f"{name}: {p.actors}x{p.cpus:g} CPU" for name, p in pools.items())
    return {"key": key, "name": f"omnigraph {label}", "graph": f"graphs/{graph}", "how": how,
            "threads_per_actor": {name: int(p.cpus) for name, p in pools.items()},
            "on_policy": plan.bound == 0, "staleness_bound": plan.bound, "weights_path": plan.weights.get("sync"),
            "steps": len(rows), "s_per_step": median([r["step_s"] for r in steady]),
            "runtime_s_per_step": res.summary.get("s_per_step"), "startup_s": res.summary.get("startup_s"),
            "wall_s": wall, "staleness_max": res.summary.get("observed_max_staleness"),
            "old_logprob_fused": fused,
            "node_s": {n: median([r[f"timing_s/{n}"] for r in steady if f"timing_s/{n}" in r])
                       for n in ("generate", "reward", "old_logprob", "update", "sync")},
            "reward_first": rewards[0] if rewards else None, "reward_final": tail_mean(rewards),
            "rewards": rewards}


# -- report ------------------------------------------------------------------

def fmt(x, spec):
    return "-" if x is None else format(x, spec)


def ratio(a, b):
    return a / b if a and b else None


def table(results: list[dict], trl_s: float | None) -> str:
    head = ["system", "compute", "policy", "steps", "s/step", "TRL / this", "start-up s", "reward first",
            f"reward last {LAST}"]
    lines = []
    for r in results:
        policy = "on" if r["on_policy"] else f"{r.get('staleness_bound', '?')} stale"
        lines.append([r["name"], r["how"], policy, str(r["steps"]), fmt(r["s_per_step"], ".3f"),
                      "x" + fmt(ratio(trl_s, r["s_per_step"]), ".2f"), fmt(r["startup_s"], ".1f"),
                      fmt(r["reward_first"], ".3f"), fmt(r["reward_final"], ".3f")])
    widths = [max(len(h), *(len(l[i]) for l in lines)) for i, h in enumerate(head)]
    out = ["  ".join(h.ljust(w) for h, w in zip(head, widths)), "  ".join("-" * w for w in widths)]
    out += ["  ".join(c.ljust(w) for c, w in zip(l, widths)) for l in lines]
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="20 steps each instead of 60 (a few minutes)")
    ap.add_argument("--steps", type=int, default=None, help="steps per system (default 60, --quick 20)")
    record.add_arguments(ap)
    args = ap.parse_args()
    steps = args.steps or (20 if args.quick else 60)
    if steps < 4:
        ap.error("--steps must be at least 4 (the first steps are start-up)")
    if len(os.sched_getaffinity(0)) < THREADS:
        ap.error(f"needs {THREADS} cores (this process may use {len(os.sched_getaffinity(0))})")

    from nodes import zoo
    zoo.tiny(SEED)                       # build the embedded model once, outside every timing
    load = os.getloadavg()[0]
    same = cores(THREADS)

    with tempfile.TemporaryDirectory(prefix="omnigraph-vs-trl-") as work:
        print(f"TRL GRPOTrainer, {steps} steps, {THREADS} threads on cores {same or 'any'} ...", flush=True)
        loads = {"trl": os.getloadavg()[0]}
        with pinned(same):
            trl_r = run_trl(steps, work)
        og_r = {}
        for key, (_, _, label) in LAYOUTS.items():
            print(f"omnigraph {label} (ray), {steps} steps ...", flush=True)
            loads[key] = os.getloadavg()[0]
            og_r[key] = run_omnigraph(key, steps, work)
        loads["end"] = os.getloadavg()[0]

    trl_s = trl_r["s_per_step"]
    best = min((r for r in og_r.values() if r["s_per_step"]), key=lambda r: r["s_per_step"], default=None)
    print()
    print(f"GRPO on the embedded tiny model, digits task: {PROMPTS} prompts x {SAMPLES} samples = "
          f"{PROMPTS * SAMPLES} completions/step (one micro-batch), lr {LR:g}, {MAX_NEW_TOKENS} new tokens, beta 0; "
          f"{os.cpu_count()} CPU cores, load average at start {load:.2f}")
    print(table([trl_r, *og_r.values()], trl_s))
    print(f"s/step: steady-state median (omnigraph: steps after the first 2; TRL: after the first). "
          f"TRL {trl_r['version']}: {trl_r['threads']} torch threads in one process; omnigraph colocated: one actor "
          f"with {THREADS} CPUs and threads (the same cores); 2 pools: 1 CPU and 1 thread each.")
    fused = {k: r["old_logprob_fused"] for k, r in og_r.items()}
    print(f"old_logprob fused into the update's forward (no second forward): {fused}; weights each step by "
          f"{og_r['colocated_sync']['weights_path']} (TRL generates with the trained model itself).")
    speedup_sync = ratio(trl_s, og_r["colocated_sync"]["s_per_step"])
    speedup_best = ratio(trl_s, best["s_per_step"]) if best else None
    print(f"load average (1 min) before each run: {', '.join(f'{k} {v:.2f}' for k, v in loads.items())} on "
          f"{os.cpu_count()} cores: another process's load slows a 2-thread run the most (compare runs on a quiet "
          "machine only)")
    print(f"speedup_sync (same cores and threads, both on-policy): x{fmt(speedup_sync, '.2f')}; "
          f"speedup_best ({best['name'] if best else '-'}): x{fmt(speedup_best, '.2f')}; start-up: omnigraph up to "
          f"{fmt(max((r['startup_s'] or 0) for r in og_r.values()), '.1f')} s, TRL {fmt(trl_r['startup_s'], '.1f')} s")

    def r4(x):
        return None if x is None else round(x, 4)

    out = {
        "speedup_sync": r4(speedup_sync),
        "speedup_sync_what": f"TRL s/step / omnigraph sync s/step, both on-policy, the same {THREADS} cores and "
                             f"{THREADS} torch threads (omnigraph: every node on one {THREADS}-CPU actor)",
        "speedup_best": r4(speedup_best),
        "speedup": r4(speedup_best),
        "omnigraph_startup_s": max((r["startup_s"] for r in og_r.values() if r["startup_s"] is not None),
                                   default=None),
        "best_layout": best["name"].removeprefix("omnigraph ") if best else None,
        "best_layout_key": best["key"] if best else None,
        "best_layout_on_policy": best["on_policy"] if best else None,
        "trl_s_per_step": r4(trl_s),
        "trl_threads": trl_r["threads"], "trl_version": trl_r["version"],
        "trl_startup_s": r4(trl_r["startup_s"]), "trl_s_per_step_begin_end": r4(trl_r["s_per_step_begin_end"]),
        "trl_first_reward": r4(trl_r["reward_first"]), "trl_final_reward": r4(trl_r["reward_final"]),
        "trl_steps": trl_r["steps"],
        "omnigraph": {k: {"layout": r["name"].removeprefix("omnigraph "), "graph": r["graph"], "pools": r["how"],
                          "threads_per_actor": r["threads_per_actor"], "on_policy": r["on_policy"],
                          "staleness_bound": r["staleness_bound"], "staleness_max": r["staleness_max"],
                          "s_per_step": r4(r["s_per_step"]), "speedup_vs_trl": r4(ratio(trl_s, r["s_per_step"])),
                          "runtime_s_per_step": r["runtime_s_per_step"], "startup_s": r["startup_s"],
                          "old_logprob_fused": r["old_logprob_fused"], "weights_path": r["weights_path"],
                          "node_s": {n: r4(v) for n, v in r["node_s"].items()},
                          "first_reward": r4(r["reward_first"]), "final_reward": r4(r["reward_final"]),
                          "steps": r["steps"]}
                      for k, r in og_r.items()},
        "batch": {"prompts": PROMPTS, "samples_per_prompt": SAMPLES, "completions": PROMPTS * SAMPLES,
                  "micro_batch": MICRO, "optimizer_steps_per_batch": 1},
        "lr": LR, "max_new_tokens": MAX_NEW_TOKENS, "executor": "ray", "cores_pinned": same,
        "cpu_count": os.cpu_count(), "reward_window": LAST, "steps": steps, "load_avg_start": round(load, 2),
        "load_avg_before": {k: round(v, 2) for k, v in loads.items()},
        "trl_step_s": [round(x, 4) for x in trl_r["intervals"]],
    }
    record.emit("vs_trl", out, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
