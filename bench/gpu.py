"""GPU benchmark on one card: generation, update and weight-sync rates, sync vs one-step-off.

Models, built on the GPU from their configs with random weights (the GPU
machine reaches no model hub, and a run carries at most 64 MiB):

- ``qwen2-0.5b``: Qwen2.5-0.5B's shape (hidden 896, 24 layers, 14 heads, 2 KV
  heads, intermediate 4864, vocabulary 151936, tied embeddings: 494M parameters);
- ``smollm2-135m``: the real SmolLM2-135M-Instruct when ``model.path:
  smollm2-135m`` is already materialised in ``$OMNIGRAPH_CACHE``, else its
  shape (hidden 576, 30 layers, 9 heads, 3 KV heads, vocabulary 49152) with
  random weights: its 98 MB GGUF does not fit a 64 MiB run.

A tokenizer with the embedded model's characters, padded to the model's
vocabulary, makes each a model folder the real nodes load. For each model,
with the real nodes (``generate`` backend ``hf``, ``reward``, ``old_logprob``,
``update``, ``sync``, built as their actors build them:
``omnigraph.testing.build_node``) in this process, bf16 as ``graphs/gpu/*.yaml`` says:

- generation tokens/s, the same node two ways side by side (interleaved, after a warm-up each): ``decode:
  eager`` (transformers ``generate``, dynamic cache) and ``decode: static`` (static KV cache, the compiled
  decode step, :mod:`nodes.rollout.decode`), both sampled with logprobs; ``gen_speedup_static`` is their ratio and
  ``gen_compile_s`` the static node's one compile at construction (not in the rates);
- update tokens/s (``old_logprob`` (fused into the update when it takes one optimizer
  step) + the update: forward, PPO loss, backward, AdamW, over prompt and completion tokens);
- weight sync by the path the plan chooses for pools sharing a card (``cuda-ipc``): the
  trainer's export (``sync`` + the transport: a persistent flat bf16 buffer refilled), then in another
  process the real rollout node (``decode: eager``) and transport: unpickling the ``Weights`` (opens the CUDA
  IPC handle, or finds it open), the transport's ``arrive`` (copies into the node's parameters, waits), the
  node's ``load_weights``; ``ipc_fraction_of_device_copy`` = a device copy of the same bytes / the whole sync,
  and the receiver's parameters are checked against what was sent (``sync_verified``);
- against, in the same run and on the same bytes: a device-to-device copy, and the host
  round trip through omnigraph's own ``host`` weights path (the same ``sync`` state exported
  by the ``host`` transport: ``TensorPack.pack(..., dtype=bf16, path="host")`` on the GPU,
  copied to host memory; pickled and unpickled (protocol 5, the bytes in-band: what crosses
  a process boundary); loaded by the real rollout node's ``load_weights``, host -> GPU).
  It runs in this process, so no inter-process copy is counted (a lower bound on that
  path's cost); its parts are in the JSON (``host_round_trip_parts_s``).

Every timing is the median of ``--reps`` (default 5) repetitions after one warm-up.

Then, on ``qwen2-0.5b``, ``omnigraph`` runs sync and one-step-off GRPO through
the compiled graph (``ray`` executor), rollout and trainer sharing the card
(0.5 GPU each), and reports seconds per step.

    python bench/gpu.py [--quick] [--skip-runtime] [--reps 5] [--no-save]

Prints a table, then one JSON line (last), also saved under ``bench/results/`` (``bench/record.py``;
on the GPU machine set ``OMNIGRAPH_BENCH_RESULTS=$OUT/results`` and ``OMNIGRAPH_GIT_REV``).
"""

from __future__ import annotations

import argparse
import gc
import os
import pickle
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
os.environ.setdefault("RAY_AUTH_MODE", "disabled")     # a local, loopback-only cluster

import torch  # noqa: E402

import omnigraph as og  # noqa: E402
import record  # noqa: E402
from omnigraph import transports  # noqa: E402
from omnigraph.sdk import Weights  # noqa: E402
from omnigraph.testing import build_node, prompts  # noqa: E402

