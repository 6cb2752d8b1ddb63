"""The placeholders of the catalogue's templates (``grad_norm/{bucket}/{term}``): what each matches, what it
stands for, and the two rules that turn names into field values (``layer_group``, ``component_keys``).

Standard library only, so anything may import it.
"""

from __future__ import annotations

import re

# The regex each placeholder matches (whole field values; never a "/").
FIELDS: dict[str, str] = {
    "bucket": r"all|bucket_\d+",
    "term": r"[A-Za-z0-9_]+",
    "loss": r"[A-Za-z0-9_]+",
    "role": r"actor|critic",
    "component": r"[A-Za-z0-9_]+",
    "pair": r"[A-Za-z0-9_]+?__[A-Za-z0-9_]+",
    "stat": r"mean|max|min",
    "layer": r"embed|layer_\d+|final_norm|lm_head|head",
}

# What each placeholder stands for (docs/metrics.md).
FIELD_MEANINGS: dict[str, str] = {
    "bucket": "a reward-variance bucket: `all` (the whole analysed batch) or `bucket_<k>` "
              "(k = 1 holds the prompt groups of lowest reward std)",
    "term": "a loss term of the actor loss, with its coefficient: `task` (the policy loss), "
            "`entropy` (-entropy_coeff·H), `kl` (kl_loss_coef·KL), or a custom loss's term names; "
            "a term with a zero coefficient is not logged",
    "loss": "a loss value of the bucket analysis; rlgrad's actor loss: `policy`, `entropy` (H), `kl` "
            "(KL to the reference), without coefficients, and `total` = policy − entropy_coeff·entropy + "
            "kl_loss_coef·kl; a custom loss: its terms (with coefficients) and `total`",
    "role": "the trained model: `actor` or `critic`",
    "component": "a reward component of the task (`correctness`, `format`, `length`, ...: reward.weights), or "
                 "of a reward.custom_reward_function (each numeric field of its dict, and `rest`: the score less the "
                 "weighted fields), or of the shaping: `overlong` (reward.overlong_buffer) and `kl_penalty` "
                 "(algorithm.use_kl_in_reward: "
                 "−beta·Σ_t KL of the response), each with weight 1; a name from another trainer (a TRL reward "
                 "function or model) goes through `component_keys`: every run of other characters than letters "
                 "and digits becomes one `_`, none at either end, and a name whose key an earlier one (or `total`) "
                 "already has gets the first free `_2`, `_3`, ... suffix; the run keeps the original names "
                 "(`run_source.json`)",
    "pair": "two reward components `<a>__<b>`, in the task's component order",
    "stat": "`mean`, `max` or `min` over the samples or tokens named in the meaning",
    "layer": "a layer group of the model's parameters: `embed`, `layer_<i>` (decoder layer i), `final_norm`, "
             "`lm_head`, or `head` (any other parameter)",
}

# A field value that only a setting brings: named after the setting of the key's group (doctor --explain).
FIELD_SETTINGS: dict[tuple[str, str], str] = {("role", "critic"): "adv_estimator=gae"}

PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")


def layer_group(name: str) -> str:
    """The ``{layer}`` field of a parameter name: embed, layer_<i>, final_norm, lm_head (or head)."""
    m = re.search(r"\.(?:layers|h|blocks)\.(\d+)\.", name)
    if m:
        return f"layer_{int(m.group(1))}"
    if "embed" in name or ".wte." in name or ".wpe." in name:
        return "embed"
    if "lm_head" in name:
        return "lm_head"
    if "norm" in name or ".ln_f." in name:
        return "final_norm"
    return "head"


_NOT_KEY = re.compile(r"[^A-Za-z0-9]+")
RESERVED_COMPONENTS = ("total",)  # grad_comp/total/norm is the update's own gradient


def component_keys(names: list[str] | tuple[str, ...]) -> list[str]:
    """The ``{component}`` field of each of ``names`` (in order): any string becomes a distinct key.

    The rule (``FIELD_MEANINGS["component"]``): each run of characters other than ASCII letters and digits becomes
    one ``_``, with none at either end (an empty result is ``reward``). So a key never holds ``__`` and never
    starts or ends with ``_``, and ``grad_sim/<a>__<b>`` splits at its only ``__``. Where names share a key (or
    it is a reserved one, ``total``), the first keeps it and each later one gets ``<key>_<k>``, the smallest
    ``k >= 2`` that no name's key and no earlier suffix holds: the keys are distinct, and a name that is
    already a key keeps it unless an earlier name took it.
    """
    base = [_NOT_KEY.sub("_", n).strip("_") or "reward" for n in names]
    taken = set(RESERVED_COMPONENTS)
    claimed = set(base) | taken  # a suffix never takes a key some name has of its own
    out = []
    for b in base:
        k, i = b, 2
        while k in taken or (k != b and k in claimed):
            k, i = f"{b}_{i}", i + 1
        taken.add(k)
        out.append(k)
    return out
