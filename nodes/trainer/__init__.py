"""The trainer (backend torch): the policy, old/ref log-probs, the PPO update, weight export (sync), FSDP2 sharding."""
