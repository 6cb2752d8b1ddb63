"""``python -m rlgrad.metrics``: the catalogue as Markdown (docs/metrics.md's first part)."""

from rlgrad.metrics.export import markdown

print(markdown(), end="")
