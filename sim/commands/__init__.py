"""The `sim run`, `sim sweep` and `sim profile` commands (agentsim/cli.py dispatches)."""
