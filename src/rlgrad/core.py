"""Deprecated alias of ``rlgrad.algos`` (the RL math moved there, by topic); removed in the next release."""

from rlgrad.algos import _deprecated_alias

__getattr__ = _deprecated_alias("rlgrad.core")
