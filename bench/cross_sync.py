"""Delta sync against dense across two nodes: SmolLM2-135M's weights from a trainer on node ``a`` to a rollout's
copy on node ``b`` of a two-node Ray cluster (``omnigraph.cluster.LocalCluster``), side by side.

The trainer actor (node ``a``, 1 CPU) holds SmolLM2-135M-Instruct in float32 with AdamW at ``lr``; between
syncs it takes one optimizer step on a small batch of the model's own text (real gradients, so the share of
bf16 values that change is what training at that rate gives). After each step it exports the same weights twice,
in bf16 on the wire, through the ``host`` weights path (what the ``ray`` executor takes between hosts: one flat
buffer through Ray's object store): once dense (``payload: full``) and once as a delta since its last export
(``payload: delta``, :mod:`omnigraph.transports.delta`). Two receiver actors on node ``b`` each hold a bf16
copy of the model: one loads the dense weights (``copy_into``), the other applies the deltas (base version and
checksums checked). Each sync is timed from the driver, from the export's call to the receiver's return:
export (cast, encode, pack), the crossing, the load. The order of the two alternates step by step.

Both receivers must end holding the trainer's bf16 weights bit for bit (``receivers_bit_identical``), so the
delta changes nothing the rollout samples from.
"""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path

import torch

WIRE = torch.bfloat16


class TrainerPeer:
    def __init__(self, model_dir: str, lr: float, rows: int, tokens: int):
        from transformers import AutoModelForCausalLM

        from omnigraph import transports
        from omnigraph.transports.delta import Encoder

        torch.set_num_threads(1)
        torch.manual_seed(0)
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=lr)
        self.host = {"full": transports.make("host", "sync"), "delta": transports.make("host", "sync")}
        self.enc = Encoder()
        self.rows, self.tokens = rows, tokens
        self.vocab = self.model.config.vocab_size

    def step(self, seed: int) -> float:
        g = torch.Generator().manual_seed(seed)
        ids = torch.randint(0, self.vocab, (self.rows, self.tokens), generator=g)
        loss = self.model(input_ids=ids, labels=ids).loss
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return float(loss)

    def tensors(self) -> dict:
        return {k: p.detach() for k, p in self.model.named_parameters()}

    @torch.no_grad()
    def export(self, payload: str, version: int):
        from omnigraph.sdk import WeightsState

        t0 = time.perf_counter()
        state = WeightsState(self.tensors(), "full", WIRE)
        if payload == "delta":
            state = self.enc.encode(state.tensors, WIRE, version)
        out = self.host[payload].export(state, version)
        return out, time.perf_counter() - t0

    def wire(self) -> dict:
        return {k: v.to(WIRE) for k, v in self.tensors().items()}


class ReceiverPeer:
    def __init__(self, model_dir: str):
        from transformers import AutoModelForCausalLM

        torch.set_num_threads(1)
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=WIRE)
        self.targets = {k: p.data for k, p in self.model.named_parameters()}
        self.held, self.plans = 0, {}

    @torch.no_grad()
    def load(self, sent) -> dict:
        from omnigraph.sdk import copy_into
        from omnigraph.transports.delta import apply, delta_bytes

        weights, export_s = sent
        t0 = time.perf_counter()
        if weights.payload == "delta":
            apply(weights.tensors, self.targets, self.held)
            nbytes = delta_bytes(weights.tensors)
        else:
            copy_into(self.targets, weights.tensors, self.plans)
            nbytes = weights.nbytes
        self.held = weights.version
        return {"export_s": export_s, "load_s": time.perf_counter() - t0, "bytes": nbytes,
                "payload": weights.payload}

    def weights(self) -> dict:
        return {k: v.clone() for k, v in self.targets.items()}


def measure(address: str, model_dir: str, steps: int = 6, lr: float = 1e-6, rows: int = 2,
            tokens: int = 32) -> dict:
    """Dense and delta syncs across the cluster at ``address`` (nodes labelled ``a`` and ``b``)."""
    import ray

    from omnigraph.cluster import LABEL

    here = Path(__file__).resolve().parent
    path = os.pathsep.join([str(here.parent), str(here), os.environ.get("PYTHONPATH", "")])
    ray.init(address=address, logging_level="ERROR", log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": path}})          # the workers import this module
    try:
        on = lambda node: {"label_selector": {LABEL: node}}            # noqa: E731
        trainer = ray.remote(num_cpus=1)(TrainerPeer).options(**on("a")).remote(model_dir, lr, rows, tokens)
        recv = {p: ray.remote(num_cpus=0)(ReceiverPeer).options(**on("b")).remote(model_dir)
                for p in ("full", "delta")}

        def sync(payload: str, version: int) -> dict:
            t0 = time.perf_counter()
            r = ray.get(recv[payload].load.remote(trainer.export.remote(payload, version)))
            return {**r, "total_s": time.perf_counter() - t0}

        seen: dict[str, list[dict]] = {"full": [], "delta": []}
        for p in ("full", "delta"):                      # version 1: both dense (the delta's base is seeded)
            first = sync(p, 1)
        assert first["payload"] == "full"
        losses = []
        for step in range(steps):
            losses.append(ray.get(trainer.step.remote(step)))
            order = ("full", "delta") if step % 2 == 0 else ("delta", "full")
            for p in order:
                seen[p].append(sync(p, step + 2))
        want = ray.get(trainer.wire.remote())
        got = {p: ray.get(recv[p].weights.remote()) for p in recv}
        identical = all(torch.equal(want[k], got[p][k]) for p in got for k in want)
        dense = seen["full"][0]["bytes"]
        med = {p: {k: statistics.median(r[k] for r in rows) for k in ("total_s", "export_s", "load_s")}
               for p, rows in seen.items()}
        return {
            "delta_sync_speedup_cross_node": round(med["full"]["total_s"] / med["delta"]["total_s"], 3),
            "cross_full_sync_s": round(med["full"]["total_s"], 4),
            "cross_delta_sync_s": round(med["delta"]["total_s"], 4),
            "cross_full_export_s": round(med["full"]["export_s"], 4),
            "cross_delta_export_s": round(med["delta"]["export_s"], 4),
            "cross_full_load_s": round(med["full"]["load_s"], 4),
            "cross_delta_load_s": round(med["delta"]["load_s"], 4),
            "cross_dense_mb": round(dense / 1e6, 1),
            "cross_delta_bytes_fraction": round(statistics.median(r["bytes"] for r in seen["delta"]) / dense, 4),
            "cross_steps": steps, "cross_lr": lr, "cross_train_loss": [round(x, 4) for x in losses],
            "receivers_bit_identical": identical,
            "cross_setup": "SmolLM2-135M-Instruct, fp32 AdamW trainer (node a, 1 CPU) -> bf16 receivers (node b), "
                           "host path (Ray object store), two raylets on this machine",
        }
    finally:
        ray.shutdown()
