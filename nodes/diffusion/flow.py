"""A flow-matching image policy and FlowGRPO's stochastic sampler, with per-step log-probabilities.

The model is a rectified flow: an image ``x0`` and noise ``e`` are joined along the straight line
``x_t = (1 - t) x0 + t e``, and :class:`VelocityNet` learns the velocity ``v(x_t, t) = e - x0``. Sampling
walks from ``t = 1`` (noise) to ``t = 0``. Deterministic sampling (the ODE ``dx = v dt``) has no
log-probability to train with, so FlowGRPO samples with the SDE of the same marginals instead::

    dx = [v + s_t^2 / (2 t) * (x + (1 - t) v)] dt + s_t dW,    s_t = a * sqrt(t / (1 - t))

Each Euler-Maruyama step from ``t`` to ``t + dt`` (``dt < 0``) is then a Gaussian, whose mean
:func:`step_mean` depends on the weights and whose standard deviation ``s_t * sqrt(-dt)`` does not. The
log-probability of a transition (:func:`step_logprob`) is that Gaussian's log-density, averaged over the
image's values as FlowGRPO averages it, so its scale does not grow with the image. ``a``, the noise level, is
``noise_level`` (0.7 by default, as in FlowGRPO).

>>> import torch
>>> net = VelocityNet(channels=8, emb=16).eval()
>>> ts = timesteps(4)
>>> out = sample(net, torch.zeros(2, 3, 16, 16), ts, 0.7, torch.Generator().manual_seed(0))
>>> out["latents"].shape, out["logprob"].shape
(torch.Size([2, 5, 3, 16, 16]), torch.Size([2, 4]))
>>> again = transition_logprobs(net, out["latents"], ts, 0.7, list(range(4)))
>>> bool(torch.allclose(again, out["logprob"], atol=1e-5))
True
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F


def timesteps(steps: int, shift: float = 1.0) -> torch.Tensor:
    """``steps + 1`` times from 1 to 0 (``shift > 1`` spends more steps at high noise, as SD3 does)."""
    t = torch.linspace(1.0, 0.0, steps + 1, dtype=torch.float64)
    t = shift * t / (1 + (shift - 1) * t)
    return t.float()


def noise_std(ts: torch.Tensor, k: int, noise_level: float) -> float:
    """``s_t * sqrt(-dt)`` of step ``k`` (from ``ts[k]`` to ``ts[k + 1]``); at ``t = 1`` the next time's ``s``."""
    t = float(ts[k]) if float(ts[k]) < 1.0 else float(ts[1])
    s = noise_level * math.sqrt(t / (1.0 - t))
    return s * math.sqrt(float(ts[k] - ts[k + 1]))


def step_mean(x: torch.Tensor, v: torch.Tensor, ts: torch.Tensor, k: int, noise_level: float) -> torch.Tensor:
    """The mean of the SDE step ``k`` from ``x`` at ``ts[k]`` with velocity ``v`` (module docstring)."""
    t, dt = float(ts[k]), float(ts[k + 1] - ts[k])
    tt = t if t < 1.0 else float(ts[1])
    s2 = noise_level ** 2 * tt / (1.0 - tt)
    return x + (v + s2 / (2 * t) * (x + (1 - t) * v)) * dt


def gaussian_logprob(x: torch.Tensor, mean: torch.Tensor, std: float) -> torch.Tensor:
    """Per-sample mean over the values of the log-density of ``N(mean, std^2)`` at ``x``."""
    lp = -((x - mean) ** 2) / (2 * std * std) - math.log(std) - 0.5 * math.log(2 * math.pi)
    return lp.flatten(1).mean(1)


