"""Data-parallel update: one trainer GPU vs two training as one (omnigraph.transports.collectives), side by side.

omnigraph's ``update`` node (PPO-clip, bf16 autocast, fp32 AdamW) on a
Qwen2.5-architecture model with random weights (``--model``, default 1.5b),
one batch of GRPO samples generated once by the real ``generate`` node and
then trained on ``--reps`` times: first by one process on GPU 0 (the whole
batch), then by two processes on GPUs 0 and 1 (half each, gradients summed
over NCCL). Seconds per update (median), tokens per second and the speed-up;
the two ranks' weights are checked identical after the run.

    python bench/dataparallel.py [--quick] [--model 0.5b|1.5b|3b] [--prompts 32] [--new-tokens 128]
    python bench/dataparallel.py --smoke     # the same code on the CPU (gloo, the tiny model)

Human-readable lines, then one JSON line (last).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")        # NVLink multicast stays off on shared hosts
GRAPH = ROOT / "graphs" / "gpu" / "grpo_one_step_off_2gpu.yaml"


def _worker(rank: int, world: int, port: int, args: dict, q) -> None:
    try:
        q.put((rank, _train(rank, world, port, args)))
    except BaseException as e:  # noqa: BLE001 - reported by the parent
        q.put((rank, {"error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()[-3000:]}))


def _train(rank: int, world: int, port: int, a: dict) -> dict:
    import torch
    import omnigraph as og
    from omnigraph.sdk import Weights
    from omnigraph.testing import build_node, prompts
    from omnigraph.transports import collectives, groups
    cuda = not a["smoke"]
    if cuda:
        torch.cuda.set_device(rank)
    over = [f"model.path={a['path']}", f"task.prompts={a['prompts']}", f"nodes.generate.max_new_tokens={a['new_tokens']}",
            f"pools.trainer.actors={world}", "nodes.update.micro_batch_size=16", "nodes.update.lr=1e-6"]
    if not cuda:
        over += ["pools.trainer.gpus=0", "pools.rollout.gpus=0", "model.dtype=float32"]
    spec = og.load(GRAPH, over)
    group = groups.join("dp-trainer", "127.0.0.1", port, rank, world, 600.0, backend="nccl" if cuda else "gloo") \
        if world > 1 else None
    gen, _ = build_node(spec, "generate")
    batch = build_node(spec, "reward")[0].score(0, gen.generate(0, prompts(spec, 0), Weights(0)))
    del gen
    if cuda:
        torch.cuda.empty_cache()
    mine = batch.shard(rank, world)
    upd, ctx = build_node(spec, "update", actor=f"trainer.{rank}")
    ctx.collectives = collectives.PoolCollectives(group) if group is not None else None
    times = []
    for i in range(a["reps"] + 1):                       # the first one warms up (kernels, allocator)
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        upd.train(i + 1, mine)
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    tokens = int(batch.fields["attention_mask"].sum())
    digest = float(sum(p.detach().double().sum() for p in upd.policy.model.parameters()))
    return {"update_s": statistics.median(times[1:]), "tokens": tokens, "samples": len(batch), "digest": digest,
            "params_m": round(sum(p.numel() for p in upd.policy.model.parameters()) / 1e6, 1)}


def measure(world: int, args: dict) -> list[dict]:
    import multiprocessing as mp
    import torch.distributed as dist
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(r, world, store.port, args, q)) for r in range(world)]
    for p in procs:
        p.start()
    out: dict[int, dict] = {}
    try:
        for _ in procs:
            rank, res = q.get(timeout=900)
            if "error" in res:
                raise RuntimeError(f"rank {rank} of {world}: {res['error']}\n{res['trace']}")
            out[rank] = res
    finally:
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
    return [out[r] for r in range(world)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="3 timed updates (default 5)")
    ap.add_argument("--smoke", action="store_true", help="on the CPU with gloo and the tiny model (checks the code)")
    ap.add_argument("--model", default="1.5b")
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=128)
    import record
    record.add_arguments(ap)
    args = ap.parse_args()
    import torch
    if not args.smoke and torch.cuda.device_count() < 2:
        print(f"bench/dataparallel.py needs two CUDA GPUs (this machine has {torch.cuda.device_count()}); "
              "--smoke runs the same code on the CPU", file=sys.stderr)
        return 2
    if args.smoke:
        from nodes import zoo
        path, args.prompts, args.new_tokens = str(zoo.tiny(0)), 8, 16
    else:
        from gpu_multi import model_folder
        path = str(model_folder(args.model))
    a = {"path": path, "prompts": args.prompts, "new_tokens": args.new_tokens, "reps": 3 if args.quick or args.smoke else 5,
         "smoke": args.smoke}
    name = "tiny" if args.smoke else f"Qwen2.5-{args.model}"
    print(f"data-parallel update: {name} (random weights), {args.prompts} prompts x 8 samples x {args.new_tokens} "
          f"new tokens, median of {a['reps']} updates, {'gloo on the CPU' if args.smoke else 'NCCL'}", flush=True)
    (one,) = measure(1, a)
    print(f"  1 trainer : {one['update_s']:.3f} s per update ({one['tokens'] / one['update_s']:,.0f} tokens/s)", flush=True)
    two = measure(2, a)
    t2 = max(r["update_s"] for r in two)
    same = two[0]["digest"] == two[1]["digest"]
    print(f"  2 trainers: {t2:.3f} s per update ({two[0]['tokens'] / t2:,.0f} tokens/s): x{one['update_s'] / t2:.2f}; "
          f"ranks identical: {same}", flush=True)
    record.emit("dataparallel", {"model": name, "params_m": one["params_m"], "samples": one["samples"], "tokens": one["tokens"],
                      "update_s_1": round(one["update_s"], 4), "update_s_2": round(t2, 4),
                      "speedup": round(one["update_s"] / t2, 3), "ranks_identical": same}, args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
