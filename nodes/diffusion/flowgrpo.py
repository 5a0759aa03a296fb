"""FlowGRPO nodes (backend ``flow``): an image policy in the same graph as a language model's.

``generate`` samples images with the SDE of :mod:`nodes.diffusion.flow` and keeps, per sample, the whole trajectory
(``latents``) and each transition's log-probability under the weights that sampled it (``logprob``);
``reward`` (backend ``image``) scores the final images with a batched function and computes GRPO's group
advantages; ``old_logprob`` recomputes the transitions' log-probabilities under the trainer's current
weights, fused into the update's own forward (one optimizer step per batch); ``update`` is PPO-clip over denoising steps, a seeded subset of ``timestep_fraction`` of them per
update (FlowGRPO's), with the decoupled correction ``min(w, is_cap)`` for stale samples, ``w`` the ratio of
the transition's densities under the trainer's weights and the sampler's (the log-probabilities are per-value
means, as FlowGRPO's clip uses them; their ratio barely moves, so ``w`` is ``exp(values * (old - behaviour))``);
``sync`` hands the trainer's weights to the generators, as for language models: all of them, or only LoRA
adapters (``lora: {r, alpha, target_modules}`` on the update, on the net's Conv2d and Linear layers by name,
e.g. ``[conv1, conv2]``, with ``sync: {payload: lora}``).

Options (the node's ``options:``): on ``generate``, ``steps`` (10), ``noise_level`` (0.7), ``shift`` (1.0);
on ``update``, ``timestep_fraction`` (0.6) and ``adv_clip`` (5.0). The sampler's settings travel with
each batch (``meta``), so the trainer always scores the transitions the way they were sampled.
"""

from __future__ import annotations

import copy
import math
from pathlib import Path

import torch

from omnigraph.sdk import ConfigError, NodeContext, Prompt, SampleBatch, Weights, WeightsState, load

from nodes.diffusion import SamplerOptions, UpdateOptions, flow, model as flow_model
from nodes import models
from nodes.trainer.policy import micro
from nodes.rewards.scorer import grpo_advantages


def with_lora(net, lora):
    """``net`` with peft LoRA adapters on ``lora.target_modules`` (its Conv2d and Linear layers by name, e.g.
    ``conv1``, ``conv2``, ``emb``); a clear error when they name nothing in the model."""
    if lora is None:
        return net
    try:
        return models.with_lora(net, lora)
    except ValueError as e:
        names = sorted({n.rsplit(".", 1)[-1] for n, m in net.named_modules()
                        if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear))})
        raise ConfigError(f"LoRA target_modules {list(lora.target_modules)} do not fit the image model ({e})",
                          where="nodes.update.lora.target_modules",
                          fix=f"name some of its layers: {', '.join(names)}") from None


class FlowPolicy:
    """The trainer's image model (LoRA-wrapped when the update trains adapters) and its optimizer, shared by
    the nodes of one actor."""

    def __init__(self, ctx: NodeContext):
        torch.manual_seed(ctx.seed)
        self.device = torch.device(ctx.device)
        net, self.config = flow_model.load(ctx.model.dir, ctx.device)
        self.lora = ctx.policy.lora
        self.net = with_lora(net, self.lora)
        self.net.train()
        params = [p for p in self.net.parameters() if p.requires_grad]
        self.opt = torch.optim.AdamW(params, lr=ctx.policy.lr, weight_decay=ctx.policy.weight_decay)

    @staticmethod
    def of(ctx: NodeContext) -> "FlowPolicy":
        if "flow_policy" not in ctx.shared:
            ctx.shared["flow_policy"] = FlowPolicy(ctx)
        return ctx.shared["flow_policy"]

    def logprobs(self, batch: SampleBatch, rows: slice, steps: list[int]) -> torch.Tensor:
        f, m = batch.fields, batch.meta
        ts = torch.tensor(m["timesteps"])
        return flow.transition_logprobs(self.net, f["latents"][rows].to(self.device), ts, m["noise_level"], steps)


