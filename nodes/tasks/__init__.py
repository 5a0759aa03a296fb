"""Prompt sources (omnigraph.tasks): procedural tasks, files and saved datasets, reasoning-gym."""
