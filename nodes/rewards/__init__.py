"""Rewards (role scorer): rule-based functions, GRPO advantages, reward models."""
