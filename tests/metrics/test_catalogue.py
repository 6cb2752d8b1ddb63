"""The metric catalogue (rlgrad.metrics): key / match / parse, the generated docs, and that every key a
full-instrument run logs and every metric the README names is declared."""

import itertools
import json
import re
from pathlib import Path

import pytest

from rlgrad import metrics as M
from rlgrad.metrics import CATALOGUE, FIELDS, PLACEHOLDER, Metric, key, markdown, match, parse
from rlgrad.metrics.export import docs_page, export_markdown
from tests.conftest import REPO, tiny_overrides
from tests.helpers.readme import pages_text

# A value of every placeholder, for keys built from any template.
SAMPLE = {"bucket": "bucket_2", "term": "task", "loss": "total", "role": "critic", "component": "format",
          "pair": "correctness__format", "stat": "max", "layer": "layer_3"}


def templates_matching(keys) -> dict[str, str | None]:
    return {k: (m.template if (m := match(k)) else None) for k in keys}


# ----------------------------------------------------------------------------- key / match / parse
def test_key_fills_catalogued_templates():
    assert key("grad_norm/{bucket}/{term}", bucket="all", term="task") == "grad_norm/all/task"
    assert key("grad_norm/{bucket}/per_token/{term}", bucket="bucket_12", term="kl") == \
        "grad_norm/bucket_12/per_token/kl"
    assert key("grad_sim/{pair}", pair="correctness__format") == "grad_sim/correctness__format"
    assert key("{role}/neuron/dormant_ratio", role="critic") == "critic/neuron/dormant_ratio"
    assert key("timing_s/neuron/{role}", role="actor") == "timing_s/neuron/actor"
    assert key("response_length/{stat}", stat="min") == "response_length/min"
    assert key("rollout/accuracy") == "rollout/accuracy"
    assert key("timing_s/analysis/buckets") == "timing_s/analysis/buckets"
    assert key("grad_norm/{bucket}/{term}", bucket="all", term="my_custom_term") == \
        "grad_norm/all/my_custom_term"


def test_key_refuses_unknown_templates_and_bad_fields():
    with pytest.raises(KeyError, match=r"grad_norm/\{bucket\}/nope"):
        key("grad_norm/{bucket}/nope", bucket="all")
    with pytest.raises(KeyError, match="grad_norm/all/task"):
        key("grad_norm/all/task")  # a concrete key is not a template
    with pytest.raises(ValueError, match="bucket"):
        key("grad_norm/{bucket}/{term}", bucket="bucket_x", term="task")
    with pytest.raises(ValueError, match="bucket"):
        key("grad_norm/{bucket}/{term}", bucket="all/extra", term="task")  # no "/" inside a field
    with pytest.raises(ValueError, match="missing field.*term"):
        key("grad_norm/{bucket}/{term}", bucket="all")
    with pytest.raises(ValueError, match="unknown field.*role"):
        key("grad_norm/{bucket}/{term}", bucket="all", term="task", role="actor")
    with pytest.raises(ValueError, match="role"):
        key("{role}/neuron/reset_count", role="ref")
    with pytest.raises(ValueError, match="stat"):
        key("critic/score/{stat}", stat="std")
    with pytest.raises(ValueError, match="pair"):
        key("grad_sim/{pair}", pair="correctness")
    with pytest.raises(ValueError):
        key("grad_norm/{bucket}/{term}", bucket="all", term=True)


def test_key_remembers_the_keys_it_filled_but_never_an_error():
    """``key`` keeps the keys of plain str / int values (the instruments fill the same ones every step); True, equal
    to 1 and hashed alike, is never taken for 1, and a refused key is refused at every call."""
    first = key("grad_norm/{bucket}/{term}", bucket="all", term="task")
    assert key("grad_norm/{bucket}/{term}", bucket="all", term="task") is first  # remembered, not formed again
    assert key("grad_norm/{bucket}/{term}", bucket="all", term=1) == "grad_norm/all/1"
    for _ in range(2):
        with pytest.raises(ValueError, match="must be a str or an int"):
            key("grad_norm/{bucket}/{term}", bucket="all", term=True)
        with pytest.raises(ValueError, match="bucket"):
            key("grad_norm/{bucket}/{term}", bucket="bucket_x", term="task")
        with pytest.raises(ValueError, match="missing field"):
            key("grad_norm/{bucket}/{term}", bucket="all")


