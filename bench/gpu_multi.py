"""Two-GPU benchmark: weight sync over NCCL, and sync vs one-step-off with trainer and rollout apart.

1. Weight sync through omnigraph's NCCL path (:mod:`omnigraph.transports.nccl`, what
   ``sync`` and the rollout's ``apply`` run) for Qwen2.5-architecture models of
   0.5B, 1.5B and 3B parameters (random weights from their configs, vocabulary
   151936, tied embeddings): two processes, one per GPU; the sender holds fp32
   master weights (as omnigraph's mixed-precision trainer does) and sends bf16
   in buckets of ``--bucket-mb``; the receiver takes them straight into its bf16
   model. Latency = from the sender starting the export until the receiver has
   every byte in place (it acknowledges through the TCP store, ~0.1 ms). Against,
   in the same processes: a plain NCCL broadcast of the same bytes as one
   buffer. Bus bandwidth of a broadcast = bytes / time (nccl-tests' busbw
   factor for broadcast is 1). verl's published figure (its one-step-off recipe:
   weight sync of Qwen2.5-3B under 300 ms, on A100s) is quoted under ``context`` in
   the JSON, for orientation only: it was not measured here, on other hardware,
   and no ratio is computed against it.
2. ``omnigraph run`` of GRPO in sync and one-step-off mode, trainer and rollout on
   separate GPUs (1 + 1: weights over NCCL) and sharing one (0.5 + 0.5: weights by
   CUDA IPC), on a model big enough that generation and training take about a
   second or more each; seconds per step. Every row records the executor it ran on; a
   failing executor stops the benchmark unless ``--fallback-executor`` names another, and
   then the row says so (``executor``, ``executor_requested``, ``fallback_reason``) and a
   layout's speed-up is computed only when both of its modes ran on the same executor.

    python bench/gpu_multi.py [--quick] [--skip-runtime] [--models 0.5b,1.5b,3b] [--bucket-mb 256] [--no-save]
    python bench/gpu_multi.py --smoke      # the same code on the CPU (gloo, tiny shapes): no GPU needed

On two H200s part 1 takes ~80 s and part 2 ~65 s per run (four runs; most of it starting Ray and the
actors): ~6 minutes in all (``--skip-sync`` / ``--skip-runtime`` / ``--layouts 1+1`` split it).

Human-readable lines, then one JSON line (last), also saved under ``bench/results/`` (``bench/record.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
# NVLink multicast off: on hosts whose GPUs are shared or partitioned, NCCL's multicast set-up can hang
os.environ["NCCL_NVLS_ENABLE"] = "0"

CONTEXT = {"verl_3b_ms": {
    "value": 300.0, "bound": "upper",
    "what": "verl one-step-off weight sync of Qwen2.5-3B, under 300 ms",
    "hardware": "A100s", "source": "verl's published figure, not measured here: no ratio is taken against it"}}
"""Published figures of other systems: quoted for orientation, never divided into a measured one."""
QWEN = dict(vocab_size=151936, max_position_embeddings=32768, rope_theta=1e6, tie_word_embeddings=True)
SHAPES = {
    "0.5b": dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                 intermediate_size=4864, **QWEN),
    "1.5b": dict(hidden_size=1536, num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
                 intermediate_size=8960, **QWEN),
    "3b": dict(hidden_size=2048, num_hidden_layers=36, num_attention_heads=16, num_key_value_heads=2,
               intermediate_size=11008, **QWEN),
    "smoke": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  intermediate_size=128, vocab_size=1000, tie_word_embeddings=True),
}


def qwen_config(name: str):
    from transformers import AutoConfig
    return AutoConfig.for_model("qwen2", **SHAPES[name])


# ---------------------------------------------------------------- 1. weight sync, one process per GPU

def _worker(rank: int, port: int, name: str, bucket_mb: float, reps: int, backend: str, q) -> None:
    try:
        q.put((rank, _sync_bench(rank, port, name, bucket_mb, reps, backend)))
    except BaseException as e:  # noqa: BLE001 - reported by the parent
        q.put((rank, {"error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()[-3000:]}))


def _sync_bench(rank: int, port: int, name: str, bucket_mb: float, reps: int, backend: str) -> dict:
    import torch
    from transformers import AutoModelForCausalLM
    from omnigraph.transports import groups, nccl
    cuda = backend == "nccl"
    if cuda:
        torch.cuda.set_device(rank)
    dev = torch.device("cuda", rank) if cuda else torch.device("cpu")
    torch.manual_seed(0)
    with dev:      # the trainer: fp32 master weights; the rollout: bf16
        model = AutoModelForCausalLM.from_config(qwen_config(name),
                                                 dtype=torch.float32 if rank == 0 else torch.bfloat16)
    state = model.state_dict()
    params = sum(p.numel() for p in model.parameters())
    g = groups.join(f"bench-{name}", "127.0.0.1", port, rank, 2, backend=backend)
    if rank == 0:
        meta = nccl.describe(state, g.name, dtype=torch.bfloat16, bucket_bytes=int(bucket_mb * (1 << 20)))
        g.store.set(f"meta-{name}", pickle.dumps(meta))
    else:
        meta = pickle.loads(g.store.get(f"meta-{name}"))
    plain = torch.zeros(meta.nbytes, dtype=torch.uint8, device=dev)

    def barrier():
        g.broadcast(torch.zeros(1, device=dev)).wait()
        if cuda:
            torch.cuda.synchronize()

    og, enq, nc, peaks = [], [], [], []
    for i in range(reps + 1):                   # the first round warms up
        barrier()
        if rank == 0:
            if cuda:
                torch.cuda.reset_peak_memory_stats()
                base = torch.cuda.memory_allocated()
            t0 = time.perf_counter()
            nccl.send(meta, state, g)
            t1 = time.perf_counter()
            g.store.wait([f"og-{name}-{i}"])
            og.append(time.perf_counter() - t0)
            enq.append(t1 - t0)
            if cuda:
                torch.cuda.synchronize()
                peaks.append(torch.cuda.max_memory_allocated() - base)
        else:
            nccl.receive(meta, g, state)
            g.store.set(f"og-{name}-{i}", "1")
        barrier()
        if rank == 0:
            t0 = time.perf_counter()
            g.broadcast(plain)
            g.store.wait([f"nc-{name}-{i}"])
            nc.append(time.perf_counter() - t0)
        else:
            g.broadcast(plain).wait()
            if cuda:
                torch.cuda.synchronize()
            g.store.set(f"nc-{name}-{i}", "1")
    barrier()
    # the receiver's model must now hold exactly the sender's weights cast to bf16
    sums = [float(state[e.name].to(torch.bfloat16).double().sum()) for e in meta.entries]
    if rank == 0:
        g.store.set(f"sums-{name}", json.dumps(sums))
        med = lambda xs: statistics.median(xs[1:] if len(xs) > 1 else xs)  # noqa: E731
        return {"model": name, "params_m": round(params / 1e6, 1), "bytes": meta.nbytes, "tensors": len(meta),
                "buckets": len(meta.buckets), "bucket_mb": bucket_mb, "reps": reps,
                "omnigraph_ms": round(med(og) * 1e3, 2), "omnigraph_min_ms": round(min(og[1:] or og) * 1e3, 2),
                "sender_enqueue_ms": round(med(enq) * 1e3, 2), "nccl_broadcast_ms": round(med(nc) * 1e3, 2),
                "omnigraph_busbw_gb_s": round(meta.nbytes / med(og) / 1e9, 1),
                "nccl_busbw_gb_s": round(meta.nbytes / med(nc) / 1e9, 1),
                "omnigraph_vs_nccl": round(med(og) / med(nc), 2),
                "sender_extra_mb": round(max(peaks) / 2**20, 1) if peaks else None,
                "two_buckets_mb": round(2 * meta.bucket_bytes / 2**20, 1)}
    want = json.loads(g.store.get(f"sums-{name}"))
    return {"exact": want == sums}


def weight_sync(name: str, bucket_mb: float, reps: int, backend: str) -> dict:
    import multiprocessing as mp
    import torch.distributed as dist
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(r, store.port, name, bucket_mb, reps, backend, q)) for r in (0, 1)]
    for p in procs:
        p.start()
    out = {}
    try:
        for _ in procs:
            rank, res = q.get(timeout=300)
            out[rank] = res
            if "error" in res:
                raise RuntimeError(f"rank {rank}: {res['error']}\n{res['trace']}")
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    return {**out[0], "exact": out[1]["exact"]}


# ---------------------------------------------------------------- 2. sync vs one-step-off, 1+1 and 0.5+0.5

def model_folder(name: str) -> Path:
    """A model folder (random bf16 weights of ``name``'s shape, a tokenizer) the real nodes load."""
    sys.path.insert(0, str(ROOT / "bench"))
    import gpu as one_gpu                       # bench/gpu.py: the tokenizer and the folder builder
    key = f"qwen2.5-{name}"
    one_gpu.SHAPES.setdefault(key, ("qwen2", dict(SHAPES[name])))
    folder = Path(os.environ.get("OMNIGRAPH_BENCH_MODELS", Path(tempfile.gettempdir()) / "og-bench-models"))
    return one_gpu.build(key, folder)[0]


SPLIT = ["pools.rollout={actors: 1, cpus: 1, gpus: 0}", "nodes.generate.pool=rollout", "nodes.reward.pool=rollout",
         "pools.trainer.cpus=1"]
"""graphs/grpo_sync.yaml on two pools (shipped as one: on CPUs, sync on two pools leaves one idle)."""


def runtime(model: str, iterations: int, args) -> dict:
    import omnigraph as og
    from omnigraph.executors import for_executor
    from omnigraph.records import steady
    from omnigraph.runtime import run
    path = model if args.smoke else model_folder(model)
    graphs = {"sync": ROOT / "graphs" / "grpo_sync.yaml",
              "one_step_off": ROOT / "graphs" / "gpu" / "grpo_one_step_off_2gpu.yaml"}
    layouts = {k: v for k, v in {"1+1": "1", "0.5+0.5": "0.5"}.items() if k in args.layouts.split(",")}
    layouts = layouts if not args.smoke else {"cpu": "0"}
    common = [f"model.path={path}", f"schedule.iterations={iterations}", f"task.prompts={args.prompts}",
              f"nodes.generate.max_new_tokens={args.new_tokens}", "nodes.generate.eval_every=0",
              "nodes.update.micro_batch_size=32", "nodes.old_logprob.micro_batch_size=32", "checkpoint.every=null",
              "model.dtype=auto" if not args.smoke else "model.dtype=float32", "runtime.seed=0"]
    out: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for layout, gpus in layouts.items():
            for mode, graph in graphs.items():
                split = SPLIT if mode == "sync" else []      # the shipped sync graph is one pool
                plan = og.compile(og.load(graph, common + split + [f"pools.rollout.gpus={gpus}",
                                                                    f"pools.trainer.gpus={gpus}"]))
                t0 = time.perf_counter()
                fallback = None
                try:
                    res, executor = run(plan, run_dir=tmp, executor=args.executor, progress=False), args.executor
                except Exception as e:
                    if not args.fallback_executor:
                        raise RuntimeError(f"{layout} {mode}: executor {args.executor} failed ({type(e).__name__}: "
                                           f"{e}); --fallback-executor ray-tasks runs such a row on the baseline "
                                           "executor instead (and says so in the JSON)") from e
                    fallback = f"{type(e).__name__}: {e}"[:500]
                    print(f"  {layout} {mode}: executor {args.executor} FAILED ({fallback}); this row runs on "
                          f"{args.fallback_executor} instead", flush=True)
                    executor = args.fallback_executor
                    res = run(plan, run_dir=tmp, executor=executor, progress=False)
                rows = steady(res.metrics, plan.fill)
                med = lambda key: round(statistics.median([r[key] for r in rows if key in r] or [float("nan")]), 4)  # noqa: E731
                ran = plan if executor == plan.executor else for_executor(plan, executor)   # as run() compiles it
                weights = ran.weights.get("sync", "-")
                out[f"{layout} {mode}"] = {
                    "layout": layout, "mode": mode, "executor": executor, "executor_requested": args.executor,
                    "fallback_reason": fallback, "weights": weights,
                    "s_per_step": res.summary["s_per_step"], "generate_s": med("timing_s/generate"),
                    "update_s": med("timing_s/update"), "update_weights_s": med("timing_s/update_weights"),
                    "gen_wait_s": med("timing_s/gen"), "staleness_max": res.summary["observed_max_staleness"],
                    "wall_s": round(time.perf_counter() - t0, 1)}
                m = out[f"{layout} {mode}"]
                print(f"  {layout:<8} {mode:<13} {m['s_per_step']:7.3f} s/step  generate {m['generate_s']:.3f} s  "
                      f"update {m['update_s']:.3f} s  weights ({weights}) {m['update_weights_s']:.3f} s  "
                      f"trainer waits {m['gen_wait_s']:.3f} s  staleness {m['staleness_max']}  [{executor}, "
                      f"{m['wall_s']:.0f} s]", flush=True)
    return out


# ---------------------------------------------------------------- main

def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer repetitions and iterations, a smaller runtime model")
    ap.add_argument("--smoke", action="store_true", help="on the CPU with gloo and tiny shapes (checks the code)")
    ap.add_argument("--skip-runtime", action="store_true")
    ap.add_argument("--skip-sync", action="store_true")
    ap.add_argument("--models", default="0.5b,1.5b,3b")
    ap.add_argument("--bucket-mb", type=float, default=256)
    ap.add_argument("--runtime-model", default=None, help="0.5b, 1.5b or 3b (default 1.5b; 0.5b with --quick)")
    ap.add_argument("--iterations", type=int, default=None)
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--executor", default="ray")
    ap.add_argument("--fallback-executor", default=None,
                    help="run a row on this executor (e.g. ray-tasks) when --executor fails on it, and say so in "
                         "the JSON (default: fail)")
    import record
    record.add_arguments(ap)
    ap.add_argument("--layouts", default="1+1,0.5+0.5", help="trainer + rollout GPUs: 1+1 and/or 0.5+0.5")
    args = ap.parse_args()
    import torch
    backend = "gloo" if args.smoke else "nccl"
    if not args.smoke and torch.cuda.device_count() < 2:
        print(f"bench/gpu_multi.py needs two CUDA GPUs (this machine has {torch.cuda.device_count()}); "
              "--smoke runs the same code on the CPU", file=sys.stderr)
        return 2
    if args.smoke:
        args.models, args.bucket_mb, args.prompts, args.new_tokens = "smoke", 0.01, 4, 8
        print(f"smoke run on the CPU (gloo), torch {torch.__version__}")
    else:
        d = torch.cuda.get_device_properties(0)
        print(f"two-GPU benchmark on {torch.cuda.device_count()} x {d.name} ({d.total_memory / 2**30:.0f} GiB), "
              f"torch {torch.__version__}, NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}, "
              f"NCCL_NVLS_ENABLE={os.environ.get('NCCL_NVLS_ENABLE')}")
    reps = 3 if args.quick or args.smoke else 10
    syncs = []
    if not args.skip_sync:
        print(f"\n1. weight sync, trainer GPU 0 (fp32 master) -> rollout GPU 1 (bf16), buckets of {args.bucket_mb:g} MB, "
              f"median of {reps}:")
        for name in args.models.split(","):
            r = weight_sync(name, args.bucket_mb, reps, backend)
            syncs.append(r)
            print(f"  Qwen2.5-{name:<5} {r['params_m']:>7.1f}M params, {r['bytes'] / 1e9:.2f} GB bf16 in {r['buckets']} "
                  f"buckets: omnigraph {r['omnigraph_ms']:.1f} ms ({r['omnigraph_busbw_gb_s']} GB/s bus bw; sender "
                  f"returns after {r['sender_enqueue_ms']:.1f} ms) | plain NCCL broadcast {r['nccl_broadcast_ms']:.1f} ms "
                  f"({r['nccl_busbw_gb_s']} GB/s) | x{r['omnigraph_vs_nccl']} | sender extra memory "
                  f"{r['sender_extra_mb']} MB (two buckets {r['two_buckets_mb']} MB) | exact {r['exact']}", flush=True)
        if any(r["model"] == "3b" for r in syncs):
            c = CONTEXT["verl_3b_ms"]
            print(f"  for context only (not measured here, other hardware): {c['what']} on {c['hardware']} "
                  f"(verl's published figure)")
    rt = {}
    if not args.skip_runtime:
        model = "smoke-model" if args.smoke else (args.runtime_model or ("0.5b" if args.quick else "1.5b"))
        if args.smoke:
            from nodes import zoo
            model = "tiny"
            zoo.tiny(0)
        n = args.iterations or (4 if args.quick or args.smoke else 5)
        print(f"\n2. omnigraph run, GRPO on {'Qwen2.5-' * (not args.smoke)}{model} (random weights), {args.prompts} prompts x 8 samples x "
              f"{args.new_tokens} new tokens, {n} iterations each, executor {args.executor}:")
        rt = runtime(model, n, args)
    summary = {"gpus": torch.cuda.device_count(), "weight_sync": syncs, "runtime": rt,
               "executor_requested": args.executor,
               "executors_used": sorted({m["executor"] for m in rt.values()}),
               "fallbacks": {k: m["fallback_reason"] for k, m in rt.items() if m["fallback_reason"]},
               "context": CONTEXT}
    for layout in ("1+1", "0.5+0.5", "cpu"):
        a, b = rt.get(f"{layout} sync"), rt.get(f"{layout} one_step_off")
        if not (a and b):
            continue
        if a["executor"] != b["executor"]:        # not like for like: no ratio
            print(f"  {layout}: sync ran on {a['executor']}, one-step-off on {b['executor']}: no speed-up computed")
            summary[f"one_step_off_speedup_{layout}"] = None
            continue
        speedup = a["s_per_step"] / b["s_per_step"]
        print(f"  {layout}: one-step-off {b['s_per_step']:.3f} s/step vs sync {a['s_per_step']:.3f}: x{speedup:.2f} "
              f"(both on {a['executor']})")
        summary[f"one_step_off_speedup_{layout}"] = round(speedup, 3)
        summary[f"one_step_off_speedup_{layout}_executor"] = a["executor"]
    record.emit("gpu_multi", summary, args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
