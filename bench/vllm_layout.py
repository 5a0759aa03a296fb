"""vLLM's CPU engine with its own weight layout against omnigraph's refilled one: generation and weight loads.

On a CPU with AMX, in bf16, vLLM computes SmolLM2-135M's large linear layers and its head with oneDNN, packed
into new buffers at each weight load; omnigraph's direct load path (``nodes.rollout.vllm_weights``) moves them onto
sgl-kernel's layout, which it refills in place (``omnigraph.sdk.cpu_kernels.pack_vnni``). This measures what
that trades, in one engine, in one process, the two layouts alternating on the same weights:

- generation: tokens/s of ``sample`` (as the ``vllm`` backend samples in a run: logprobs on) at two batch
  sizes, the best of ``--repeats`` batches after a warm-up, per layout and round;
- the engine's load of a full set of weights (``engine_load_s``), the median of ``--repeats`` loads.

    python bench/vllm_layout.py [--quick]

Needs the ``vllm`` extra and a CPU with AMX (elsewhere both layouts are vLLM's). Last line: JSON with each
layout's figures and ``gen_ratio_*`` (omnigraph's tokens/s over vLLM's; above 1: faster) and ``load_ratio``.
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

BATCHES = {"32": (8, 4), "128": (32, 4)}
"""Sequences per batch -> (prompts, samples per prompt)."""


def use(layout: str, gen, weights) -> None:
    """Load ``weights`` so that the engine computes with ``layout`` (``vllm``: vLLM's own; ``omnigraph``: the
    refilled sgl-kernel buffers), through ``reload_weights`` (the direct plan is learned anew or not at all)."""
    from nodes.rollout import vllm_weights

    def forget(wrapper):
        worker = getattr(wrapper, "worker", wrapper)
        worker._omnigraph_packed = worker._omnigraph_direct = None
    gen.llm.collective_rpc(forget)
    moves = vllm_weights._to_packed
    if layout == "vllm":
        vllm_weights._to_packed = lambda model, linear, *args: (linear, [], False)
    try:
        gen.load_weights(weights)
    finally:
        vllm_weights._to_packed = moves


def tok_s(gen, ids, samples: int, new: int, repeats: int) -> float:
    best = 0.0
    for i in range(repeats + 1):
        t = time.perf_counter()
        out = gen.sample(ids, samples, greedy=False, seed=100 + i)
        dt = time.perf_counter() - t
        if i:
            best = max(best, float(out["response_mask"].sum()) / dt)
    return best


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="2 rounds, 2 timed batches each (default 3 and 3)")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    import record
    record.add_arguments(ap)
    args = ap.parse_args()
    try:
        import torch
        import vllm  # noqa: F401
    except Exception as e:
        sys.exit(f"bench/vllm_layout.py needs the vllm extra ({type(e).__name__}: {e}): pip install -e '.[vllm]'")
    if not torch.cpu._is_amx_tile_supported():
        sys.exit("bench/vllm_layout.py: this CPU has no AMX, so vLLM's layout is the only one (nothing to compare)")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    import omnigraph as og
    from omnigraph.sdk import Prompt
    from omnigraph.testing import build_node, export
    rounds, repeats = (2, 2) if args.quick else (3, 3)
    spec = og.load(ROOT / "graphs" / "smollm2_vllm_one_step_off.yaml", [
        "model.dtype=bfloat16", "nodes.generate.dtype=null", "nodes.update.lora=null", "nodes.sync.payload=full",
        f"nodes.generate.max_new_tokens={args.max_new_tokens}", "nodes.generate.temperature=1.0",
        "nodes.generate.options={packed_weights: true}"])
    sync, _ = build_node(spec, "sync")
    gen, ctx = build_node(spec, "generate")
    weights = export(spec, sync, 1)
    prompts = [gen.encode(Prompt(f"What is {a} + {3 * a % 17}? Explain step by step.")) for a in range(32)]
    load = os.getloadavg()[0]
    print(f"vLLM layout benchmark: SmolLM2-135M bf16, {args.max_new_tokens} new tokens at temperature 1, "
          f"{rounds} alternating rounds; load average {load:.2f} on {os.cpu_count()} CPUs", flush=True)
    gen_best = {(lay, b): 0.0 for lay in ("vllm", "omnigraph") for b in BATCHES}
    loads: dict[str, list[float]] = {"vllm": [], "omnigraph": []}
    for r in range(rounds):
        for layout in ("vllm", "omnigraph"):
            use(layout, gen, weights)
            packed = 0.0
            for _ in range(repeats):                      # the same weights again: the steady-state load
                gen.load_weights(weights)
                loads[layout].append(ctx.metrics["engine_load_s"])
                packed = ctx.metrics["weights_packed_layers"]
            if (layout == "omnigraph") != (packed > 0):
                sys.exit(f"bench/vllm_layout.py: the {layout} layout did not take ({packed:.0f} layers packed)")
            for b, (p, n) in BATCHES.items():
                t = tok_s(gen, prompts[:p], n, args.max_new_tokens, repeats)
                gen_best[(layout, b)] = max(gen_best[(layout, b)], t)
                print(f"  round {r + 1}  {layout:<9} {b:>3} sequences  {t:8.1f} tok/s   load "
                      f"{statistics.median(loads[layout][-repeats:]) * 1e3:6.1f} ms ({packed:.0f} layers packed)",
                      flush=True)
    out = {}
    for layout in ("vllm", "omnigraph"):
        out[layout] = {f"tok_s_{b}": round(gen_best[(layout, b)], 1) for b in BATCHES}
        out[layout]["engine_load_s"] = round(statistics.median(loads[layout]), 4)
    for b in BATCHES:
        out[f"gen_ratio_{b}"] = round(gen_best[("omnigraph", b)] / gen_best[("vllm", b)], 3)
    out["load_ratio"] = round(out["vllm"]["engine_load_s"] / out["omnigraph"]["engine_load_s"], 2)
    print(f"{'layout':<10} " + " ".join(f"{b + ' seq tok/s':>14}" for b in BATCHES) + f" {'load ms':>8}")
    for layout in ("vllm", "omnigraph"):
        print(f"{layout:<10} " + " ".join(f"{out[layout]['tok_s_' + b]:14.1f}" for b in BATCHES) +
              f" {out[layout]['engine_load_s'] * 1e3:8.1f}")
    record.emit("vllm_layout", {**out, "model": "smollm2-135m", "dtype": "bfloat16", "rounds": rounds,
                                "max_new_tokens": args.max_new_tokens, "load_avg": round(load, 2)}, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