def test_match_finds_the_most_specific_entry():
    assert match("grad_norm/bucket_3/task").template == "grad_norm/{bucket}/{term}"
    assert match("grad_norm/all/sample_count").template == "grad_norm/{bucket}/sample_count"
    assert match("grad_norm/all/reward_std_max").template == "grad_norm/{bucket}/reward_std_max"
    assert match("grad_norm/all/loss/total").template == "grad_norm/{bucket}/loss/{loss}"
    assert match("grad_norm_prefilter/bucket_1/per_sample/entropy").template == \
        "grad_norm_prefilter/{bucket}/per_sample/{term}"
    assert match("grad_comp/total/norm").template == "grad_comp/total/norm"
    assert match("grad_comp/format/norm").template == "grad_comp/{component}/norm"
    assert match("actor/grad_norm").template == "actor/grad_norm"
    assert match("actor/grad_norm/kl").template == "actor/grad_norm/{term}"
    assert match("actor/neuron/nullspace_ratio").template == "{role}/neuron/nullspace_ratio"
    assert match("grad_norm/group_rv_table").template == "grad_norm/group_rv_table"
    m = match("val/accuracy")
    assert isinstance(m, Metric) and m.group == "validation" and m.meaning


@pytest.mark.parametrize("k", ["grad_norm/bucket_x/task", "grad_norm/all", "grad_norm/all/loss/a/b",
                               "ref/neuron/dormant_ratio", "critic/score/median", "timing_s/unknown", "", "val",
                               "rollout/accuracy/", "grad_norm/all/task/extra", "grad_sim/format"])
def test_a_key_matching_no_template_gives_none(k):
    assert match(k) is None


def test_parse_reads_the_fields_back():
    assert parse("grad_norm/{bucket}/{term}", "grad_norm/bucket_4/entropy") == {"bucket": "bucket_4",
                                                                                 "term": "entropy"}
    assert parse("grad_sim/{pair}", "grad_sim/correctness__format") == {"pair": "correctness__format"}
    assert parse("{role}/param/zero_grad_ratio", "actor/param/zero_grad_ratio") == {"role": "actor"}
    assert parse("rollout/accuracy", "rollout/accuracy") == {}
    assert parse("grad_norm/{bucket}/{term}", "grad_norm_prefilter/all/task") is None
    assert parse("grad_norm/{bucket}/{term}", "grad_norm/all/sample_count") is None  # another entry's key
    assert parse("grad_comp/{component}/norm", "grad_comp/total/norm") is None
    assert parse("val/accuracy", "val/score/mean") is None
    with pytest.raises(KeyError):
        parse("grad_norm/{bucket}/nope", "grad_norm/all/nope")


def test_every_template_is_reachable_and_unambiguous():
    """A key built from any template matches that template, and no other equally specific one."""
    for m in CATALOGUE:
        k = key(m.template, **{f: SAMPLE[f] for f in m.fields})
        hits = [x for x in CATALOGUE if x.regex.fullmatch(k)]
        best = max(x.specificity for x in hits)
        assert [x.template for x in hits if x.specificity == best] == [m.template], k
        assert parse(m.template, k) == {f: SAMPLE[f] for f in m.fields}
    assert len({m.template for m in CATALOGUE}) == len(CATALOGUE)
    assert all(m.group in M.GROUPS and m.meaning.strip() and "\n" not in m.meaning for m in CATALOGUE)
    assert set(M.FIELD_MEANINGS) == set(FIELDS)


def test_a_placeholder_not_in_fields_is_refused():
    with pytest.raises(ValueError, match="nope"):
        Metric("grad_norm/{nope}", "meaning")
    with pytest.raises(ValueError):
        Metric("grad_norm/{bucket}/{bucket}", "meaning")
    with pytest.raises(ValueError):
        Metric("grad_norm/{bucket", "meaning")


def test_the_announced_timing_keys_are_declared():
    for k in ("timing_s/analysis/buckets", "timing_s/analysis/components", "timing_s/neuron/actor",
              "timing_s/neuron/critic", "timing_s/gen", "timing_s/step"):
        assert match(k) is not None, k


