"""Everything the figures, the report and the doctor read of a run, in one package.

A run reaches them as a :class:`RunData`: metric rows by step plus a handle on the run directory (or, for a W&B
run, the tables fetched through the public API). Every file format of a run is parsed here and nowhere else, so a
format change is a one-place fix; the run directory's names are ``rlgrad.runfiles``'s, the saved config is read
through ``rlgrad.config.saved``. By concept:

    run.py       RunData, a metric's series, the buckets of a row, whether the run is unfinished
    sources.py   the loaders: rlgrad run directory, TRL output, verl log, CSV, TensorBoard, W&B
    steps.py     what the run wrote at its steps: analysis/step_N files, reward_components.jsonl, rollouts
    words.py     the readers' wording: a trainer's own names, a share of the update in words

See docs/runs.md, "The run directory".
"""

from rlgrad.rundata.run import (
    GRAD_COMPONENTS,
    LOSS_TERMS,
    PREFIX,
    ROLES,
    RunData,
    analysis_steps,
    bucket_names,
    bucket_order,
    bucket_value,
    config_get,
    has_component,
    metric_keys,
    series,
    sort_buckets,
    unfinished,
)
from rlgrad.rundata.sources import (
    guess_source,
    load_any,
    load_csv,
    load_run,
    load_tensorboard,
    load_trl_output,
    load_verl_log,
    load_wandb_run,
    read_step_metrics,
    records_from_wandb_rows,
    rows_by_name,
    run_dir_of,
    wandb_table_rows,
)
from rlgrad.rundata.steps import (
    NEURON_KEYS,
    PromptGroup,
    component_geometry,
    component_steps,
    group_buckets,
    layer_norms,
    neuron_health,
    neuron_steps,
    per_sample_layers,
    per_sample_rows,
    per_sample_steps,
    reward_components,
    rollout_dir,
    rollout_groups,
    rollout_samples,
    rollout_steps,
    rv_table,
)
from rlgrad.rundata.words import (
    label,
    layer_sort_key,
    metric_name,
    pair_label,
    share_is_fraction,
    share_label,
    share_words,
)

__all__ = [
    "GRAD_COMPONENTS", "LOSS_TERMS", "NEURON_KEYS", "PREFIX", "ROLES", "PromptGroup", "RunData", "analysis_steps",
    "bucket_names", "bucket_order", "bucket_value", "component_geometry", "component_steps", "config_get",
    "group_buckets", "guess_source", "has_component", "label", "layer_norms", "layer_sort_key", "load_any",
    "load_csv", "load_run", "load_tensorboard", "load_trl_output", "load_verl_log", "load_wandb_run", "metric_keys",
    "metric_name", "neuron_health", "neuron_steps", "pair_label", "per_sample_layers", "per_sample_rows",
    "per_sample_steps", "read_step_metrics", "records_from_wandb_rows", "reward_components", "rollout_dir",
    "rollout_groups", "rollout_samples", "rollout_steps", "rows_by_name", "run_dir_of", "rv_table", "series",
    "share_is_fraction", "share_label", "share_words", "sort_buckets", "unfinished", "wandb_table_rows",
]