GPU_GRAPH = ROOT / "graphs" / "gpu" / "grpo_one_step_off.yaml"
SHAPES = {
    "qwen2-0.5b": ("qwen2", dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14,
                                 num_key_value_heads=2, intermediate_size=4864, vocab_size=151936,
                                 max_position_embeddings=32768, rope_theta=1e6, tie_word_embeddings=True)),
    "smollm2-135m": ("llama", dict(hidden_size=576, num_hidden_layers=30, num_attention_heads=9,
                                   num_key_value_heads=3, intermediate_size=1536, vocab_size=49152,
                                   max_position_embeddings=8192, rope_theta=1e5, tie_word_embeddings=True)),
}


def tokenizer(vocab_size: int):
    """The embedded model's character tokenizer, its vocabulary padded to ``vocab_size`` ids."""
    from tokenizers import Tokenizer, decoders, models as tm, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    from nodes import zoo
    vocab = dict(zoo.build_tokenizer().get_vocab())
    for i in range(len(vocab), vocab_size):
        vocab[f"<x{i}>"] = i
    tok = Tokenizer(tm.BPE(vocab, merges=[], unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>",
                                   unk_token="<unk>", padding_side="left")


def build(name: str, folder: Path) -> tuple[Path, str]:
    """A model folder for ``name``: the real SmolLM2 when cached, else random weights of the shape."""
    if name == "smollm2-135m":
        from nodes import models
        real = models.cache_root() / "models" / "smollm2-135m-instruct"
        if (real / "config.json").exists():
            return real, "real weights"
    target = folder / name
    if not (target / "config.json").exists():
        random_model(*SHAPES[name], target)
    return target, "random weights"


def random_model(arch: str, shape: dict, target: Path) -> Path:
    """Save a model of architecture ``arch`` and ``shape`` with random bf16 weights (built on the GPU, seed 0)
    and a tokenizer of its vocabulary (:func:`tokenizer`) to ``target``."""
    from transformers import AutoConfig, AutoModelForCausalLM
    tok = tokenizer(shape["vocab_size"])
    cfg = AutoConfig.for_model(arch, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                               pad_token_id=tok.pad_token_id, **shape)
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    model.save_pretrained(target, safe_serialization=True)
    tok.save_pretrained(target)
    del model
    torch.cuda.empty_cache()
    return target


def spec_for(path: Path, overrides: list[str], graph: Path = GPU_GRAPH):
    return og.load(graph, [f"model.path={path}", "nodes.generate.eval_every=0", "checkpoint.every=null",
                           "runtime.seed=0"] + overrides)


def cuda_time(fn, reps: int = 5) -> float:
    """Median seconds of ``fn()`` on the GPU, timed with CUDA events after one warm-up."""
    fn()
    out = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b) / 1e3)
    return statistics.median(out)


RECEIVER = r"""
import os, pickle, struct, sys, time, torch
sys.path.insert(0, os.getcwd())
import omnigraph as og
from omnigraph import transports
from omnigraph.testing import build_node
spec = og.load(sys.argv[1], [f"model.path={sys.argv[2]}", "nodes.generate.options.decode=eager", "nodes.generate.eval_every=0",
                             "checkpoint.every=null"])
gen, _ = build_node(spec, "generate")
rx = transports.make("cuda-ipc", "sync", spec.nodes["sync"])
print("ready", flush=True)
while True:
    head = sys.stdin.buffer.read(8)
    if len(head) < 8:
        break
    blob = sys.stdin.buffer.read(struct.unpack("<Q", head)[0])
    t0 = time.perf_counter()
    w = pickle.loads(blob)                       # the Weights: opens the CUDA IPC buffer (or finds it open)
    t1 = time.perf_counter()
    path = w.path
    w = rx.arrive(w, gen.weight_targets(w.payload))   # copies into the node's parameters and waits for it
    t2 = time.perf_counter()
    gen.load_weights(w)
    torch.cuda.synchronize()
    t3 = time.perf_counter()
    print(f"{t1 - t0:.6f} {t2 - t1:.6f} {t3 - t2:.6f} {path}", flush=True)
unique = {p.data_ptr(): p for p in gen.model.state_dict().values()}
print("sum", repr(float(sum(p.double().sum() for p in unique.values()))), flush=True)
"""