# ----------------------------------------------------------------------------- docs
def test_docs_metrics_md_is_the_generated_markdown():
    text = markdown()
    assert (REPO / "docs" / "metrics.md").read_text() == docs_page() == text + export_markdown(), \
        "docs/metrics.md is stale: rlgrad metrics --format markdown > docs/metrics.md"
    assert text.startswith("# Metrics\n")
    for m in CATALOGUE:
        assert f"| `{m.template}` |" in text
    assert text.count("| key | meaning |") == len({m.group for m in CATALOGUE})


# ----------------------------------------------------------------------------- a full-instrument run
def logged_keys(run: Path) -> set[str]:
    keys: set[str] = set()
    for line in (run / "metrics.jsonl").read_text().splitlines():
        if line.strip():
            keys |= set(json.loads(line)["data"])
    return keys


def test_every_key_of_a_full_instrument_run_is_declared(model_cache, tmp_path):
    from rlgrad.cli import main

    grpo, gae = tmp_path / "grpo", tmp_path / "gae"
    assert main(["train", *tiny_overrides(model_cache, grpo), "trainer.total_training_steps=2",
                 "trainer.test_freq=1", "trainer.gradient_analysis_every=1",
                 "trainer.gradient_analysis_log_prefilter=true", "analysis.components_every=1",
                 "analysis.save_component_gradients=true", "actor.redo_metric_freq=1",
                 "actor.redo_reset_freq=1", "actor.entropy_coeff=0.01", "actor.use_kl_loss=true",
                 "analysis.per_sample.every=1"]) == 0
    assert main(["train", *tiny_overrides(model_cache, gae), "trainer.total_training_steps=2",
                 "algorithm.adv_estimator=gae", "trainer.gradient_analysis_every=1",
                 "critic.redo_metric_freq=1", "critic.redo_reset_freq=1", "actor.redo_metric_freq=1",
                 "analysis.per_sample.every=1"]) == 0
    keys = {"grpo": logged_keys(grpo), "gae": logged_keys(gae)}
    unmatched = sorted(f"{run}: {k}" for run, ks in keys.items() for k, t in templates_matching(ks).items()
                       if t is None)
    assert not unmatched, "logged keys missing from rlgrad.metrics.CATALOGUE:\n  " + "\n  ".join(unmatched)
    # each in a group that names the setting that logs it (doctor --explain, docs/metrics.md)
    assert all(M.setting_of(k) for ks in keys.values() for k in ks)
    # the runs did exercise the instruments (the check above is not vacuous)
    seen = {t for ks in keys.values() for t in templates_matching(ks).values()}
    assert {"grad_norm/{bucket}/{term}", "grad_norm_prefilter/{bucket}/{term}", "grad_comp/total/norm",
            "grad_comp/save_failures", "{role}/neuron/dormant_ratio", "{role}/neuron/reset_count",
            "actor/kl_loss", "critic/vf_loss", "critic/values/{stat}", "timing_s/neuron/{role}",
            "val/accuracy"} <= seen
    # each instrument logs its own time
    assert {"timing_s/analysis/buckets", "timing_s/analysis/components", "timing_s/neuron/actor"} <= keys["grpo"]
    assert {"timing_s/neuron/critic", "timing_s/analysis/buckets"} <= keys["gae"]
    assert {"actor/neuron/dormant_ratio", "critic/neuron/dormant_ratio"} <= keys["gae"]
    # each run directory describes its keys for other tools: every key it logged is an entry's regex
    for run in (grpo, gae):
        regexes = [e["regex"] for e in json.loads((run / "metrics_catalogue.json").read_text())["metrics"]]
        assert all(any(re.fullmatch(rx, k) for rx in regexes) for k in keys[run.name])


# ----------------------------------------------------------------------------- the README
def _expand(text: str) -> list[str]:
    """The alternatives a README mention spells: ``{a,b,c}`` brace lists and ``a|b`` words."""
    m = re.search(r"\{([^{}]*,[^{}]*)\}", text)
    if m:
        return [x for alt in m.group(1).split(",")
                for x in _expand(text[:m.start()] + alt.strip() + text[m.end():])]
    segments = [seg.split("|") for seg in text.split("/")]
    return ["/".join(p) for p in itertools.product(*segments)]


def _segment_fits(mention: str, template_seg: str) -> bool:
    """``*`` fits anything; a segment with a placeholder fits a template segment with one; a literal must
    be a value of the template segment."""
    if mention == "*":
        return True
    has_placeholder = PLACEHOLDER.search(template_seg) is not None
    if "{" in mention:
        return has_placeholder
    parts = PLACEHOLDER.split(template_seg)
    rx = "".join(re.escape(p) if i % 2 == 0 else f"(?:{FIELDS[p]})" for i, p in enumerate(parts))
    return re.fullmatch(rx, mention) is not None


