"""rlgrad's instruments inside other trainers, through their documented extension points only.

``rlgrad.integrations.trl``: TRL's ``GRPOTrainer`` (``from rlgrad.integrations.trl import GRPOTrainer``).
``rlgrad.integrations.verl``: verl's actor worker (``python -m rlgrad.integrations.verl_main`` + verl's overrides).
Each integration turns the trainer's own batch and loss into a ``Batch`` and a ``LossFn`` and runs the same
hooks rlgrad's trainer runs (``rlgrad.analysis.hooks_from_config``), writing the same run files.
"""
