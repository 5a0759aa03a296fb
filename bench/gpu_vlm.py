"""An image-text policy on the card: Qwen2.5-VL-3B's shape (random bf16 weights) through the real nodes.

On one CUDA GPU, in one process, with the GPU graph's nodes (``graphs/gpu/grpo_one_step_off.yaml``: the rollout
in bf16, the trainer's fp32 master weights under bf16 autocast) and the ``shapes`` task's pictures at
``--side`` pixels (448: a 32 x 32 grid of 14-pixel patches, 256 image tokens a picture):

- ``encoder_images_per_s``: the vision tower alone on ``--images`` pictures at once (CUDA events, median of
  ``--reps`` after a warm-up);
- ``gen_tokens_per_s``: the ``hf`` rollout's completion tokens per second over a firing (``task.prompts``
  prompts x 8 samples, ``--new`` new tokens; a random model rarely stops early), with ``encoder_share`` and
  ``prefill_share`` of that firing (the tower, and the prompts' forward to the first new token);
- ``update_tokens_per_s``: the trainer's step (old log-probs fused, one optimizer step) over the same batch's
  tokens, pictures and all, and its ``update_encoder_share``.

    python bench/gpu_vlm.py [--shape 3b|tiny] [--side 448] [--prompts 8] [--new 64] [--reps 3] [--freeze] [--no-save]

``--freeze``: ``model.freeze: [vision]``, the usual recipe (the update then reuses the tower's output kept by
``old_logprob``: :mod:`nodes.models.picture_cache`); run it as a command of its own beside one without.

``--shape tiny`` (the tests' model) checks the script itself, also on a CPU (``--device cpu``); its numbers
measure nothing. Prints the record's JSON last (``bench/record.py``; on the GPU machine set
``OMNIGRAPH_BENCH_RESULTS=$OUT/results`` and ``OMNIGRAPH_GIT_REV``).
"""

from __future__ import annotations

import argparse
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
from omnigraph.sdk import Weights  # noqa: E402
from omnigraph.sdk.adapters.transformers import has_rope_index  # noqa: E402
from omnigraph.testing import build_node, prompts  # noqa: E402

from nodes.models import vision  # noqa: E402
from nodes.tasks.shapes import draw  # noqa: E402
from nodes.zoo import grid_vl  # noqa: E402

GPU_GRAPH = ROOT / "graphs" / "gpu" / "grpo_one_step_off.yaml"
SHAPES = {"3b": (grid_vl.QWEN25_VL_3B_TEXT, grid_vl.QWEN25_VL_3B_VISION),
          "tiny": (grid_vl.TINY_TEXT, grid_vl.TINY_VISION)}


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def timed(fn, reps: int, device: str) -> float:
    """Median seconds of ``fn()`` after one warm-up."""
    fn()
    out = []
    for _ in range(reps):
        sync(device)
        t0 = time.perf_counter()
        fn()
        sync(device)
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def spec_for(path: Path, args):
    overrides = [f"model.path={path}", "nodes.generate.eval_every=0", "checkpoint.every=null", "runtime.seed=0",
                 f"task={{name: shapes, prompts: {args.prompts}, samples_per_prompt: 8, options: {{size: {args.side}}}}}",
                 "nodes.reward.fn=nodes.rewards.rules:exact_match", f"nodes.generate.max_new_tokens={args.new}",
                 "nodes.update.micro_batch_size=8", "nodes.old_logprob.micro_batch_size=8"]
    if args.device == "cpu":
        overrides += ["model.dtype=float32", "pools.rollout.gpus=0", "pools.trainer.gpus=0"]
    if args.freeze:
        overrides += ["model.freeze=[vision]"]
    return og.load(GPU_GRAPH, overrides)


def encoder_rate(model, proc, args) -> dict:
    """The tower alone: ``--images`` pictures at once, pictures per second."""
    import random

    rng = random.Random(0)
    pics = [draw(["red", "blue"], rng.sample(range(16), 2), size=args.side) for _ in range(args.images)]
    inputs = vision.model_inputs(vision.pixel_inputs(proc, pics), args.device)
    tower = vision.tower(model)
    dtype = next(tower.parameters()).dtype
    px, grid = inputs["pixel_values"].to(dtype), inputs[vision.GRID]
    with torch.no_grad():
        s = timed(lambda: tower(px, grid_thw=grid), args.reps, args.device)
    return {"encoder_images_per_s": round(args.images / s, 1),
            "image_tokens_per_picture": int(grid[0].prod()) // proc.image_processor.merge_size ** 2}


def measure(path: Path, args) -> dict:
    spec = spec_for(path, args)
    shared: dict = {}
    gen, roll = build_node(spec, "generate")
    rew, _ = build_node(spec, "reward")
    olp, _ = build_node(spec, "old_logprob", shared=shared)
    upd, ctx = build_node(spec, "update", shared=shared)
    out = {"params_b": round(sum(p.numel() for p in upd.policy.model.parameters()) / 1e9, 3)}
    out.update(encoder_rate(gen.model, gen.processor, args))
    gen.generate(0, prompts(spec, 0), Weights(0))                # warm-up
    rates, enc, pre = [], [], []
    for step in range(1, args.reps + 1):
        batch = gen.generate(step, prompts(spec, step), Weights(0))
        rates.append(roll.metrics["gen_tokens_per_s"])
        enc.append(roll.metrics["encoder_share"])
        pre.append(roll.metrics.get("prefill_share") or float("nan"))
    out.update({"gen_tokens_per_s": round(statistics.median(rates)), "encoder_share": round(statistics.median(enc), 4),
                "prefill_share": round(statistics.median(pre), 4), "rows": len(batch),
                "prompt_tokens": batch.meta["prompt_len"]})
    batch = rew.score(0, batch)
    steps = iter(range(1, 100))
    s = timed(lambda: upd.train(next(steps), olp.logprobs(0, batch.with_fields())), args.reps, args.device)
    P = batch.meta["prompt_len"]
    c = int(batch.fields["response_mask"].sum(1).max())
    out.update({"update_tokens_per_s": round(len(batch) * (P + c) / s), "update_s": round(s, 3),
                "update_encoder_share": ctx.metrics.get("update_encoder_share")})
    if args.device == "cuda":
        out["peak_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    assert has_rope_index(gen.model), "the model is not placed by 3-D positions"
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="3b", choices=sorted(SHAPES))
    ap.add_argument("--side", type=int, default=448, help="the pictures' side in pixels")
    ap.add_argument("--images", type=int, default=32, help="pictures in the tower-alone measurement")
    ap.add_argument("--prompts", type=int, default=8, help="prompts a firing (8 samples each)")
    ap.add_argument("--new", type=int, default=64, help="new tokens a sample")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--freeze", action="store_true", help="model.freeze: [vision] (the tower's output kept)")
    record.add_arguments(ap)
    args = ap.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        print("bench/gpu_vlm.py needs a CUDA GPU (--shape tiny --device cpu checks the script)", file=sys.stderr)
        return 1
    text, tower = SHAPES[args.shape]
    dtype = torch.bfloat16 if args.device == "cuda" else None
    result = {"card": torch.cuda.get_device_name() if args.device == "cuda" else "cpu", "shape": args.shape,
              "side": args.side, "freeze_vision": args.freeze}
    with tempfile.TemporaryDirectory(prefix="gpu-vlm-") as tmp:
        path = grid_vl.build(Path(tmp) / f"qwen2.5-vl-{args.shape}", text, tower, device=args.device, dtype=dtype,
                             max_pixels=max(args.side, 56) ** 2)
        result.update(measure(path, args))
    record.emit("gpu_vlm", result, args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