def _read(proc, ok) -> list[str]:
    """The receiver's next line that ``ok`` accepts (other output is passed through)."""
    while True:
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the receiver process exited (code {proc.poll()})")
        words = line.decode().split()
        if ok(words):
            return words
        print("  receiver:", line.decode().rstrip())


def micro(name: str, path: Path, origin: str, args) -> dict:
    """Generation, update and weight-sync rates with the real nodes, in this process."""
    reps = args.reps
    new = 64 if args.quick else 128
    overrides = [f"task.prompts={16}", f"nodes.generate.max_new_tokens={new}",
                 "nodes.update.micro_batch_size=32", "nodes.old_logprob.micro_batch_size=32"]
    spec = spec_for(path, overrides)
    plan = og.compile(spec)
    shared: dict = {}                                   # the trainer actor's nodes share one policy
    t0 = time.perf_counter()
    gen, roll = build_node(spec_for(path, overrides + ["nodes.generate.options.decode=static"]), "generate")
    build_s = time.perf_counter() - t0
    compile_s = roll.metrics.get("decode_compile_s", float("nan"))
    eager, eager_ctx = build_node(spec_for(path, overrides + ["nodes.generate.options.decode=eager"]), "generate")
    rew, _ = build_node(spec, "reward")
    olp, _ = build_node(spec, "old_logprob", shared=shared)
    upd, _ = build_node(spec, "update", shared=shared)
    sync, _ = build_node(spec, "sync", shared=shared)
    params = sum(p.numel() for p in upd.policy.model.parameters())
    # generation: each node's own tokens/s (completion tokens; a random model rarely stops early), interleaved
    gen.generate(0, prompts(spec, 0), Weights(0))
    eager.generate(0, prompts(spec, 0), Weights(0))
    rates = {"eager": [], "static": []}
    for step in range(1, reps + 1):
        for mode, node, ctx in (("eager", eager, eager_ctx), ("static", gen, roll)):
            batch = node.generate(step, prompts(spec, step), Weights(0))
            rates[mode].append(ctx.metrics["gen_tokens_per_s"])
    gen_tps = {m: statistics.median(r) for m, r in rates.items()}
    del eager
    torch.cuda.empty_cache()
    batch = rew.score(0, batch)
    # the trainer's step: old_logprob (fused into the update when it takes one optimizer step) + the update
    fused = olp.fusable(batch)

    def train(i):
        upd.train(i, olp.logprobs(i, batch.with_fields()))

    train(0)
    torch.cuda.synchronize()
    times = []
    for i in range(reps):
        t0 = time.perf_counter()
        train(i + 1)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    P = batch.meta["prompt_len"]
    c = int(batch.fields["response_mask"].sum(1).max())
    tokens = len(batch) * (P + c)
    upd_tps = tokens / statistics.median(times)
    # weight sync by the plan's path: export -> CUDA IPC -> another process's rollout node opens, copies, loads
    from omnigraph.transports.packed import KEEP
    path_name = plan.weights["sync"]
    tx = transports.make(path_name, "sync", spec.nodes["sync"])
    rx = subprocess.Popen([sys.executable, "-c", RECEIVER, str(GPU_GRAPH), str(path)], stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, cwd=ROOT, env={**os.environ, "PYTHONPATH": os.pathsep.join(
                              [str(ROOT), os.environ.get("PYTHONPATH", "")])})
    _read(rx, lambda w: w == ["ready"])
    rows = []
    for v in range(1, KEEP + reps + 1):              # the first KEEP fill the sender's packs and open them: warm-up
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        state = sync.state()
        ts = time.perf_counter()
        w = tx.export(state, v)
        t1 = time.perf_counter()
        blob = pickle.dumps(w)
        rx.stdin.write(struct.pack("<Q", len(blob)) + blob)
        rx.stdin.flush()
        t_open, t_copy, t_load, how = _read(rx, lambda w: len(w) == 4 and w[3] in ("cuda-ipc", "shm", "host"))
        t2 = time.perf_counter()
        rows.append({"export": t1 - t0, "state": ts - t0, "open": float(t_open), "copy": float(t_copy), "load": float(t_load),
                     "total": t2 - t0, "handle_bytes": len(blob), "path": how})
    rx.stdin.close()
    sent = float(sum(b.double().sum() for b in w.tensors.buffers.values()))
    got = float(_read(rx, lambda w: len(w) == 2 and w[0] == "sum")[1])
    rx.wait(timeout=60)
    nbytes = w.nbytes
    parts = ("export", "state", "open", "copy", "load", "total")
    med = {k: statistics.median(r[k] for r in rows[KEEP:]) for k in parts}
    flat = next(iter(w.tensors.buffers.values()))
    d2d = cuda_time(lambda: flat.clone(), reps)
    del w, flat
    tx.close()
    host = host_round_trip(spec, sync, gen, reps)
    del gen, upd, olp, sync, rew
    torch.cuda.empty_cache()
    return {"model": name, "weights": origin, "params_m": round(params / 1e6, 1),
            "gen_tokens_per_s": round(gen_tps["static"]), "gen_tokens_per_s_eager": round(gen_tps["eager"]),
            "gen_tokens_per_s_static": round(gen_tps["static"]),
            "gen_speedup_static": round(gen_tps["static"] / gen_tps["eager"], 2), "gen_compile_s": round(compile_s, 1),
            "gen_static_build_s": round(build_s, 1), "gen_reps": reps, "gen_batch": len(batch), "max_new_tokens": new, "update_tokens_per_s": round(upd_tps),
            "update_tokens": tokens, "update_s": round(statistics.median(times), 4), "old_logprob_fused": fused,
            "reps": reps, "sync_bytes": nbytes, "sync_path": rows[-1]["path"],
            "sync_handle_bytes": rows[-1]["handle_bytes"],
            **{f"sync_{k}_s": round(v, 6) for k, v in med.items()},
            "sync_first_s": round(rows[0]["total"], 5), "sync_warmup": KEEP,
            "sync_gb_per_s": round(nbytes / med["total"] / 1e9, 2),
            "sync_verified": abs(sent - got) <= 1e-9 * max(1.0, abs(sent)), "sync_sum_sent": sent, "sync_sum_received": got,
            "d2d_copy_s": round(d2d, 6), "d2d_copy_gb_per_s": round(nbytes / d2d / 1e9, 1),
            "ipc_fraction_of_device_copy": round(d2d / med["total"], 3),
            "host_round_trip_s": round(host["total"], 4),
            "host_round_trip_gb_per_s": round(host["bytes"] / host["total"] / 1e9, 2),
            "host_round_trip_parts_s": {k: round(host[k], 4) for k in ("export", "pickle", "unpickle", "load")},
            "host_round_trip_bytes": host["bytes"], "host_round_trip_pickled_bytes": host["pickled_bytes"],
            "host_round_trip_what": "host transport export (GPU pack, to host) + pickle + unpickle + the rollout "
                                    "node's load_weights (host -> GPU), one process: no inter-process copy counted"}