class Generate:
    """SDE sampling with per-step log-probabilities (module docstring)."""

    def __init__(self, ctx: NodeContext):
        self.ctx = ctx
        net, self.config = flow_model.load(ctx.model.dir, ctx.device)
        self.net = with_lora(net, ctx.policy.lora).eval()       # adapters the trainer's, loaded at each sync
        opts = ctx.backend_options or SamplerOptions()
        self.steps, self.noise_level = opts.steps, opts.noise_level
        self.ts = flow.timesteps(self.steps, opts.shift)
        self.version = 0
        self.pictures: dict[str, tuple[int, torch.Tensor]] = {}

    def load_weights(self, weights: Weights) -> None:
        if weights.tensors is not None and not weights.loaded:
            tensors = {k: v.float() for k, v in weights.tensors.items()}
            if weights.payload == "lora":
                from peft import set_peft_model_state_dict
                set_peft_model_state_dict(self.net, tensors)
            else:
                self.net.load_state_dict(tensors)
        self.version = weights.version

    def generate(self, step: int, prompts: list[Prompt], weights: Weights) -> SampleBatch:
        n = self.ctx.run.samples_per_prompt
        size = int(self.config.get("image_size", flow_model.IMAGE))
        # the noise of a prompt group is a function of the run's seed and the group: a regenerated batch and
        # a resumed run sample the same pictures from the same weights
        noise = torch.cat([torch.randn(n, 3, size, size, generator=torch.Generator().manual_seed(
            self.ctx.seed * 1_000_003 + p.group)) for p in prompts])
        g = torch.Generator().manual_seed(self.ctx.seed * 7_919 + step * 104_729 + prompts[0].group)
        out = flow.sample(self.net, noise.to(self.ctx.device), self.ts, self.noise_level, g)
        images = out["latents"][:, -1]
        self.pictures.setdefault("first", (weights.version, images[:64].cpu()))
        self.pictures["last"] = (weights.version, images[:64].cpu())
        groups = [p.group for p in prompts for _ in range(n)]
        B = len(groups)
        return SampleBatch(step, groups, [weights.version] * B, [weights.version] * B,
                           {"latents": out["latents"].cpu(), "logprob": out["logprob"].cpu(),
                            "prompt": [p.text for p in prompts for _ in range(n)],
                            "meta": [dict(p.meta) for p in prompts for _ in range(n)]},
                           {"timesteps": self.ts.tolist(), "noise_level": self.noise_level})

    def evaluate(self, prompts: list[Prompt]) -> dict:
        raise NotImplementedError("the flow generator has no greedy evaluation: set eval_every: 0")

    def save(self, run_dir: str) -> None:
        """``samples_first.png`` and ``samples_last.png``: the first and the last batch's pictures."""
        for name, (version, images) in self.pictures.items():
            save_grid(images, Path(run_dir) / f"samples_{name}.png", f"weights version {version}")


def save_grid(images: torch.Tensor, path: Path, title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    n = images.shape[0]
    cols = min(8, n)
    rows = math.ceil(n / cols)
    grid = torch.zeros(rows * cols, *images.shape[1:])
    grid[:n] = ((images.float() + 1) / 2).clamp(0, 1)
    H, W = images.shape[2:]
    grid = grid.reshape(rows, cols, 3, H, W).permute(0, 3, 1, 4, 2).reshape(rows * H, cols * W, 3)
    fig, ax = plt.subplots(figsize=(cols * 0.6 + 0.4, rows * 0.6 + 0.6))
    ax.imshow(grid.numpy(), interpolation="nearest")
    ax.set_title(title, fontsize=8)
    ax.axis("off")
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)


