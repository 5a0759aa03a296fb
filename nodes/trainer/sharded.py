"""The torch trainer sharded with PyTorch FSDP2 (``pools.<trainer>.sharding: fsdp``).

``fully_shard`` wraps every decoder layer, then the root (embeddings, final
norm, head): each rank keeps ``1/world`` of every parameter, of its gradient
and of its AdamW moments. A unit's parameters are all-gathered (one
collective per unit, FSDP2's bucket) for its forward and again for its
backward, and its gradients are reduce-scattered as the backward leaves it.

What the trainer's nodes must keep to, and this module gives them:

- **lockstep**: a forward of a sharded model is a collective, so every rank
  runs the same number of them. :func:`lockstep` pads a rank's micro-batches
  with :func:`idle_pass` (a one-token forward whose loss is zero; it still
  takes part in every all-gather and reduce-scatter) when its share is
  shorter (samples dropped as too stale, an empty share);
- **summed gradients**: each rank divides its loss by the whole mini-batch's
  token count, so the reduce-scatter sums (divide factor 1), exactly as the
  replicated data-parallel trainer's all-reduce does;
- **checkpoints** hold each rank's own shards as plain tensors
  (:func:`local_state`, :func:`load_local`): the same world restores them
  exactly, nothing is gathered;
- **export** (:func:`gather`): unit by unit, every rank all-gathers the unit's
  parameters, rank 0 copies them out, the unit is resharded. Rank 0 ends with
  the one full copy the rollout needs, in the dtype the rollout holds; the
  other ranks never hold more than one unit unsharded.
"""

from __future__ import annotations

import sys

import torch

# FSDP and DTensor are imported by :func:`shard` only (0.6 s of every trainer's start-up otherwise): before
# it ran, no module or tensor can be one of theirs, and the checks below say so without importing them.


class _Never:
    """Stands for FSDP2's and DTensor's classes until they are imported: nothing is an instance of it."""


def _fsdp_module():
    m = sys.modules.get("torch.distributed.fsdp")
    return getattr(m, "FSDPModule", _Never) if m else _Never


def _dtensor():
    m = sys.modules.get("torch.distributed.tensor")
    return getattr(m, "DTensor", _Never) if m else _Never


def shard(model: torch.nn.Module, mesh) -> torch.nn.Module:
    """``fully_shard`` each decoder layer (transformers names them ``*DecoderLayer``), then the root."""
    from torch.distributed.fsdp import fully_shard
    layers = [m for m in model.modules() if type(m).__name__.endswith("DecoderLayer")]
    if not layers:
        raise ValueError(f"{type(model).__name__} has no *DecoderLayer modules to shard one by one")
    for layer in layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    for unit in units(model):
        unit.set_gradient_divide_factor(1.0)     # a sum: each rank's loss is already divided by the whole mini-batch
        unit.set_force_sum_reduction_for_comms(True)  # a plain SUM (gloo has no PREMUL_SUM)
    return model


def units(model: torch.nn.Module) -> list:
    fsdp = _fsdp_module()
    return [m for m in model.modules() if isinstance(m, fsdp)]


def local(t):
    return t.to_local() if isinstance(t, _dtensor()) else t


def idle_pass(model: torch.nn.Module, device, backward: bool) -> None:
    """One forward (and backward) of a single token with a zero loss: this rank's part of every collective
    of a micro-batch it has no rows for. Its gradients are zero, so the step is the one its peers take."""
    ids = torch.zeros((1, 1), dtype=torch.long, device=device)
    logits = model(input_ids=ids, attention_mask=torch.ones_like(ids), logits_to_keep=1).logits
    if backward:
        (logits.float().sum() * 0.0).backward()


def lockstep(parts: list, dp) -> list:
    """``parts`` padded with ``None`` to the longest list any rank has (every rank calls this)."""
    return parts + [None] * (dp.all_max(len(parts)) - len(parts))


def state_bytes(model: torch.nn.Module, opt) -> int:
    """Bytes this rank holds of the parameters, their gradients and the optimizer state (shards only)."""
    seen, total = set(), 0
    tensors = [local(p) for p in model.parameters()] + [local(p.grad) for p in model.parameters()
                                                          if p.grad is not None]
    tensors += [local(v) for st in opt.state.values() for v in st.values() if torch.is_tensor(v)]
    for t in tensors:
        s = t.untyped_storage()
        if s.data_ptr() not in seen:
            seen.add(s.data_ptr())
            total += s.nbytes()
    return total


def local_state(model: torch.nn.Module, opt) -> dict:
    """This rank's shards of the model and of the optimizer state, as plain tensors (a checkpoint)."""
    def plain(x):
        if isinstance(x, dict):
            return {k: plain(v) for k, v in x.items()}
        return local(x).detach().clone() if torch.is_tensor(x) else x
    return {"model": plain(model.state_dict()), "opt": plain(opt.state_dict())}


@torch.no_grad()
def load_local(model: torch.nn.Module, opt, state: dict) -> None:
    """Write a :func:`local_state` of the same world back into this rank's shards."""
    current = model.state_dict()
    missing = sorted(set(current) ^ set(state["model"]))
    if missing:
        raise ValueError(f"the checkpoint's sharded state does not fit this model ({', '.join(missing[:3])})")
    for k, t in current.items():
        mine = local(t)
        if mine.shape != state["model"][k].shape:
            raise ValueError(f"{k}: checkpoint shard {tuple(state['model'][k].shape)} vs this rank's "
                             f"{tuple(mine.shape)}: restore with the same pools.<trainer>.actors")
        mine.copy_(state["model"][k])
    opt.load_state_dict(state["opt"])
    DTensor = _dtensor()
    for p, st in opt.state.items():               # moments back to DTensors shaped like their parameter
        if isinstance(p, DTensor):
            for k, v in st.items():
                if torch.is_tensor(v) and not isinstance(v, DTensor) and v.dim() > 0:
                    st[k] = DTensor.from_local(v, p.device_mesh, p.placements, run_check=False,
                                               shape=p.shape, stride=p.stride())


@torch.no_grad()
def gather(model: torch.nn.Module, keep: bool, dtype=None, names=None, into: dict | None = None) -> dict | None:
    """The full tensors of the model's state dict (or of ``names``), unit by unit; every rank calls it and
    only a rank with ``keep`` gets them (cast to ``dtype``; written into ``into``'s tensors when it has them)."""
    keys = list(model.state_dict().keys()) if names is None else list(names)
    fsdp = _fsdp_module()
    prefixes = {m: n for n, m in model.named_modules() if isinstance(m, fsdp)}
    owner: dict = {u: [] for u in prefixes}
    for k in keys:        # the deepest unit whose prefix the name starts with (the root's is "")
        u = max((u for u, p in prefixes.items() if not p or k.startswith(p + ".")), key=lambda u: len(prefixes[u]))
        owner[u].append(k)
    out = into if into is not None else {}
    for unit, ks in owner.items():
        if not ks:
            continue
        unit.unshard()
        for k in ks:
            t = _tensor(model, k)
            if keep:
                v = t.detach() if dtype is None else t.detach().to(dtype)
                if k in out and out[k].shape == v.shape and out[k].dtype == v.dtype:
                    out[k].copy_(v)
                else:
                    out[k] = v.clone()
        unit.reshard()
    return out if keep else None


def _tensor(model: torch.nn.Module, name: str) -> torch.Tensor:
    try:
        return model.get_parameter(name)
    except AttributeError:
        return model.get_buffer(name)
