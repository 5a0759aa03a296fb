"""Rollout backends (role generator): transformers (hf) and vLLM, partial rollouts and multi-turn episodes."""
