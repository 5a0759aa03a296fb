"""omnigraph's own backends, registered in its ``pyproject.toml`` exactly as a user's package registers its
own (entry-point group ``omnigraph.backends``, names ``<kind>.<backend>``).

This module is light (no torch): the compiler reads these descriptors to check
a graph; each ``impl`` is imported only on the actors that run the node.
"""

from omnigraph.sdk import Backend

GENERATE_HF = Backend("generate", "nodes.hf:Generate", uses_model=True,
                      doc="transformers generate: batched sampling with per-token logprobs")
GENERATE_VLLM = Backend("generate", "nodes.vllm_backend:VllmGenerate", uses_model=True,
                        doc="a vLLM engine in the rollout actor, weights loaded in place (extra: vllm)")
GENERATE_SYNTHETIC = Backend("generate", "nodes.synthetic:Generate", doc="stand-in work of `cost` seconds")

REWARD_PYTHON = Backend("reward", "nodes.scorer:Reward", doc="a reward function per sample, GRPO advantages")
REWARD_SYNTHETIC = Backend("reward", "nodes.scorer:Reward", doc="exact match, no function")

OLD_LOGPROB_TORCH = Backend("old_logprob", "nodes.logprob:Logprob", uses_model=True,
                            doc="the trainer's current weights (fused into a one-step update)")
REF_LOGPROB_TORCH = Backend("ref_logprob", "nodes.logprob:Logprob", uses_model=True, doc="the initial weights")
LOGPROB_SYNTHETIC = Backend("old_logprob", "nodes.synthetic:Logprob", doc="deterministic stand-in")
REF_LOGPROB_SYNTHETIC = Backend("ref_logprob", "nodes.synthetic:Logprob", doc="deterministic stand-in")

UPDATE_TORCH = Backend("update", "nodes.update:Update", uses_model=True, data_parallel=True,
                       doc="decoupled PPO, AdamW; full or LoRA; data-parallel over the pool's actors")
UPDATE_SYNTHETIC = Backend("update", "nodes.synthetic:Update", doc="stand-in work of `cost` seconds")

SYNC_TORCH = Backend("sync", "nodes.sync:Sync", uses_model=True, doc="full weights or LoRA adapter tensors")
SYNC_SYNTHETIC = Backend("sync", "nodes.synthetic:Sync", doc="the version only")
