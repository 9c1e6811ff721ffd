"""Workflows: deterministic orchestration only, no I/O."""