def fits_catalogue(mention: str) -> bool:
    """A README mention fits if each alternative it spells is (an instance of) a catalogue template."""
    mention = re.sub(r"<([A-Za-z_][A-Za-z0-9_]*)>", r"{\1}", mention)  # <x> -> {x}
    for alt in _expand(mention):
        segs = alt.split("/")
        if not any(len(t) == len(segs) and all(_segment_fits(s, ts) for s, ts in zip(segs, t))
                   for t in (m.template.split("/") for m in CATALOGUE)):
            return False
    return True


def readme_metric_mentions(text: str) -> list[str]:
    """Backticked spans of the README (outside code blocks) whose first segment is a catalogue prefix."""
    prefixes = {m.template.split("/")[0] for m in CATALOGUE}
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    out = []
    for span in re.findall(r"`([^`\n]+)`", text):
        first = re.sub(r"<([A-Za-z_][A-Za-z0-9_]*)>", r"{\1}", span).split("/")[0]
        if "/" in span and first in prefixes:
            out.append(span)
    return out


def test_readme_check_helpers():
    assert fits_catalogue("grad_norm/{bucket}/{task,entropy,kl}")
    assert fits_catalogue("grad_norm/all/{sample_count,sample_pct,reward_std_mean}")
    assert fits_catalogue("reward/<c>/mean|std") and fits_catalogue("critic/values/*")
    assert fits_catalogue("<role>/neuron/dormant_ratio") and fits_catalogue("grad_sim/<a>__<b>")
    assert not fits_catalogue("grad_norm/B/task") and not fits_catalogue("critic/nope")
    assert not fits_catalogue("grad_norm/{bucket}/{task,nope/x}")
    text = "a `grad_norm/x/y` b `rollout.n` `analysis/step_N/x.json` `<role>/param/z`\n```\n`val/a`\n```"
    assert readme_metric_mentions(text) == ["grad_norm/x/y", "<role>/param/z"]


def test_every_metric_the_readme_names_is_declared():
    mentions = readme_metric_mentions(pages_text())  # the README and its reference pages
    assert len(mentions) > 10
    unfit = [x for x in mentions if not fits_catalogue(x)]
    assert not unfit, "README metric mentions that match no rlgrad.metrics template:\n  " + "\n  ".join(unfit)


def test_component_keys_escape_any_name_into_distinct_splittable_keys():
    """Any string a trainer names a reward with (TRL: a function's ``__name__``, a reward model's repo) becomes a
    ``{component}`` key; the keys are distinct, never hold ``__`` or an end ``_`` (so ``grad_sim/<a>__<b>``
    splits back), leave a name that is already a key alone, and follow the documented rule."""
    import random

    assert M.component_keys(["tiny-Qwen2ForSequenceClassification-2.5", "len-score", "len.score", "len_score_2",
                             "total", "<lambda>", "<lambda>", "", "__x__", "a__b", "correctness"]) == [
        "tiny_Qwen2ForSequenceClassification_2_5", "len_score", "len_score_3", "len_score_2", "total_2", "lambda",
        "lambda_2", "reward", "x", "a_b", "correctness"]
    rng = random.Random(0)
    alphabet = "ab_-./ 2é√<>"
    nice = re.compile(r"[A-Za-z0-9]+(_[A-Za-z0-9]+)*")
    for _ in range(300):
        names = ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 6))) for _ in range(rng.randint(1, 6))]
        keys = M.component_keys(names)
        assert len(keys) == len(names) and len(set(keys)) == len(keys) and "total" not in keys, (names, keys)
        for i, (n, k) in enumerate(zip(names, keys)):
            assert nice.fullmatch(k), (n, k)
            key("grad_comp/{component}/norm", component=k)  # accepted by the catalogue
            if nice.fullmatch(n) and n != "total" and n not in keys[:i]:  # a key already, not taken before it
                assert k == n, (names, keys)
        for a, b in itertools.combinations(keys, 2):
            assert parse("grad_sim/{pair}", key("grad_sim/{pair}", pair=f"{a}__{b}"))["pair"].split("__") == [a, b]