def centred(images: torch.Tensor, prompts: list[str] | None = None, radius: float = 4.5) -> list[float]:
    """The share of each picture's brightness that lies within ``radius`` pixels of the frame's centre.

    A disc drawn in the middle scores ~1; the same disc off-centre less, the further out the less. It cannot
    be had without drawing something there: a frame of noise or of light spreads its brightness
    everywhere and scores the central area's share of the frame (~0.25), below a typical disc."""
    b = ((images.float() + 1) / 2).clamp(0, 1).mean(1)                 # [B, H, W], black background = 0
    H, W = b.shape[1:]
    yy, xx = torch.meshgrid(torch.arange(H, dtype=torch.float32), torch.arange(W, dtype=torch.float32), indexing="ij")
    inside = (((xx - (W - 1) / 2) ** 2 + (yy - (H - 1) / 2) ** 2) <= radius ** 2).float()
    return ((b * inside).sum((1, 2)) / (b.sum((1, 2)) + 1e-3)).tolist()


class ImageReward:
    """``reward`` backend ``image``: ``fn(images, prompts) -> [float]`` on the final images, GRPO advantages."""

    def __init__(self, ctx: NodeContext):
        self.ctx, self.options = ctx, ctx.options
        self.fn = load("rewards", self.options.fn)

    def score(self, step: int, rollout: SampleBatch) -> SampleBatch:
        images = rollout.fields["latents"][:, -1]
        rewards = [float(r) for r in self.fn(images, rollout.fields["prompt"])]
        bad = [r for r in rewards if not math.isfinite(r)]
        if bad or len(rewards) != len(rollout):
            raise ValueError(f"reward function {self.options.fn} gave {len(rewards)} rewards for {len(rollout)} "
                             f"images{' (not finite: ' + str(bad[0]) + ')' if bad else ''}")
        mean = sum(rewards) / max(len(rewards), 1)
        self.ctx.log(reward_mean=mean,
                     reward_std=math.sqrt(sum((r - mean) ** 2 for r in rewards) / max(len(rewards), 1)))
        return rollout.with_fields(reward=rewards,
                                   advantage=grpo_advantages(rewards, rollout.group_ids, self.options.normalize_std))


class Logprob:
    """``old_logprob`` backend ``flow``: fused into the update. The update takes one optimizer step per batch,
    so the proximal policy is exactly the weights of its own forward pass, which gives the transitions'
    log-probabilities under the trainer's weights with no second pass (as ``nodes.trainer.logprob`` does for
    language models)."""

    def __init__(self, ctx: NodeContext):
        self.ctx = ctx

    def logprobs(self, step: int, batch: SampleBatch) -> SampleBatch:
        batch.meta["old_logprob"] = "fused"
        return batch


