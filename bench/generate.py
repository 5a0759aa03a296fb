"""Rollout throughput: the ``vllm`` generate backend against the ``hf`` one, same model, prompts, sampling.

Both backends run as omnigraph runs them (``nodes.rollout.hf.Generate`` and
``nodes.rollout.vllm_engine.VllmGenerate``): the same prompt token ids, ``n``
samples per prompt, temperature, top-p and ``max_new_tokens``, per-token
logprobs returned. Each measurement is its own process (vLLM binds the
threads of the process it lives in), the backends alternate, and each
figure is the best of ``--repeats`` timed batches after one warm-up batch.
Tokens/s counts generated tokens (up to and including the stop token).

Models: the embedded ``tiny`` (0.4M parameters: no gain is expected, its
per-token cost is all overhead) and ``smollm2-135m`` (the ratio reported).

    python bench/generate.py [--quick] [--prompts 32] [--samples 4] [--max-new-tokens 64]

Needs the ``vllm`` extra. Last line: JSON with ``hf_tok_s``, ``vllm_tok_s``,
``ratio`` (SmolLM2-135M) and the tiny model's figures.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

MODELS = {"tiny": ("tiny", "digits", "float32"), "smollm2": ("smollm2-135m", "arithmetic", "auto")}
"""SmolLM2 in ``auto``: bf16 where the machine runs it natively, else float32 (``omnigraph.planning.precision``)."""


def measure(backend: str, model: str, prompts: int, samples: int, new_tokens: int, repeats: int) -> dict:
    """Runs in a child process: build the node, one warm-up batch, ``repeats`` timed batches."""
    import omnigraph as og
    from omnigraph.testing import build_node, prompts as step_prompts

    path, task, dtype = MODELS[model]
    spec = og.load(ROOT / "graphs" / "grpo_sync.yaml", [
        f"model.path={path}", f"model.dtype={dtype}", f"task.name={task}", f"task.prompts={prompts}",
        f"task.samples_per_prompt={samples}", f"nodes.generate.backend={backend}",
        f"nodes.generate.max_new_tokens={new_tokens}", "nodes.generate.temperature=1.0"])
    t0 = time.perf_counter()
    node, ctx = build_node(spec, "generate")
    start_s = time.perf_counter() - t0
    ids = [node.encode(p) for p in step_prompts(spec, 0)]
    best, tokens = 0.0, []
    for i in range(repeats + 1):
        t = time.perf_counter()
        out = node.sample(ids, samples, greedy=False, seed=1000 + i)
        dt = time.perf_counter() - t
        n = float(out["response_mask"].sum())
        if i:                                         # the first batch warms up
            best = max(best, n / dt)
            tokens.append(n)
    return {"backend": backend, "model": model, "tok_s": best, "start_s": start_s, "dtype": ctx.model.dtype,
            "tokens_per_batch": sum(tokens) / len(tokens)}


def child(args: list[str]) -> dict:
    """One measurement in a fresh interpreter; its last stdout line is the JSON result."""
    env = dict(os.environ, TQDM_DISABLE="1", TRANSFORMERS_VERBOSITY="error", VLLM_LOGGING_LEVEL="ERROR")
    done = subprocess.run([sys.executable, __file__, "--child", *args], capture_output=True, text=True, env=env,
                          cwd=ROOT)
    if done.returncode != 0:
        sys.exit(f"bench/generate.py: the {args[0]} measurement failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="1 round of 2 timed batches (default 2 rounds of 3)")
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--models", default="tiny,smollm2")
    ap.add_argument("--child", nargs=6, help=argparse.SUPPRESS)
    import record
    record.add_arguments(ap)
    args = ap.parse_args()
    if args.child:
        backend, model, prompts, samples, new, repeats = args.child
        print(json.dumps(measure(backend, model, int(prompts), int(samples), int(new), int(repeats))), flush=True)
        return 0
    try:
        import vllm  # noqa: F401
    except Exception as e:
        sys.exit(f"bench/generate.py needs the vllm extra ({type(e).__name__}: {e}): pip install -e '.[vllm]'")
    rounds, repeats = (1, 2) if args.quick else (2, 3)
    models = args.models.split(",")
    load = os.getloadavg()[0]
    print(f"generate benchmark: {args.prompts} prompts x {args.samples} samples x {args.max_new_tokens} new "
          f"tokens, temperature 1, logprobs on; best of {repeats} batches, {rounds} alternating rounds; "
          f"load average {load:.2f} on {os.cpu_count()} CPUs", flush=True)
    best: dict = {}
    for r in range(rounds):
        for model in models:
            for backend in ("hf", "vllm"):
                res = child([backend, model, str(args.prompts), str(args.samples), str(args.max_new_tokens),
                             str(repeats)])
                key = (model, backend)
                if key not in best or res["tok_s"] > best[key]["tok_s"]:
                    best[key] = res
                print(f"  round {r + 1}  {model:<8} {backend:<5} {res['dtype']:<8} {res['tok_s']:8.1f} tok/s  "
                      f"({res['tokens_per_batch']:.0f} tokens a batch, start {res['start_s']:.1f} s)", flush=True)
    print(f"{'model':<9} {'hf tok/s':>9} {'vllm tok/s':>11} {'ratio':>6}")
    out = {}
    for model in models:
        hf, vl = best[(model, "hf")]["tok_s"], best[(model, "vllm")]["tok_s"]
        print(f"{model:<9} {hf:9.1f} {vl:11.1f} {vl / hf:6.2f}")
        out[model] = {"hf_tok_s": round(hf, 1), "vllm_tok_s": round(vl, 1), "ratio": round(vl / hf, 3),
                      "vllm_start_s": round(best[(model, "vllm")]["start_s"], 1),
                      "dtype": best[(model, "vllm")]["dtype"]}
    main_model = "smollm2" if "smollm2" in out else models[0]
    record.emit("generate", {**out[main_model], "model": MODELS[main_model][0],
                      **{f"{m}_{k}": v for m in out if m != main_model for k, v in out[m].items()},
                      "prompts": args.prompts, "samples": args.samples, "max_new_tokens": args.max_new_tokens,
                      "load_avg": round(load, 2)}, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
