"""The trainer's precision on the CPU: float32 vs ``model.dtype: bfloat16`` (mixed precision), side by side.

One update micro-batch (forward, token logprobs, backward) of omnigraph's
trainer :class:`nodes.trainer.Policy` on SmolLM2-135M with the LoRA of
``graphs/smollm2_vllm_one_step_off.yaml``, on ``--threads`` cores (one: what
the graph's trainer pool gets). Both policies are built from the same weights
and timed alternately in one process, so the machine's drift hits both.
Besides the time: how far the bf16-autocast logprobs are from float32 ones on
the same tokens (the gap the decoupled PPO loss sees as off-policyness).

    python bench/precision.py [--quick] [--model smollm2-135m|tiny] [--threads 1]

Last line: JSON with ``fp32_s``, ``bf16_s``, ``speedup``, ``logprob_max_abs_diff``,
``native_bf16`` (AMX / AVX512-BF16: without them bf16 is emulated and slower).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
GRAPH = ROOT / "graphs" / "smollm2_vllm_one_step_off.yaml"


def policy(model: str, dtype: str):
    import omnigraph as og
    from nodes.trainer import Policy
    spec = og.load(GRAPH, [f"model.path={model}", f"model.dtype={dtype}"])
    return Policy(spec, spec.nodes["update"], "cpu")


def step(pol, ids, prompt_len: int, backward: bool = True):
    """One micro-batch: forward under the policy's precision, completion-token logprobs, backward."""
    import torch
    from nodes.losses import token_logprobs
    t0 = time.perf_counter()
    with torch.set_grad_enabled(backward), pol.amp():
        logits = pol.model(input_ids=ids).logits
    lp = token_logprobs(logits[:, prompt_len - 1:-1], ids[:, prompt_len:])
    if backward:
        (-lp.mean()).backward()
        pol.model.zero_grad(set_to_none=True)
    return time.perf_counter() - t0, lp.detach()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="3 timed rounds (default 6)")
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batch", type=int, default=16, help="sequences per micro-batch (the graph's)")
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=16)
    args = ap.parse_args()
    import torch
    from nodes.trainer import _native_bf16
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    pols = {d: policy(args.model, d) for d in ("float32", "bfloat16")}
    vocab = pols["float32"].model.config.vocab_size
    ids = torch.randint(0, vocab, (args.batch, args.prompt_len + args.new_tokens))
    rounds = 3 if args.quick else 6
    print(f"precision benchmark: {args.model} + LoRA, {args.batch} x ({args.prompt_len} + {args.new_tokens}) "
          f"tokens per micro-batch, {args.threads} thread(s), {rounds} alternating rounds, native bf16 "
          f"{_native_bf16()}, load average {os.getloadavg()[0]:.2f}", flush=True)
    times: dict[str, list[float]] = {d: [] for d in pols}
    for d, pol in pols.items():                 # warm-up: oneDNN picks and caches its kernels
        step(pol, ids, args.prompt_len)
    for r in range(rounds):
        for d, pol in pols.items():
            times[d].append(step(pol, ids, args.prompt_len)[0])
        print(f"  round {r + 1}: float32 {times['float32'][-1]:.3f} s  bfloat16 {times['bfloat16'][-1]:.3f} s",
              flush=True)
    lp = {d: step(pol, ids, args.prompt_len, backward=False)[1] for d, pol in pols.items()}
    diff = (lp["float32"] - lp["bfloat16"]).abs()
    fp32, bf16 = statistics.median(times["float32"]), statistics.median(times["bfloat16"])
    res = {"model": args.model, "threads": args.threads, "fp32_s": round(fp32, 4), "bf16_s": round(bf16, 4),
           "speedup": round(fp32 / bf16, 3), "logprob_max_abs_diff": round(float(diff.max()), 4),
           "logprob_mean_abs_diff": round(float(diff.mean()), 5), "native_bf16": _native_bf16(),
           "torch": torch.__version__}
    print(f"  median: float32 {fp32:.3f} s, bfloat16 (fp32 masters, bf16 autocast) {bf16:.3f} s: x{fp32 / bf16:.2f}; "
          f"logprob gap mean {res['logprob_mean_abs_diff']}, max {res['logprob_max_abs_diff']}")
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
