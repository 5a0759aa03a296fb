"""Weight sync into a live vLLM engine on one host: full weights and LoRA-only, against a memcpy.

The trainer side is omnigraph's ``sync`` node, the rollout side the ``vllm``
generate backend (``nodes.rollout.vllm_engine``), on SmolLM2-135M. One sync is

- ``export``: the trainer's ``sync`` node copies its weights out (a state
  dict, or the LoRA adapter tensors only);
- ``hand-over``: what crosses between the two actors, pickled and
  unpickled: on one host's CPUs the export lives in a ``/dev/shm`` file
  (``TensorPack`` path ``shm``) and only its name crosses; the receiving
  side maps the file. For comparison, the compiled graph's channel
  carrying the same tensors as a dict between two actors (the path before
  ``shm``) is measured too (``channel_s``, ``bench/ray_channel.py``: the receiving actor reads
  every byte; the same read done locally and the graph's control cost are taken off), and so are Ray
  Direct Transport over gloo (``rdt_s``: the ``ray-tasks`` executor's path on a cluster) and the object
  store (``object_store_s``: plain calls), between two plain actors, measured the same way;
- ``load``: the engine takes them in place (``reload_weights`` through the
  worker extension, tied head re-tied, prefix cache reset), or for LoRA a
  new adapter version (``LoRARequest``), or the adapter merged into the
  base weights on the rollout (``lora_serving: merged``).

``memcpy_gb_s`` is one copy of the same bytes (``torch`` tensor copy, the
same process, the same run). Each figure is the median of ``--repeats`` after warm-ups: a run's steady state (the engine's first load
goes through ``reload_weights``; the sender reuses its ``/dev/shm`` files from the fourth export on).

    python bench/weight_sync.py [--quick] [--dtype auto|bfloat16|float32]

Needs the ``vllm`` extra. Last line: JSON with ``full_sync_s``,
``full_gb_s``, ``lora_sync_s``, ``lora_bytes``, ``full_bytes``,
``memcpy_gb_s``, ``fraction_of_memcpy`` (full sync), and the parts.
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


def nbytes(tensors: dict) -> int:
    return sum(t.numel() * t.element_size() for t in tensors.values())


def memcpy_gb_s(tensors: dict, repeats: int) -> float:
    """GB/s of copying the same bytes once (source and destination preallocated)."""
    import torch
    flat = torch.cat([t.reshape(-1).view(torch.uint8) for t in tensors.values()])
    dst = torch.empty_like(flat)
    times = []
    for _ in range(repeats + 1):
        t = time.perf_counter()
        dst.copy_(flat)
        times.append(time.perf_counter() - t)
    return flat.numel() / statistics.median(times[1:]) / 1e9


def one_sync(transport, sync, gen, version: int) -> dict:
    """export -> hand-over -> load into the engine, as a run does it; seconds of each part.

    The export is the sync node's state carried by the transport the plan chose (``shm`` here: the trainer
    packs a /dev/shm file). The hand-over is what crosses between the two actors: the export pickled and
    unpickled (for ``shm`` a file name, which the receiving side maps)."""
    import pickle

    t0 = time.perf_counter()
    w = transport.export(sync.state(), version)
    t1 = time.perf_counter()
    blob = pickle.dumps(w.tensors, protocol=5)
    w.tensors = pickle.loads(blob)
    t2 = time.perf_counter()
    gen.load_weights(w)
    t3 = time.perf_counter()
    engine = gen.ctx.metrics.get("engine_load_s", t3 - t2)     # inside the engine: the loader and the repack
    return {"export_s": t1 - t0, "handover_s": t2 - t1, "load_s": t3 - t2, "sync_s": t3 - t0, "engine_load_s": engine,
            "bytes": w.nbytes, "pickled_bytes": len(blob)}


def run_case(overrides: list[str], repeats: int) -> tuple[dict, dict]:
    """Median timings of ``repeats`` syncs (after one warm-up) for one configuration."""
    import gc
    import torch
    import omnigraph as og
    from omnigraph import transports
    from omnigraph.testing import build_node

    spec = og.load(ROOT / "graphs" / "smollm2_vllm_one_step_off.yaml", overrides)
    plan = og.compile(spec)
    transport = transports.make(plan.weights["sync"], "sync", spec.nodes["sync"])
    sync, _ = build_node(spec, "sync")
    gen, ctx = build_node(spec, "generate")
    from omnigraph.transports.packed import KEEP
    warmups = KEEP + 1      # steady state: the engine's first load reloads, the shm files are reused from the 4th
    rows = []
    for v in range(1, repeats + warmups + 1):
        with torch.no_grad():                          # a training step changed the weights
            for name, p in sync.policy.model.named_parameters():
                if p.requires_grad:
                    p.add_(1e-3)
        rows.append(one_sync(transport, sync, gen, v))
    med = {k: statistics.median(r[k] for r in rows[warmups:]) for k in rows[0]}
    med["first_sync_s"] = rows[0]["sync_s"]
    med["in_place"] = ctx.metrics.get("weights_in_place", 0.0)
    med["direct"] = ctx.metrics.get("weights_direct", 0.0)
    # own tensors: views of one flat buffer would each pickle the whole buffer
    state = {k: v.clone() for k, v in transport.export(sync.state(), 0).tensors.items()}
    from vllm.distributed import destroy_distributed_environment, destroy_model_parallel
    del gen.llm
    gc.collect()
    destroy_model_parallel()
    destroy_distributed_environment()
    return med, state


def main() -> int:
    from omnigraph.transports.packed import KEEP
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="3 syncs per case instead of 5")
    ap.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float32"],
                    help="weights' dtype on both sides (default auto: bf16 where this CPU runs it natively)")
    import record
    record.add_arguments(ap)
    args = ap.parse_args()
    try:
        import vllm  # noqa: F401
    except Exception as e:
        sys.exit(f"bench/weight_sync.py needs the vllm extra ({type(e).__name__}: {e}): pip install -e '.[vllm]'")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    repeats = 3 if args.quick else 5
    from omnigraph.planning.precision import resolve
    chosen = resolve(args.dtype, "cpu")
    if args.dtype == "auto":
        print(f"model.dtype auto -> {chosen.dtype} ({chosen.why})", flush=True)
    args.dtype = chosen.dtype
    base = [f"model.dtype={args.dtype}", "nodes.generate.dtype=null"]
    lora = ["nodes.update.lora.target_modules=[q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj]"]
    load = os.getloadavg()[0]
    print(f"weight-sync benchmark: SmolLM2-135M {args.dtype}, vLLM in this process, median of {repeats}; "
          f"load average {load:.2f} on {os.cpu_count()} CPUs", flush=True)
    full, state = run_case(base + ["nodes.update.lora=null", "nodes.sync.payload=full"], repeats)
    memcpy = memcpy_gb_s(state, repeats)
    from ray_channel import channel_timings
    channel = channel_timings(state, repeats)      # the consumer reads every byte; the local read is taken off
    channel_s = channel["transfer_s"]
    from ray_channel import direct_timings
    direct = direct_timings(state, repeats)        # Ray Direct Transport (gloo) and the object store, the same way
    adapter, _ = run_case(base + lora + ["nodes.generate.options.lora_serving=adapter"], repeats)
    merged, _ = run_case(base + lora + ["nodes.generate.options.lora_serving=merged"], repeats)
    print(f"{'payload':<16} {'MB':>8} {'export s':>9} {'hand-over s':>12} {'load s':>7} {'sync s':>7} {'GB/s':>6}")
    for name, r in (("full", full), ("lora (adapter)", adapter), ("lora (merged)", merged)):
        print(f"{name:<16} {r['bytes'] / 1e6:8.1f} {r['export_s']:9.3f} {r['handover_s']:12.3f} {r['load_s']:7.3f} "
              f"{r['sync_s']:7.3f} {r['bytes'] / r['sync_s'] / 1e9:6.2f}")
    full_gb_s = full["bytes"] / full["sync_s"] / 1e9
    handover_gb_s = full["bytes"] / full["handover_s"] / 1e9
    path_gb_s = full["bytes"] / (full["export_s"] + full["handover_s"]) / 1e9
    channel_gb_s = nbytes(state) / channel_s / 1e9
    print(f"memcpy of the same {full['bytes'] / 1e6:.0f} MB: {memcpy:.2f} GB/s; full sync {full_gb_s:.2f} GB/s "
          f"({full_gb_s / memcpy:.0%}); export + hand-over (the weight path, the engine's reload aside) "
          f"{path_gb_s:.2f} GB/s ({path_gb_s / memcpy:.0%}), {full['pickled_bytes']} bytes pickled; "
          f"the compiled graph's channel between two actors (a run's hand-over) {channel_s:.3f} s, "
          f"{channel_gb_s:.2f} GB/s ({channel_gb_s / memcpy:.0%})")
    direct_gb_s = {k: nbytes(state) / v["transfer_s"] / 1e9 for k, v in direct.items()}
    print(f"the same tensors between two plain actors: Ray Direct Transport (gloo) {direct['rdt']['transfer_s']:.3f} s, "
          f"{direct_gb_s['rdt']:.2f} GB/s; the object store {direct['store']['transfer_s']:.3f} s, "
          f"{direct_gb_s['store']:.2f} GB/s")
    record.emit("weight_sync", {
        "full_sync_s": round(full["sync_s"], 4), "full_gb_s": round(full_gb_s, 3),
        "lora_sync_s": round(adapter["sync_s"], 4), "lora_merged_sync_s": round(merged["sync_s"], 4),
        "lora_bytes": adapter["bytes"], "full_bytes": full["bytes"],
        "lora_fraction_of_full": round(adapter["bytes"] / full["bytes"], 4),
        "memcpy_gb_s": round(memcpy, 3), "fraction_of_memcpy": round(full_gb_s / memcpy, 3),
        "handover_gb_s": round(handover_gb_s, 3), "handover_fraction_of_memcpy": round(handover_gb_s / memcpy, 3),
        "path_gb_s": round(path_gb_s, 3), "path_fraction_of_memcpy": round(path_gb_s / memcpy, 3),
        "pickled_bytes": full["pickled_bytes"],
        "channel_s": round(channel_s, 4), "channel_gb_s": round(channel_gb_s, 3),
        "channel_fraction_of_memcpy": round(channel_gb_s / memcpy, 3),
        "channel_parts_s": {k: round(channel[k], 4) for k in ("full_s", "small_s", "touch_s")},
        "rdt_s": round(direct["rdt"]["transfer_s"], 4), "rdt_gb_s": round(direct_gb_s["rdt"], 3),
        "object_store_s": round(direct["store"]["transfer_s"], 4), "object_store_gb_s": round(direct_gb_s["store"], 3),
        "rdt_parts_s": {k: round(direct["rdt"][k], 4) for k in ("full_s", "small_s", "touch_s")},
        "object_store_parts_s": {k: round(direct["store"][k], 4) for k in ("full_s", "small_s", "touch_s")},
        "full_parts_s": {k: round(full[k], 4) for k in ("export_s", "handover_s", "load_s", "engine_load_s")},
        "full_first_sync_s": round(full["first_sync_s"], 4), "full_in_place": full["in_place"], "full_direct": full["direct"],
        "warmups": KEEP + 1,
        "dtype": args.dtype, "load_avg": round(load, 2)}, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
