"""The text formats a results table renders to, and their file suffixes. A module of its own so
that the CLI can list them without importing pandas (`orchestrate --help` stays light)."""

SUFFIXES = {"md": ".md", "csv": ".csv", "latex": ".tex"}