def host_round_trip(spec, sync, gen, reps: int) -> dict:
    """omnigraph's ``host`` weights path on the same state: the ``host`` transport's export (``TensorPack.pack(...,
    path="host")`` on the GPU, then to host memory), the pickling the graph's channel does, and the rollout node's
    ``load_weights`` (host -> GPU). Medians of ``reps`` after one warm-up, seconds of each part."""
    tx = transports.make("host", "sync", spec.nodes["sync"])
    rows = []
    for v in range(reps + 1):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        w = tx.export(sync.state(), 1000 + v)
        t1 = time.perf_counter()
        blob = pickle.dumps(w.tensors, protocol=pickle.HIGHEST_PROTOCOL)
        t2 = time.perf_counter()
        pack = pickle.loads(blob)
        t3 = time.perf_counter()
        assert pack.path == "host" and pack.device.type == "cpu", pack
        gen.load_weights(Weights(w.version, tensors=pack, payload=w.payload, nbytes=w.nbytes, path="host"))
        torch.cuda.synchronize()
        t4 = time.perf_counter()
        rows.append({"export": t1 - t0, "pickle": t2 - t1, "unpickle": t3 - t2, "load": t4 - t3, "total": t4 - t0,
                     "bytes": w.nbytes, "pickled_bytes": len(blob)})
        del w, blob, pack
    tx.close()
    return {k: statistics.median(r[k] for r in rows[1:]) for k in rows[0]}


