"""The trainer's precision on the CPU: float32 vs ``model.dtype: bfloat16`` (mixed precision), side by side.

What is timed is the project's real trainer step on a real batch: ``old_logprob``
(:class:`nodes.trainer.logprob.Logprob`; with one optimizer step per batch it fuses into
the update's forward and costs nothing) and ``update`` (:class:`nodes.trainer.update.Update`:
forward and backward of every micro-batch under the policy's precision, the
decoupled PPO-clip loss, gradient clipping and the AdamW step), built as a
trainer actor builds them (``omnigraph.testing.build_node``) from
``graphs/smollm2_vllm_one_step_off.yaml``: SmolLM2-135M with its LoRA, the
graph's batch (8 prompts x 4 samples = 32 completions of at most 16 new
tokens) and micro-batch (16), on ``--threads`` cores (one: what the graph's
trainer pool gets).

The batch is real: one batch of the graph's task, sampled once by the ``hf``
generate node in float32 and scored by the graph's reward, then given to both
trainers. The two trainers start from the same weights and are timed
alternately in one process (``--rounds`` updates each after one warm-up update,
which also creates the AdamW state), so the machine's drift hits both. Besides
the time: how far the bf16-autocast logprobs are from float32 ones on the same
tokens (the gap the decoupled PPO loss sees as off-policyness), measured before
any update.

    python bench/precision.py [--quick] [--model smollm2-135m|tiny] [--threads 1] [--no-save]

Last line: JSON with ``fp32_s``, ``bf16_s`` (seconds per update of the whole batch), ``speedup``,
``*_per_micro_batch_s``, ``logprob_max_abs_diff``, ``native_bf16`` (AMX / AVX512-BF16: without them
bf16 is emulated and slower); also saved under ``bench/results/``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
GRAPH = ROOT / "graphs" / "smollm2_vllm_one_step_off.yaml"


def load(model: str, dtype: str, extra: list[str]):
    import omnigraph as og
    over = [f"model.path={model}", f"model.dtype={dtype}", "nodes.generate.backend=hf", "nodes.generate.dtype=null",
            "nodes.generate.options.lora_serving=adapter",
            "nodes.generate.eval_every=0", "checkpoint.every=null"]
    if model == "tiny":
        over += ["task.name=digits", "nodes.reward.fn=nodes.rewards.rules:digits_match"]
    return og.load(GRAPH, over + extra)


def trainer(spec):
    """The trainer actor's ``old_logprob`` and ``update`` nodes, sharing one policy as on the actor."""
    from omnigraph.testing import build_node
    shared: dict = {}
    olp, _ = build_node(spec, "old_logprob", shared=shared)
    upd, ctx = build_node(spec, "update", shared=shared)
    return olp, upd, ctx


def real_batch(spec):
    """One batch of the graph's task: sampled by the hf generate node (float32), scored by the graph's reward."""
    from omnigraph.sdk import Weights
    from omnigraph.testing import build_node, prompts
    gen, _ = build_node(spec, "generate")
    rew, _ = build_node(spec, "reward")
    batch = gen.generate(0, prompts(spec, 0), Weights(0))
    return rew.score(0, batch)