@torch.no_grad()
def sample(net: nn.Module, noise: torch.Tensor, ts: torch.Tensor, noise_level: float,
           generator: torch.Generator | None = None) -> dict:
    """SDE sampling from ``noise``: ``latents`` ``[B, steps + 1, C, H, W]`` (the whole trajectory, ``x`` at
    ``ts[0] .. ts[-1]``) and each transition's ``logprob`` ``[B, steps]``."""
    x = noise
    traj, lps = [x], []
    for k in range(len(ts) - 1):
        v = net(x, ts[k].expand(x.shape[0]))
        mean = step_mean(x, v, ts, k, noise_level)
        std = noise_std(ts, k, noise_level)
        x = mean + std * torch.randn(x.shape, generator=generator, dtype=x.dtype)
        traj.append(x)
        lps.append(gaussian_logprob(x, mean, std))
    return {"latents": torch.stack(traj, 1), "logprob": torch.stack(lps, 1)}


def transition_logprobs(net: nn.Module, latents: torch.Tensor, ts: torch.Tensor, noise_level: float,
                        steps: list[int]) -> torch.Tensor:
    """The log-probabilities ``[B, len(steps)]`` of the recorded transitions ``steps`` under ``net`` (with grad
    when enabled): the same computation, batch by batch and step by step, as :func:`sample`'s."""
    out = []
    for k in steps:
        x, nxt = latents[:, k], latents[:, k + 1]
        v = net(x, ts[k].expand(x.shape[0]))
        out.append(gaussian_logprob(nxt, step_mean(x, v, ts, k, noise_level), noise_std(ts, k, noise_level)))
    return torch.stack(out, 1)


# ---------------------------------------------------------------- the network


def time_embedding(t: torch.Tensor, dim: int) -> torch.Tensor:
    half = dim // 2
    freqs = torch.exp(-math.log(10_000.0) * torch.arange(half, dtype=torch.float32, device=t.device) / half)
    args = 1000.0 * t.float()[:, None] * freqs[None]
    return torch.cat([torch.sin(args), torch.cos(args)], 1)


class ResBlock(nn.Module):
    def __init__(self, cin: int, cout: int, emb: int):
        super().__init__()
        self.norm1, self.conv1 = nn.GroupNorm(8, cin), nn.Conv2d(cin, cout, 3, padding=1)
        self.emb = nn.Linear(emb, cout)
        self.norm2, self.conv2 = nn.GroupNorm(8, cout), nn.Conv2d(cout, cout, 3, padding=1)
        self.skip = nn.Conv2d(cin, cout, 1) if cin != cout else nn.Identity()

    def forward(self, x: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
        h = self.conv1(F.silu(self.norm1(x))) + self.emb(e)[:, :, None, None]
        h = self.conv2(F.silu(self.norm2(h)))
        return self.skip(x) + h


class VelocityNet(nn.Module):
    """A two-level UNet: ``v(x_t, t)`` for ``[B, 3, H, W]`` images in [-1, 1] (``H``, ``W`` divisible by 2)."""

    def __init__(self, channels: int = 32, emb: int = 64, in_channels: int = 3):
        super().__init__()
        c = channels
        self.config = {"channels": channels, "emb": emb, "in_channels": in_channels}
        self.emb_dim = emb
        self.time = nn.Sequential(nn.Linear(emb, emb), nn.SiLU(), nn.Linear(emb, emb))
        self.inp = nn.Conv2d(in_channels, c, 3, padding=1)
        self.down1 = ResBlock(c, c, emb)
        self.pool = nn.Conv2d(c, 2 * c, 3, stride=2, padding=1)
        self.down2 = ResBlock(2 * c, 2 * c, emb)
        self.mid = ResBlock(2 * c, 2 * c, emb)
        self.up = nn.ConvTranspose2d(2 * c, c, 2, stride=2)
        self.up1 = ResBlock(2 * c, c, emb)
        self.out = nn.Sequential(nn.GroupNorm(8, c), nn.SiLU(), nn.Conv2d(c, in_channels, 3, padding=1))

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        e = self.time(time_embedding(t, self.emb_dim))
        h1 = self.down1(self.inp(x), e)
        h2 = self.mid(self.down2(self.pool(h1), e), e)
        return self.out(self.up1(torch.cat([self.up(h2), h1], 1), e))
