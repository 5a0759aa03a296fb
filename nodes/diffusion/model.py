"""The embedded image model ``tiny-flow``: a :class:`~nodes.diffusion.flow.VelocityNet` pretrained here, offline, on
procedural pictures, then cached like the ``tiny`` language model (``$OMNIGRAPH_CACHE/models``).

The pictures (:func:`discs`) are 16x16 RGB, one filled disc of a random colour, radius and position on a
black background, values in [-1, 1]. Pretraining is plain rectified-flow matching (``|v(x_t, t) - (e - x0)|^2``,
``t`` uniform), AdamW, ``PRETRAIN["steps"]`` steps: a model that draws discs anywhere, which the RL task then
steers (``nodes.diffusion.flowgrpo.centred``: the disc in the middle).

The folder holds ``config.json`` (``architectures: ["OmnigraphVelocityNet"]`` and the net's shape) and
``model.safetensors``; :func:`load` reads it back.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import torch

from omnigraph.sdk import ConfigError

from nodes import models
from nodes.diffusion.flow import VelocityNet

NET = {"channels": 16, "emb": 32}
IMAGE = 16
PRETRAIN = {"steps": 1000, "batch": 64, "lr": 3e-3}
VERSION = 1
ARCH = "OmnigraphVelocityNet"


def discs(n: int, generator: torch.Generator, size: int = IMAGE) -> torch.Tensor:
    """``n`` pictures ``[n, 3, size, size]`` in [-1, 1]: one disc each, anywhere (fully inside the frame)."""
    r = 2.0 + 3.0 * torch.rand(n, generator=generator)
    cx = r + 0.5 + (size - 1 - 2 * r) * torch.rand(n, generator=generator)
    cy = r + 0.5 + (size - 1 - 2 * r) * torch.rand(n, generator=generator)
    colour = 0.3 + 0.7 * torch.rand(n, 3, generator=generator)
    yy, xx = torch.meshgrid(torch.arange(size, dtype=torch.float32), torch.arange(size, dtype=torch.float32),
                            indexing="ij")
    d2 = (xx[None] - cx[:, None, None]) ** 2 + (yy[None] - cy[:, None, None]) ** 2
    inside = torch.sigmoid(2.0 * (r[:, None, None] ** 2 - d2) / r[:, None, None])      # soft edge
    img = inside[:, None] * colour[:, :, None, None]
    return img * 2 - 1


def tiny_flow(seed: int = 0, log=print) -> Path:
    """The embedded image model's folder, built once per seed (registered as the model ``tiny-flow``)."""
    return models.cached("tiny-flow", [VERSION, NET, IMAGE, PRETRAIN], seed, build, log)


def build(target: Path, seed: int, log=print) -> None:
    log(f"building the embedded image model tiny-flow (seed {seed}, once; cached in {target.parent})")
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    net = VelocityNet(**NET)
    opt = torch.optim.AdamW(net.parameters(), lr=PRETRAIN["lr"], weight_decay=0.0)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, PRETRAIN["steps"])
    t0, ema = time.perf_counter(), None
    for step in range(PRETRAIN["steps"]):
        x0 = discs(PRETRAIN["batch"], g)
        e = torch.randn(x0.shape, generator=g)
        t = torch.rand(x0.shape[0], generator=g)
        xt = (1 - t)[:, None, None, None] * x0 + t[:, None, None, None] * e
        loss = ((net(xt, t) - (e - x0)) ** 2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        l = float(loss.detach())
        ema = l if ema is None else 0.98 * ema + 0.02 * l
        if (step + 1) % 250 == 0:
            log(f"  tiny-flow pretraining: step {step + 1}/{PRETRAIN['steps']}, flow loss {ema:.4f}, "
                f"{time.perf_counter() - t0:.0f} s")
    save(net, target)


def save(net: VelocityNet, target: Path) -> None:
    from safetensors.torch import save_file
    tmp = target.with_name(target.name + ".tmp")
    tmp.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in net.state_dict().items()}, str(tmp / "model.safetensors"))
    (tmp / "config.json").write_text(json.dumps({"architectures": [ARCH], "image_size": IMAGE, **net.config}))
    if target.exists():
        shutil.rmtree(target)
    tmp.rename(target)


def load(path: Path, device: str = "cpu") -> tuple[VelocityNet, dict]:
    """(net, config) from a folder :func:`save` wrote; a clear error for any other folder."""
    from safetensors.torch import load_file
    cfg_path = Path(path) / "config.json"
    try:
        config = json.loads(cfg_path.read_text())
    except (OSError, ValueError) as e:
        raise ConfigError(f"cannot read {cfg_path}: {e}", where="model.path", fix="use model.path: tiny-flow") from None
    if ARCH not in (config.get("architectures") or []):
        raise ConfigError(f"{path} is not a flow image model (architectures: {config.get('architectures')})",
                          where="model.path", fix="the flow backends need model.path: tiny-flow (or a folder "
                                                  "nodes.diffusion.model.save wrote)")
    net = VelocityNet(**{k: config[k] for k in ("channels", "emb", "in_channels") if k in config})
    net.load_state_dict(load_file(str(Path(path) / "model.safetensors")))
    return net.to(device), config