def runtime(path: Path, iterations: int, quick: bool) -> dict:
    """Sync vs one-step-off GRPO through the compiled graph, rollout and trainer sharing the card."""
    from omnigraph.records import steady
    from omnigraph.runtime import run
    common = [f"schedule.iterations={iterations}", "task.prompts=16", f"nodes.generate.max_new_tokens={32 if quick else 64}",
              "nodes.update.micro_batch_size=32", "nodes.old_logprob.micro_batch_size=32",
              "pools.rollout.gpus=0.5", "pools.trainer.gpus=0.5", "model.dtype=auto"]
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for mode, graph in (("sync", ROOT / "graphs" / "grpo_sync.yaml"), ("one_step_off", GPU_GRAPH)):
            split = ["pools.rollout={actors: 1, cpus: 1, gpus: 0}", "nodes.generate.pool=rollout",
                     "nodes.reward.pool=rollout", "pools.trainer.cpus=1"] if mode == "sync" else []
            plan = og.compile(spec_for(path, split + common, graph))  # the shipped sync graph is one pool
            res = run(plan, run_dir=tmp, executor="ray", progress=False)
            rows = steady(res.metrics, plan.fill)
            med = lambda key: statistics.median([r[key] for r in rows if key in r] or [float("nan")])  # noqa: E731
            out[mode] = {"s_per_step": res.summary["s_per_step"], "generate_s": med("timing_s/generate"),
                         "update_s": med("timing_s/update"), "gen_tokens_per_s": med("gen_tokens_per_s"),
                         "load_weights_s": med("load_weights_s"), "sync_export_s": med("sync_export_s"),
                         "startup_s": res.summary["startup_s"], "staleness_max": res.summary["observed_max_staleness"]}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="shorter generations and runs")
    ap.add_argument("--skip-runtime", action="store_true", help="only the in-process measurements")
    ap.add_argument("--models", default="qwen2-0.5b,smollm2-135m")
    ap.add_argument("--reps", type=int, default=5, help="timed repetitions of each measurement, after one warm-up")
    record.add_arguments(ap)
    args = ap.parse_args()
    if args.reps < 5:
        ap.error("--reps must be at least 5 (the medians are of >= 5 repetitions)")
    if not torch.cuda.is_available():
        print("bench/gpu.py needs a CUDA GPU", file=sys.stderr)
        return 2
    dev = torch.cuda.get_device_properties(0)
    print(f"gpu benchmark on {dev.name} ({dev.total_memory / 2**30:.0f} GiB), torch {torch.__version__}, "
          f"{torch.cuda.device_count()} visible GPU(s); bf16 (mixed precision trainer, bf16 rollout)")
    folder = Path(os.environ.get("OMNIGRAPH_BENCH_MODELS", Path(tempfile.gettempdir()) / "og-bench-models"))
    results, paths = [], {}
    for name in args.models.split(","):
        t0 = time.perf_counter()
        path, origin = build(name, folder)
        paths[name] = path
        print(f"\n{name} ({origin}), built in {time.perf_counter() - t0:.1f} s")
        r = micro(name, path, origin, args)
        gc.collect()
        torch.cuda.empty_cache()
        results.append(r)
        print(f"  parameters {r['params_m']}M; generation ({r['gen_batch']} sequences x {r['max_new_tokens']} new "
              f"tokens) eager {r['gen_tokens_per_s_eager']:,} tokens/s, static {r['gen_tokens_per_s_static']:,} "
              f"tokens/s: x{r['gen_speedup_static']} (compiled once in {r['gen_compile_s']} s, at construction); "
              f"update {r['update_tokens_per_s']:,} tokens/s ({r['update_tokens']} tokens in {r['update_s']:.3f} s)")
        print(f"  weight sync by {r['sync_path']}: {r['sync_bytes'] / 1e6:.0f} MB in {r['sync_total_s'] * 1e3:.2f} ms "
              f"= {r['sync_gb_per_s']} GB/s (export {r['sync_export_s'] * 1e3:.2f} ms; in the receiver: open "
              f"{r['sync_open_s'] * 1e3:.2f} ms, copy into the model {r['sync_copy_s'] * 1e3:.2f} ms, load_weights "
              f"{r['sync_load_s'] * 1e3:.2f} ms; {r['sync_handle_bytes']} bytes pickled; first sync "
              f"{r['sync_first_s'] * 1e3:.1f} ms; received = sent: {r['sync_verified']})")
        print(f"  same bytes: device-to-device copy {r['d2d_copy_s'] * 1e3:.2f} ms = {r['d2d_copy_gb_per_s']} GB/s; "
              f"host round trip (omnigraph's host path, one process) {r['host_round_trip_s'] * 1e3:.0f} ms = "
              f"{r['host_round_trip_gb_per_s']} GB/s; "
              f"d2d/sync = {r['ipc_fraction_of_device_copy']}, host/sync = "
              f"{r['host_round_trip_s'] / r['sync_total_s']:.1f}x")
    rt = {}
    if not args.skip_runtime:
        n = 5 if args.quick else 8
        rt = runtime(paths.get("qwen2-0.5b", next(iter(paths.values()))), n, args.quick)
        print(f"\nomnigraph run, {n} iterations each, rollout and trainer sharing one GPU (0.5 each), ray executor:")
        print(f"{'mode':<13} {'s/step':>7} {'generate s':>10} {'update s':>9} {'gen tok/s':>9} {'load w s':>8} "
              f"{'staleness':>9}")
        for mode, m in rt.items():
            print(f"{mode:<13} {m['s_per_step']:7.3f} {m['generate_s']:10.3f} {m['update_s']:9.3f} "
                  f"{m['gen_tokens_per_s']:9.0f} {m['load_weights_s']:8.4f} {m['staleness_max']:9d}")
        if len(rt) == 2:
            print(f"one-step-off speedup on one shared card: {rt['sync']['s_per_step'] / rt['one_step_off']['s_per_step']:.2f}x")
    summary = {"gpu": dev.name, "models": results, "runtime": rt}
    head = results[0]                                # the first model (qwen2-0.5b by default): the headline
    summary.update({k: head[k] for k in ("gen_speedup_static", "gen_compile_s", "ipc_fraction_of_device_copy")})
    summary["headline_model"] = head["model"]
    print(f"\n{head['model']}: gen_speedup_static {head['gen_speedup_static']} (compile {head['gen_compile_s']} s), "
          f"ipc_fraction_of_device_copy {head['ipc_fraction_of_device_copy']} "
          f"(sync {head['sync_total_s'] * 1e3:.2f} ms, device copy {head['d2d_copy_s'] * 1e3:.2f} ms)")
    if len(rt) == 2:
        summary["one_step_off_speedup"] = round(rt["sync"]["s_per_step"] / rt["one_step_off"]["s_per_step"], 3)
    record.emit("gpu", summary, args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
