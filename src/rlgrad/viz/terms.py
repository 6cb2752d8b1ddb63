"""The report's terms: a one-line definition for each word its figures use, and the catalogue key behind it.

A section of the report lists the terms its figures and tables use (``terms_block``), each with its short
definition and a link to the page's "Terms" section (``terms_section``), which quotes the metric catalogue's
own meaning of the key (``rlgrad.metrics``, rendered as docs/metrics.md): the definition here says what the word
means to a reader, the catalogue what exactly is logged.
"""

from __future__ import annotations

import html
import os
from dataclasses import dataclass
from pathlib import Path

from rlgrad import metrics as M


@dataclass(frozen=True)
class Term:
    slug: str  # the anchor of its entry in the Terms section
    name: str  # as the figures and tables write it
    definition: str  # one line, plain words
    metric: str | None  # a concrete key of the catalogue, resolved by rlgrad.metrics.match


TERMS: dict[str, Term] = {t.slug: t for t in (
    Term("bucket", "reward-variance bucket",
         "the prompt groups sorted by the spread of their samples' rewards and cut into buckets: bucket 1 holds "
         "the lowest spread, all is the whole batch", "grad_norm/bucket_1/reward_std_mean"),
    Term("reward-std", "reward std",
         "the standard deviation of the rewards of one prompt's samples; 0 means every sample scored the same, "
         "so GRPO's advantage and the task gradient of that group are zero", "grad_norm/bucket_1/reward_std_mean"),
    Term("task-gradient", "task gradient norm",
         "the size (L2 norm over all trainable parameters) of the gradient of a bucket's own policy loss, before "
         "clipping: how hard those groups push the policy", "grad_norm/bucket_1/task"),
    Term("regulariser", "KL + entropy gradient",
         "the same for the regularising terms, kl_loss_coef·KL to the reference and −entropy_coeff·entropy",
         "grad_norm/bucket_1/kl"),
    Term("per-sample", "per sample / per token",
         "a bucket's gradient norm divided by its number of samples (or response tokens), to compare buckets "
         "of different sizes", "grad_norm/bucket_1/per_sample/task"),
    Term("layer-share", "share per layer group",
         "the fraction of a bucket's squared gradient norm held by each layer group (a row sums to 100%; "
         "n/a when the row's gradient is zero)", None),
    Term("component-share", "share of the update",
         "a reward component's projection on the update's policy gradient over that gradient's squared norm: "
         "the shares add up to 1; n/a when the update is zero", "grad_comp/correctness/share"),
    Term("component-cosine", "cosine of component gradients",
         "how the gradients of two reward components point: +1 together, 0 orthogonal, −1 against each other; "
         "n/a (zero gradient) when either has no gradient, hence no direction", "grad_sim/correctness__format"),
    Term("shared-std", "shared_std",
         "how the component analysis splits the update (analysis.components.mode, the default): each component's "
         "advantage is its weighted reward minus its group mean, over the std of the group's total reward, so the "
         "components' advantages add up to GRPO's and their gradients to the update's (own_std: each over its own "
         "std, which do not add up)", None),
    Term("dormant", "dormant (τ-score)",
         "a neuron whose gradient is small next to its layer's: the mean |gradient| of its incoming weights "
         "over the layer's mean is at most τ (GraMa)", "actor/neuron/dormant_ratio"),
    Term("act-dormant", "activation-dormant",
         "a neuron whose output is small next to its layer's: its mean |activation| over response tokens over "
         "the layer's mean is at most τ (ReDo's criterion)", "actor/neuron/act_dormant_ratio"),
    Term("zero-gradient", "zero gradient",
         "a neuron whose incoming weights got exactly no gradient this step (or, for parameters, the share of "
         "elements with none)", "actor/neuron/zero_grad_ratio"),
    Term("nullspace", "gradient null space",
         "the share of directions the sampled sequences' gradients do not span: the sequences' gradients "
         "repeat each other instead of carrying distinct information", "actor/neuron/nullspace_ratio"),
    Term("redo", "ReDo reset",
         "re-initialising dormant neurons' incoming weights (outgoing weights and optimizer moments zeroed), "
         "every reset_every steps", "actor/neuron/reset_count"),
)}

SECTION_TERMS = {  # the terms each report section's figures and tables use
    "analysis": ("bucket", "reward-std", "task-gradient", "regulariser", "per-sample", "layer-share"),
    "rewards": ("component-share", "component-cosine", "shared-std"),
    "neurons": ("dormant", "act-dormant", "zero-gradient", "nullspace", "redo"),
}

CATALOGUE_DOC = "docs/metrics.md"


def catalogue_href(page_dir: Path | None) -> str | None:
    """The metric catalogue's page in the clone rlgrad runs from (an editable install), relative to the directory
    the report is written to (``page_dir``), so that the link holds wherever the clone and its runs are moved
    together; None without that page or directory."""
    page = Path(__file__).resolve().parents[3] / CATALOGUE_DOC
    if page_dir is None or not page.is_file():
        return None
    return Path(os.path.relpath(page, Path(page_dir).resolve())).as_posix()


def terms_block(section: str) -> str:
    """The one-line definitions of a section's terms, each linked to its entry in the Terms section."""
    items = "".join(f'<li><a href="#term-{t.slug}"><b>{html.escape(t.name)}</b></a>: {html.escape(t.definition)}'
                    "</li>" for t in (TERMS[s] for s in SECTION_TERMS[section]))
    return f'<details class="terms" open><summary>Terms in this section</summary><ul>{items}</ul></details>'


def terms_section(sections: list[str], page_dir: Path | None = None) -> str:
    """The Terms section: each used term, its definition and the catalogue's meaning of the key behind it; the
    catalogue linked relative to ``page_dir``, where the report is written."""
    used = [TERMS[s] for sec in sections for s in SECTION_TERMS.get(sec, ())]
    if not used:
        return ""
    rows = []
    for t in dict.fromkeys(used):
        entry = M.match(t.metric) if t.metric else None
        logged = (f'<br><span class="muted">logged as <code>{html.escape(entry.template)}</code>: '
                  f"{html.escape(entry.meaning)}</span>" if entry else "")
        rows.append(f'<dt id="term-{t.slug}">{html.escape(t.name)}</dt><dd>{html.escape(t.definition)}{logged}</dd>')
    href = catalogue_href(page_dir)
    link = (f'<a href="{href}">{CATALOGUE_DOC}</a>' if href else f"<code>{CATALOGUE_DOC}</code> in rlgrad's "
            "repository")
    return (f'<section id="terms"><h2>Terms</h2><dl>{"".join(rows)}</dl><p class="muted">Every metric key with '
            f"its meaning: the metric catalogue, {link} (or <code>python -m rlgrad.metrics</code>).</p></section>")