def step(olp, upd, batch, i: int) -> float:
    """The trainer's work on one batch: old_logprob (fused or not), then the update. Seconds."""
    t0 = time.perf_counter()
    b = olp.logprobs(i, batch.with_fields())          # a fresh batch object: the fused marker is per call
    upd.train(i, b)
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="3 timed rounds (default 6)")
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--prompts", type=int, default=None, help="prompts per batch (default: the graph's, 8)")
    import record
    record.add_arguments(ap)
    args = ap.parse_args()
    import torch
    from nodes.trainer.policy import _native_bf16
    from omnigraph.planning.precision import resolve
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    extra = [f"task.prompts={args.prompts}"] if args.prompts else []
    specs = {d: load(args.model, d, extra) for d in ("float32", "bfloat16")}
    base = real_batch(specs["float32"])
    nodes = {d: trainer(s) for d, s in specs.items()}
    spec = specs["float32"]
    upd_opts = spec.nodes["update"]
    micro = upd_opts.micro_batch_size
    n_micro = -(-len(base) // micro)
    P = base.meta["prompt_len"]
    tokens = int(base.fields["attention_mask"].sum())
    fused = {d: olp.fusable(base) for d, (olp, _, _) in nodes.items()}
    rounds = args.rounds or (3 if args.quick else 6)
    print(f"precision benchmark: {args.model}{' + LoRA' if upd_opts.lora else ''}, the real trainer step "
          f"(old_logprob{' fused' if all(fused.values()) else ''} + update: PPO loss, backward, AdamW) on one real "
          f"batch of {len(base)} completions (prompt {P} + up to {base.fields['input_ids'].shape[1] - P} tokens, "
          f"{tokens} tokens), micro-batch {micro} ({n_micro} per update), {args.threads} thread(s), {rounds} "
          f"alternating rounds; native bf16 {_native_bf16()}, load average {os.getloadavg()[0]:.2f}", flush=True)
    auto = resolve("auto", "cpu")
    if auto.dtype != "bfloat16":
        print(f"  note: this machine has no native bf16 ({auto.why}): bfloat16 below is emulated; "
              "model.dtype: auto picks float32 here", flush=True)

    # the logprob gap on the same tokens, both trainers at the same initial weights
    with torch.no_grad():
        lp = {}
        for d, (_, upd, _) in nodes.items():
            pol = upd.policy
            pol.model.eval()
            lp[d] = pol.logprobs(pol.model, base, slice(0, len(base)), base.meta.get("temperature", 1.0))
            pol.model.train()
    mask = base.fields["response_mask"].bool()
    diff = (lp["float32"] - lp["bfloat16"]).abs()[mask]

    times: dict[str, list[float]] = {d: [] for d in nodes}
    for d, (olp, upd, _) in nodes.items():          # warm-up: oneDNN picks its kernels; AdamW makes its state
        step(olp, upd, base, 0)
    for r in range(rounds):
        for d, (olp, upd, _) in nodes.items():
            times[d].append(step(olp, upd, base, r + 1))
        print(f"  round {r + 1}: float32 {times['float32'][-1]:.3f} s  bfloat16 {times['bfloat16'][-1]:.3f} s",
              flush=True)
    losses = {d: ctx.metrics.get("loss") for d, (_, _, ctx) in nodes.items()}
    fp32, bf16 = statistics.median(times["float32"]), statistics.median(times["bfloat16"])
    res = {"model": args.model, "lora": bool(upd_opts.lora), "threads": args.threads, "rounds": rounds,
           "what": "old_logprob + update (PPO loss, backward, grad clip, AdamW step) on one real batch",
           "batch": len(base), "tokens": tokens, "micro_batch": micro, "micro_batches": n_micro,
           "old_logprob_fused": all(fused.values()),
           "fp32_s": round(fp32, 4), "bf16_s": round(bf16, 4), "speedup": round(fp32 / bf16, 3),
           "fp32_per_micro_batch_s": round(fp32 / n_micro, 4), "bf16_per_micro_batch_s": round(bf16 / n_micro, 4),
           "fp32_times_s": [round(t, 4) for t in times["float32"]], "bf16_times_s": [round(t, 4) for t in times["bfloat16"]],
           "last_loss": {d: None if v is None else round(v, 5) for d, v in losses.items()},
           "logprob_max_abs_diff": round(float(diff.max()), 4), "logprob_mean_abs_diff": round(float(diff.mean()), 5),
           "native_bf16": _native_bf16(), "auto_dtype": auto.dtype, "torch": torch.__version__, "load_avg": round(os.getloadavg()[0], 2)}
    print(f"  median per update: float32 {fp32:.3f} s, bfloat16 (fp32 masters, bf16 autocast) {bf16:.3f} s: "
          f"x{fp32 / bf16:.2f} ({fp32 / n_micro:.3f} vs {bf16 / n_micro:.3f} s per micro-batch of {micro}); "
          f"logprob gap mean {res['logprob_mean_abs_diff']}, max {res['logprob_max_abs_diff']}")
    record.emit("precision", res, args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
