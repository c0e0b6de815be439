"""Agentic Mooncake sessions (Dynamo's agent simulation): see traces/importers/mooncake.py."""
from traces.importers.mooncake import PATTERNS, load_agentic as load  # noqa: F401
