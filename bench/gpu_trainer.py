"""The trainer against the card: omnigraph's update beside plain transformers on the same tokens, per shape.

For each shape (``--shapes``: Qwen2.5 configs with random weights, built on the card), in one process, in bf16:

- ``card_tflops``: the card's dense bf16 rate, an 8192^3 matrix product (median of 10, after a warm-up);
- ``plain``: transformers' forward + backward + fused AdamW, pure bf16 weights, ``sdpa``, ``--rows`` x ``--tokens``
  random tokens, loss over every token: the reference;
- ``omnigraph``: the real update node (``omnigraph.testing.build_node``, the GPU graph's trainer: fp32 master
  weights, bf16 autocast) on a batch of the same rows and lengths (a ``--prompt``-token prompt, the rest the
  completion), one optimizer step, old log-probs fused, for each option set in ``--variants`` (``base``;
  ``chunk``: ``logprob_chunk 2048``; ``ckpt``: that and activation checkpointing);

each the median of ``--reps`` timed steps after one warm-up, with the peak memory allocated
(``torch.cuda.max_memory_allocated``, reset before each). ``mfu`` = 6 x parameters x tokens/s over
``card_tflops``; ``update_vs_plain`` = omnigraph's tokens/s over plain's. A variant that runs out of memory is
reported as such (``oom``), and the next runs.

    python bench/gpu_trainer.py [--shapes 0.5b,1.5b] [--rows 8] [--tokens 1024] [--reps 3] [--no-save]

Prints one JSON line per shape as it ends, then the record's (``bench/record.py``; on the GPU machine set
``OMNIGRAPH_BENCH_RESULTS=$OUT/results`` and ``OMNIGRAPH_GIT_REV``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import torch  # noqa: E402

import omnigraph as og  # noqa: E402
import record  # noqa: E402
from omnigraph.sdk import SampleBatch  # noqa: E402
from omnigraph.testing import build_node  # noqa: E402

GPU_GRAPH = ROOT / "graphs" / "gpu" / "grpo_one_step_off.yaml"
QWEN = dict(vocab_size=151936, max_position_embeddings=32768, rope_theta=1e6)
SHAPES = {
    "0.5b": dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                 intermediate_size=4864, tie_word_embeddings=True, **QWEN),
    "1.5b": dict(hidden_size=1536, num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
                 intermediate_size=8960, tie_word_embeddings=True, **QWEN),
    "3b": dict(hidden_size=2048, num_hidden_layers=36, num_attention_heads=16, num_key_value_heads=2,
               intermediate_size=11008, tie_word_embeddings=True, **QWEN),
    "7b": dict(hidden_size=3584, num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4,
               intermediate_size=18944, tie_word_embeddings=False, **QWEN),
}
VARIANTS = {"base": {}, "chunk": {"logprob_chunk": 2048},
            "ckpt": {"logprob_chunk": 2048, "activation_checkpointing": True}}


def card_tflops(reps: int = 10) -> float:
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    a @ a
    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        a @ a
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return 2 * 8192 ** 3 / statistics.median(times) / 1e12


def build(shape: str, folder: Path) -> Path:
    """A model folder of ``shape`` with random weights and a tokenizer of its vocabulary."""
    from gpu import random_model
    return random_model("qwen2", SHAPES[shape], folder / shape)


def timed(step, reps: int) -> tuple[float, float]:
    """Median seconds of ``step()`` over ``reps`` after a warm-up, and the peak GiB allocated."""
    step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), torch.cuda.max_memory_allocated() / 2 ** 30


def plain(path: Path, rows: int, tokens: int, reps: int) -> dict:
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16, attn_implementation="sdpa").cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6, fused=True)
    ids = torch.randint(10, model.config.vocab_size, (rows, tokens), device="cuda")

    def step():
        opt.zero_grad(set_to_none=True)
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()

    s, peak = timed(step, reps)
    return {"s": s, "peak_gib": peak, "params": sum(p.numel() for p in model.parameters())}


def batch_of(rows: int, tokens: int, prompt: int, vocab: int) -> SampleBatch:
    torch.manual_seed(1)
    ids = torch.randint(10, vocab, (rows, tokens))
    mask = torch.ones(rows, tokens, dtype=torch.long)
    comp = torch.ones(rows, tokens - prompt)
    fields = {"input_ids": ids, "attention_mask": mask, "response_mask": comp,
              "logprob": -torch.rand(rows, tokens - prompt) * 3, "advantage": torch.randn(rows).tolist()}
    return SampleBatch(0, list(range(rows)), [0] * rows, [0] * rows, fields,
                       {"prompt_len": prompt, "temperature": 1.0, "old_logprob": "fused"})


def ours(path: Path, batch: SampleBatch, options: dict, reps: int) -> dict:
    opts = json.dumps(options).replace('"', "")
    spec = og.load(GPU_GRAPH, [f"model.path={path}", f"nodes.update.micro_batch_size={len(batch)}",
                               f"nodes.update.options={opts}", "nodes.update.lr=1e-6"])
    upd, ctx = build_node(spec, "update", shared={})
    i = iter(range(1, 10 ** 6))
    s, peak = timed(lambda: upd.train(next(i), batch), reps)
    return {"s": s, "peak_gib": peak, "mfu_logged": ctx.metrics.get("mfu")}


def measure(shape: str, folder: Path, args, tflops: float) -> dict:
    path = build(shape, folder)
    tokens = args.rows * args.tokens
    out: dict = {"shape": shape, "rows": args.rows, "tokens_per_row": args.tokens, "prompt_tokens": args.prompt}
    try:
        ref = plain(path, args.rows, args.tokens, args.reps)
        torch.cuda.empty_cache()                    # the model and optimizer of the reference are gone
        out.update(params_b=round(ref["params"] / 1e9, 3), plain_tokens_per_s=round(tokens / ref["s"]),
                   plain_peak_gib=round(ref["peak_gib"], 2),
                   plain_mfu=round(6 * ref["params"] * tokens / ref["s"] / (tflops * 1e12), 3))
    except torch.OutOfMemoryError:
        out["plain"] = "oom"
        torch.cuda.empty_cache()
    batch = batch_of(args.rows, args.tokens, args.prompt, SHAPES[shape]["vocab_size"])
    for name in args.variants.split(","):
        try:
            r = ours(path, batch, VARIANTS[name], args.reps)
            torch.cuda.empty_cache()
        except torch.OutOfMemoryError:
            out[f"{name}"] = "oom"
            torch.cuda.empty_cache()
            continue
        tps = tokens / r["s"]
        params = out.get("params_b", 0) * 1e9
        out.update({f"{name}_tokens_per_s": round(tps), f"{name}_peak_gib": round(r["peak_gib"], 2),
                    f"{name}_mfu": round(6 * params * tps / (tflops * 1e12), 3) if params else None,
                    f"{name}_vs_plain": round(tps / out["plain_tokens_per_s"], 3) if "plain_tokens_per_s" in out
                    else None})
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="0.5b,1.5b", help=f"comma-separated, of {', '.join(SHAPES)}")
    ap.add_argument("--variants", default="base,chunk,ckpt", help=f"comma-separated, of {', '.join(VARIANTS)}")
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=1024, help="tokens per row, prompt and completion")
    ap.add_argument("--prompt", type=int, default=256, help="prompt tokens per row")
    ap.add_argument("--reps", type=int, default=3)
    record.add_arguments(ap)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("bench/gpu_trainer.py needs a CUDA GPU", file=sys.stderr)
        return 1
    tflops = card_tflops()
    result: dict = {"card": torch.cuda.get_device_name(), "card_tflops": round(tflops, 1), "shapes": {}}
    with tempfile.TemporaryDirectory(prefix="gpu-trainer-") as tmp:
        for shape in args.shapes.split(","):
            r = measure(shape, Path(tmp), args, tflops)
            print(json.dumps(r), flush=True)
            result["shapes"][shape] = r
    for shape, r in result["shapes"].items():
        for k in ("base_vs_plain", "chunk_vs_plain", "ckpt_vs_plain", "base_mfu", "chunk_mfu"):
            if r.get(k) is not None:
                result[f"{k}_{shape}"] = r[k]
    record.emit("gpu_trainer", result, args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