class Update:
    """PPO-clip over a seeded subset of the denoising steps, one optimizer step per batch (module docstring)."""

    def __init__(self, ctx: NodeContext):
        self.ctx, self.options = ctx, ctx.options
        self.policy = FlowPolicy.of(ctx)
        opts = ctx.backend_options or UpdateOptions()
        self.fraction, self.adv_clip = opts.timestep_fraction, opts.adv_clip

    def train(self, step: int, batch: SampleBatch) -> None:
        s, pol = self.options, self.policy
        n = len(batch)
        if n == 0:
            return
        f = batch.fields
        T = f["logprob"].shape[1]
        k = max(1, round(self.fraction * T))
        steps = sorted(torch.randperm(T, generator=torch.Generator().manual_seed(self.ctx.seed + step))[:k].tolist())
        adv = torch.tensor(f["advantage"], dtype=torch.float32).clamp(-self.adv_clip, self.adv_clip).to(pol.device)
        behav = f["logprob"].to(pol.device)
        values = f["latents"][0, 0].numel()           # per transition: the log-probabilities are means over them
        pol.net.train()
        pol.opt.zero_grad(set_to_none=True)
        stats: dict[str, list[float]] = {"behav_dev": [], "clip_frac": [], "loss": [], "is_max": []}
        raws: list[torch.Tensor] = []
        for rows in micro(n, s.micro_batch_size):
            lp = pol.logprobs(batch, rows, steps)                               # [b, k]
            o, b = lp.detach(), behav[rows][:, steps]                           # proximal: these weights (fused)
            ratio = torch.exp(lp - o)
            # the importance weight is the ratio of the transitions' densities: the log-probabilities are means
            # over the image's values, so their difference times the number of values (the per-value ratio
            # stayed within 1.005 of 1 at staleness 5 and corrected nothing: the async run drifted down)
            log_w = (o - b) * values
            raws.append(log_w.flatten())
            raw = torch.exp(log_w)
            is_w = raw.clamp(max=s.is_cap)
            a = adv[rows, None]
            per = torch.maximum(-a * ratio, -a * ratio.clamp(1 - s.clip, 1 + s.clip)) * is_w
            loss = per.sum() / (n * k)
            loss.backward()
            # trainer vs sampler: on policy (staleness 0) the same weights, so 1 up to float order
            stats["behav_dev"].append(float((torch.exp(o - b) - 1).abs().max()))
            stats["clip_frac"].append(float(((ratio.detach() - 1).abs() > s.clip).float().mean()))
            stats["loss"].append(float(loss.detach()))
            stats["is_max"].append(float(is_w.max()))
        self.ctx.fault("after_backward")
        gn = torch.nn.utils.clip_grad_norm_([p for p in pol.net.parameters() if p.requires_grad], s.max_grad_norm)
        pol.opt.step()
        log_w = torch.cat(raws)
        w = torch.exp(log_w)
        # the importance weights of the trained transitions: their spread shows how far the policy moved since
        # the samples were drawn (on policy every weight is 1 up to float order)
        self.ctx.log(behav_ratio_dev_max=max(stats["behav_dev"]), clip_frac=sum(stats["clip_frac"]) / len(stats["clip_frac"]),
                     loss=sum(stats["loss"]), is_max=max(stats["is_max"]), grad_norm=float(gn), timesteps_trained=k,
                     is_mean=float(w.clamp(max=s.is_cap).mean()), is_trunc_frac=float((w > s.is_cap).float().mean()),
                     is_log_std=float(log_w.std()) if log_w.numel() > 1 else 0.0)

    def state_dict(self) -> dict:
        return {"model": self.policy.net.state_dict(), "opt": self.policy.opt.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.policy.net.load_state_dict(state["model"])
        self.policy.opt.load_state_dict(state["opt"])

    def save(self, run_dir: str) -> None:
        """The final weights in ``run_dir/final`` (loadable with ``nodes.diffusion.model.load``; with LoRA merged, and
        the adapter tensors in ``final/adapter``)."""
        if self.ctx.rank != 0:
            return
        net, out = self.policy.net, Path(run_dir) / "final"
        if self.policy.lora is None:
            flow_model.save(net, out)
            return
        from peft import get_peft_model_state_dict
        from safetensors.torch import save_file
        flow_model.save(copy.deepcopy(net).merge_and_unload(), out)        # the merged model, then its adapter
        (out / "adapter").mkdir()
        save_file({k: v.contiguous() for k, v in get_peft_model_state_dict(net).items()},
                  str(out / "adapter" / "adapter.safetensors"))


class Sync:
    """``sync`` backend ``flow``: the trainer's full weights, or its LoRA adapter tensors (``payload: lora``);
    the same mapping while the tensors are the same."""

    def __init__(self, ctx: NodeContext):
        self.policy = FlowPolicy.of(ctx)
        self.payload = ctx.options.payload
        self._tensors = None

    def state(self) -> WeightsState:
        if self._tensors is None:
            if self.payload == "lora":
                from peft import get_peft_model_state_dict
                self._tensors = get_peft_model_state_dict(self.policy.net)
            else:
                self._tensors = self.policy.net.state_dict()
        return WeightsState(self._tensors, self.payload, None)
