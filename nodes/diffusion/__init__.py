"""FlowGRPO: a flow-matching image policy in the same graph as a language model's (:mod:`.flowgrpo`: the nodes;
:mod:`.flow`: the SDE sampler and its log-probabilities; :mod:`.model`: the embedded ``tiny-flow`` model).

This module holds the flow backends' descriptors (registered under ``omnigraph.backends``), their options and
checks. It is light (no torch): the compiler reads it before anything starts.
"""

from __future__ import annotations

from pydantic import Field

from omnigraph.sdk import Backend, ConfigError, Options, Prompt
from nodes.rewards import _resolves
from nodes.trainer import _torch_sync


class SamplerOptions(Options):
    """Options of the flow generator (``nodes.<generate>.options``)."""

    steps: int = Field(10, ge=1, le=1000)
    """Denoising steps of the SDE sampler."""
    noise_level: float = Field(0.7, ge=0, le=10)
    """The SDE's noise scale (FlowGRPO's ``eta``): how far the sampler strays from the deterministic flow."""
    shift: float = Field(1.0, gt=0, le=100)
    """Timestep shift of the schedule (1.0: uniform)."""


class UpdateOptions(Options):
    """Options of the flow update (``nodes.<update>.options``)."""

    timestep_fraction: float = Field(0.6, gt=0, le=1)
    """The share of the denoising steps trained per update (a seeded subset, FlowGRPO's)."""
    adv_clip: float = Field(5.0, gt=0, le=1000)
    """Advantages are clipped to +- this."""


def _flow_generator(node, options, spec) -> list:
    out = []
    if options.eval_every:
        out.append(ConfigError("the flow generator has no greedy evaluation", where=f"nodes.{node}.eval_every",
                               fix="set eval_every: 0 (the reward of every batch is logged)"))
    if options.env is not None or options.partial is not None:
        field = "env" if options.env is not None else "partial"
        out.append(ConfigError(f"{field} is for token generators; the flow generator samples whole images",
                               where=f"nodes.{node}.{field}", fix=f"remove {field}, or use backend: hf or vllm"))
    return out


def _image_reward(node, options, spec) -> list:
    if options.fn is None or options.model is not None:
        return [ConfigError("backend image scores images with fn(images, prompts)", where=f"nodes.{node}.fn",
                            fix="set fn: centred (or your own module:function)")]
    return _resolves(node, options.fn, "fn")


GENERATE_FLOW = Backend("generate", "nodes.diffusion.flowgrpo:Generate", uses_model=True, options=SamplerOptions,
                        check=_flow_generator,
                        doc="a flow-matching image model sampled with FlowGRPO's SDE, per-step logprobs")
REWARD_IMAGE = Backend("reward", "nodes.diffusion.flowgrpo:ImageReward", check=_image_reward,
                       doc="fn(images, prompts) on the final images, GRPO advantages")
OLD_LOGPROB_FLOW = Backend("old_logprob", "nodes.diffusion.flowgrpo:Logprob", uses_model=True,
                           doc="the sampled transitions' logprobs under the trainer's weights")
UPDATE_FLOW = Backend("update", "nodes.diffusion.flowgrpo:Update", uses_model=True, options=UpdateOptions,
                      doc="FlowGRPO: PPO-clip over a subset of the denoising steps, AdamW")
SYNC_FLOW = Backend("sync", "nodes.diffusion.flowgrpo:Sync", uses_model=True, check=_torch_sync,
                    doc="the image model's full weights or LoRA adapter tensors")


class CentredDiscs:
    """The task of the embedded image model: ``prompts`` prompt groups per step, all asking for a centred disc
    (an unconditional model: the group is what GRPO normalises over)."""

    chat = False

    class Options(Options):
        """``centred_discs`` takes no options."""

    def __init__(self, prompts: int, seed: int = 0, eval_prompts: int = 0):
        self.prompts = prompts

    def batch(self, step: int) -> list[Prompt]:
        return [Prompt("a disc in the middle of the frame") for _ in range(self.prompts)]

    def eval_set(self) -> list[Prompt]:
        return []
