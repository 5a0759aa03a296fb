"""Environments for multi-turn episodes (omnigraph.environments): built-in tools, verifiers' environments."""
