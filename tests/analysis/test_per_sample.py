"""Per-sample gradient norms and the noise metrics (``analysis/per_sample.py``, ``analysis/rows.py``) against plain
autograd, one backward per row (``tests.helpers.per_row``), and against answers known by construction."""

from __future__ import annotations

import collections
import math

import pytest
import torch

from rlgrad.algos.aggregation import denominator
from rlgrad.algos.objective import LossSettings, as_loss_fn
from rlgrad.analysis.buckets import analyse_buckets
from rlgrad.analysis.groups import group_pass
from rlgrad.analysis.noise import group_noise
from rlgrad.analysis.per_sample import (
    _ranks,
    analyse_per_sample,
    layer_summary,
    proxy_correlation,
    verl_variance_proxy,
)
from rlgrad.analysis.rows import embedding_row_sq, ghost_is_cheaper, linear_row_sq
from rlgrad.batch import Batch, position_ids_from_mask
from tests.helpers.batches import SETTINGS, make_batch
from tests.helpers.per_row import per_row_gradients

TOL = 1e-5


def _llama(tok):
    """A tiny Llama with UNTIED embeddings and a padding_idx (the char tokenizer pads on the left)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=40, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=2, tie_word_embeddings=False,
                      pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, bos_token_id=None)
    torch.manual_seed(5)
    return LlamaForCausalLM(cfg).eval()


def _gpt_neo(tok):
    """GPT-2's layout in nn.Linear (GPT-2 itself uses Conv1D): tied wte, learned positions wpe, LayerNorm with bias,
    biased projections."""
    from transformers import GPTNeoConfig, GPTNeoForCausalLM

    cfg = GPTNeoConfig(vocab_size=len(tok), hidden_size=32, num_layers=2, num_heads=2, max_position_embeddings=64,
                       attention_types=[[["global", "local"], 1]], window_size=8, embed_dropout=0.0,
                       attention_dropout=0.0, resid_dropout=0.0, eos_token_id=tok.eos_token_id,
                       bos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    torch.manual_seed(6)
    return GPTNeoForCausalLM(cfg).eval()


@pytest.fixture(scope="module", params=["qwen2", "llama", "gpt_neo"])
def model_batch(request, model_tok):
    qwen, tok = model_tok
    model = {"qwen2": lambda: qwen, "llama": lambda: _llama(tok), "gpt_neo": lambda: _gpt_neo(tok)}[request.param]()
    # one batch (sampled from Qwen2) for every model: same token ids
    return request.param, model, make_batch(qwen, tok, n_prompts=3)


def _relative(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.double() - want).abs().max() / want.abs().max().clamp_min(1e-30))


@pytest.mark.parametrize("settings", SETTINGS, ids=[f"{s.loss_agg_mode}-{s.policy_loss}" for s in SETTINGS])
def test_per_sample_norms_equal_per_row_autograd(model_batch, settings):
    """Every loss_agg_mode and term on Qwen2 (tied, padding_idx); two of them on Llama (untied, padding_idx) and
    GPT-Neo (tied, learned positions, LayerNorm and biases)."""
    name, model, batch = model_batch
    if name != "qwen2" and settings not in (SETTINGS[0], SETTINGS[3]):
        pytest.skip("the other aggregation modes run on qwen2")
    rep = analyse_per_sample(model, batch, settings, num_buckets=3)
    oracle = per_row_gradients(model, batch, as_loss_fn(settings))
    assert set(rep.norms) == set(oracle)
    for term, grads in oracle.items():
        want = grads.norm(dim=1)
        assert _relative(rep.norms[term], want) <= TOL, term
        # the layer groups split the squared norm
        assert _relative(sum(v.double() ** 2 for v in rep.layer_norms[term].values()), want ** 2) <= TOL
        # Σ_i g_i is the batch gradient: the groups' Gram sums to the bucket analysis' `all` norm²
        total = sum(rep.group_gram[term].values()).sum()
        assert abs(float(total) - float(grads.sum(0).norm()) ** 2) <= TOL * float(grads.sum(0).norm()) ** 2


def test_layer_norms_match_the_oracle_per_layer_group(model_tok):
    model, tok = model_tok
    batch = make_batch(model, tok)
    rep = analyse_per_sample(model, batch, SETTINGS[0], num_buckets=2)
    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    grads = per_row_gradients(model, batch, as_loss_fn(SETTINGS[0]))["task"]
    from rlgrad.metrics import layer_group

    sizes = [p.numel() for _, p in params]
    per_group: dict[str, torch.Tensor] = {}
    for (name, _), block in zip(params, grads.split(sizes, dim=1)):
        g = layer_group(name)
        per_group[g] = per_group.get(g, 0) + block.pow(2).sum(1)
    per_group_sum: dict[str, torch.Tensor] = {}  # Σ_i g_i on each layer group's parameters
    for (name, _), block in zip(params, grads.split(sizes, dim=1)):
        g = layer_group(name)
        per_group_sum[g] = per_group_sum.get(g, 0) + block.sum(0).pow(2).sum()
    summary = layer_summary(rep)["task"]  # sample_layers.json
    assert set(summary) == set(per_group)
    for g, want in per_group.items():
        assert _relative(rep.layer_norms["task"][g], want.sqrt()) <= TOL, g
        assert summary[g]["grad_norm_sample"] == pytest.approx(float(want.sqrt().mean()), rel=TOL), g
        assert summary[g]["grad_norm"] == pytest.approx(float(per_group_sum[g].sqrt()), rel=TOL, abs=1e-12), g


def test_chosen_terms_on_unequal_groups_equal_per_row_autograd(model_tok):
    """``terms`` measures those terms only; groups of unequal sizes (rows out of group order) take the engine's
    per-slice path rather than the batched one of equal contiguous groups."""
    model, tok = model_tok
    full = make_batch(model, tok, n_prompts=3)
    batch = full.select([0, 5, 1, 6, 2, 8, 9, 10, 11])  # groups of 3, 2 and 4 rows, interleaved
    rep = analyse_per_sample(model, batch, SETTINGS[0], num_buckets=2, terms=["task", "kl"])
    oracle = per_row_gradients(model, batch, as_loss_fn(SETTINGS[0]))
    assert set(rep.norms) == {"task", "kl"}
    for term in rep.norms:
        assert _relative(rep.norms[term], oracle[term].norm(dim=1)) <= TOL, term
        total = float(sum(rep.group_gram[term].values()).sum())
        assert abs(total - float(oracle[term].sum(0).norm()) ** 2) <= TOL * float(oracle[term].sum(0).norm()) ** 2


def _formulas(h: torch.Tensor, groups: torch.Tensor) -> dict[str, float]:
    """The noise estimates written directly on per-sample gradient vectors ``h [n, d]`` (docs/noise_scale.md), the
    prompt groups as the units: |G|² from the inner products of distinct groups' sums, one pair at a time."""
    n = len(h)
    ids = torch.unique(groups)
    sums = [h[groups == k].sum(0) for k in ids]
    sizes = [float((groups == k).sum()) for k in ids]
    pairs = [(a, b) for a in range(len(ids)) for b in range(len(ids)) if a != b]
    signal = sum(float(sums[a] @ sums[b]) for a, b in pairs) / sum(sizes[a] * sizes[b] for a, b in pairs)
    trace = n * (float(h.mean(0).pow(2).sum()) - signal)
    within = sum(float((h[groups == k] - sums[j] / sizes[j]).pow(2).sum()) for j, k in enumerate(ids)) / (n - len(ids))
    return {"trace": trace, "signal": signal, "intra": within, "inter": (trace - within) * len(ids) / n,
            "coherence": float(h.sum(0).pow(2).sum()) / (n * float(h.pow(2).sum())),
            "coherence_floor": sum(float(s.pow(2).sum()) for s in sums) / (n * float(h.pow(2).sum()))}


@pytest.mark.parametrize("settings", [SETTINGS[0], SETTINGS[1]], ids=["token-mean", "seq-mean-token-mean"])
def test_noise_metrics_equal_the_formulas_on_oracle_gradients(model_tok, settings):
    model, tok = model_tok
    batch = make_batch(model, tok, n_prompts=4, zero_group=False)  # two buckets of two groups
    rep = analyse_per_sample(model, batch, settings, num_buckets=2)
    loss_fn = as_loss_fn(settings)
    oracle = per_row_gradients(model, batch, loss_fn)
    _, share = loss_fn.agg.weights(batch.response_mask)
    for b, rows in rep.buckets.rows.items():
        scale = len(rows) * denominator(float(share.sum())) / denominator(float(share[rows].sum()))
        for term, grads in oracle.items():
            want = _formulas(grads[rows] * scale, batch.group_ids[rows])
            for name, value in want.items():
                got = rep.metrics[f"{name if name.startswith('coherence') else 'noise_' + name}/{b}/{term}"]
                assert got == pytest.approx(value, rel=1e-4, abs=1e-12 * abs(want["trace"])), (b, term, name)
            groups = len(torch.unique(batch.group_ids[rows]))
            assert rep.metrics[f"noise_groups/{b}"] == groups
            b_simple = rep.metrics[f"noise_scale/{b}/{term}"]
            if groups < 3:  # too few groups for an interval: the noise scale is unresolved
                assert math.isnan(b_simple)
            elif math.isfinite(b_simple):
                assert rep.metrics[f"noise_scale_low/{b}/{term}"] <= b_simple <= \
                    rep.metrics[f"noise_scale_high/{b}/{term}"]


def test_bucket_gradient_is_the_mean_of_the_per_sample_gradients(model_tok):
    """noise_signal + noise_trace / n = ||h̄||² = grad_norm/{bucket}/{term}² of the bucket analysis."""
    model, tok = model_tok
    batch = make_batch(model, tok)
    rep = analyse_per_sample(model, batch, SETTINGS[0], num_buckets=3)
    buckets = analyse_buckets(model, batch, SETTINGS[0], num_buckets=3)
    for b, rows in rep.buckets.rows.items():
        for term in rep.norms:
            norm = buckets.metrics[f"grad_norm/{b}/{term}"]
            trace, signal = rep.metrics[f"noise_trace/{b}/{term}"], rep.metrics[f"noise_signal/{b}/{term}"]
            if len(torch.unique(batch.group_ids[rows])) < 2:  # one group: no pair of groups to estimate |G|² from
                assert math.isnan(signal) and math.isnan(trace)
            elif norm > 0:
                assert signal + trace / len(rows) == pytest.approx(norm ** 2, rel=1e-5)
            # RAGEN's per-sample norm (||Σ g_i|| / n) never exceeds the mean per-sample norm
            assert buckets.metrics[f"grad_norm/{b}/per_sample/{term}"] <= \
                rep.metrics[f"grad_norm_sample/{b}/{term}"] * (1 + 1e-6)


def _repeated(batch: Batch, row: int, n: int, signs: torch.Tensor | None = None) -> Batch:
    """``n`` copies of one row in two groups; with ``signs`` its advantages multiplied row by row."""
    out = batch.select(torch.full((n,), row, dtype=torch.long))
    out.group_ids = torch.arange(n) // (n // 2)
    out.reward_std = torch.ones(n)
    if signs is not None:
        out.advantages = out.advantages * signs[:, None].to(out.advantages.dtype)
    return out


def test_coherence_known_by_construction(model_tok):
    model, tok = model_tok
    batch = make_batch(model, tok, zero_group=False)
    row = int(batch.advantages.abs().sum(1).argmax())
    on_policy = LossSettings(loss_agg_mode="seq-mean-token-mean", entropy_coeff=0.0, use_kl_loss=False)
    same = analyse_per_sample(model, _repeated(batch, row, 4), on_policy, num_buckets=1)
    assert same.metrics["coherence/all/task"] == pytest.approx(1.0, rel=1e-6)
    assert same.metrics["noise_trace/all/task"] == pytest.approx(0.0, abs=1e-6 * same.metrics["noise_signal/all/task"])
    cancel = analyse_per_sample(model, _repeated(batch, row, 4, torch.tensor([1.0, -1.0, 1.0, -1.0])), on_policy,
                                num_buckets=1)
    assert cancel.metrics["coherence/all/task"] == pytest.approx(0.0, abs=1e-6)
    assert math.isnan(cancel.metrics["noise_scale/all/task"])  # |G|² estimate <= 0: no noise scale
    # mutually orthogonal rows of equal norm: coherence 1/n
    n = 6
    h = torch.eye(n, dtype=torch.float64) * 3.0
    got = group_noise(h.pow(2).sum(1), h.reshape(3, 2, n).sum(1) @ h.reshape(3, 2, n).sum(1).t(),
                      torch.tensor([2, 2, 2]))
    assert got["coherence"] == pytest.approx(1 / n)
    want = _formulas(h, torch.arange(n) // 2)
    assert {k: got[k] for k in want} == pytest.approx(want)


def test_ghost_and_per_row_linear_norms_agree():
    torch.manual_seed(0)
    for tokens, fan_in, fan_out in [(3, 40, 50), (30, 4, 5)]:
        g, x = torch.randn(5, tokens, fan_out), torch.randn(5, tokens, fan_in)
        want = torch.stack([(gi.t().double() @ xi.double()).pow(2).sum() for gi, xi in zip(g, x)])
        assert ghost_is_cheaper(tokens, fan_in, fan_out) == (tokens == 3)
        assert _relative(linear_row_sq(g, x), want) <= TOL
    ids = torch.tensor([[1, 2, 1, 0], [3, 3, 3, 3]])
    g = torch.randn(2, 4, 6)
    want = torch.stack([torch.zeros(5, 6).index_add_(0, i, gi).double().pow(2).sum() for i, gi in zip(ids, g)])
    assert _relative(embedding_row_sq(g, ids, 5), want) <= TOL


def test_unsupported_model_names_the_reason(model_tok):
    model, tok = model_tok
    batch = make_batch(model, tok)
    model.extra = torch.nn.Parameter(torch.zeros(3))  # a parameter no engine hook covers
    try:
        with pytest.raises(NotImplementedError, match="does not cover parameter.*extra"):
            analyse_per_sample(model, batch, SETTINGS[0])
    finally:
        del model.extra


def test_frozen_embedding_lora_style(model_tok):
    """A frozen input embedding (LoRA's case) still gives the backward its leaf and gets no gradient itself."""
    model, tok = model_tok
    batch = make_batch(model, tok, n_prompts=2)
    frozen = [p for n, p in model.named_parameters() if "embed" in n]
    for p in frozen:
        p.requires_grad_(False)
    try:
        rep = analyse_per_sample(model, batch, SETTINGS[0], num_buckets=1)
        oracle = per_row_gradients(model, batch, as_loss_fn(SETTINGS[0]))
    finally:
        for p in frozen:
            p.requires_grad_(True)
    assert "embed" not in rep.layer_norms["task"]
    assert _relative(rep.norms["task"], oracle["task"].norm(dim=1)) <= TOL


def test_verl_proxy_is_advantage_squared_times_the_logit_score_norm(model_tok):
    """W_i = Σ_t ||∂ log π(y_t) / ∂ logits_t||² by autograd on the logits (column t's logits predict token t + 1)."""
    model, tok = model_tok
    batch = make_batch(model, tok, n_prompts=2)
    got = verl_variance_proxy(model, batch, rows_per_chunk=3)
    # and from the prompt-group pass's own forward (its LM head runs on the response columns only, rows by group)
    tapped = group_pass(model, batch, as_loss_fn(LossSettings()), proxy=True).proxy_tokens
    from_pass = verl_variance_proxy(model, batch, per_token=tapped)
    mask = batch.response_mask.float()
    for i in range(len(batch)):
        assert float(from_pass[i]) == pytest.approx(float(got[i]), rel=1e-5, abs=1e-12)
        ids, att = batch.input_ids[i:i + 1], batch.attention_mask[i:i + 1]
        logits = model(input_ids=ids, attention_mask=att, position_ids=position_ids_from_mask(att)).logits[0, :-1]
        logits = logits.detach().requires_grad_(True)
        logp = torch.log_softmax(logits, -1).gather(-1, ids[0, 1:, None]).squeeze(-1)
        (grad,) = torch.autograd.grad((logp * mask[i, 1:]).sum(), logits)
        advantage = float((batch.advantages[i] * mask[i]).sum() / mask[i].sum())
        assert float(got[i]) == pytest.approx(advantage ** 2 * float(grad.pow(2).sum()), rel=1e-5, abs=1e-12)


def test_proxy_correlation():
    x = torch.tensor([1.0, 2.0, 2.0, 5.0, 9.0])
    got = proxy_correlation(x, x.pow(3))  # monotone, not linear
    assert got["proxy_corr/spearman"] == pytest.approx(1.0)
    assert got["proxy_corr/pearson"] < 0.99
    assert proxy_correlation(x, 2 * x + 1)["proxy_corr/pearson"] == pytest.approx(1.0)
    # ties take their mean rank
    y = torch.tensor([0.0, 3.0, 3.0, 3.0, 1.0])
    keep = y > 0  # the sample with a zero gradient is left out
    ranks_x, ranks_y = torch.tensor([0.5, 0.5, 2, 3]), torch.tensor([2, 2, 2, 0.0])
    want = torch.corrcoef(torch.stack([ranks_x, ranks_y]))[0, 1]
    got = proxy_correlation(x[keep], y[keep])
    assert proxy_correlation(x, y)["proxy_corr/spearman"] == pytest.approx(float(want)) == got["proxy_corr/spearman"]
    assert proxy_correlation(x, y)["proxy_corr/samples"] == 4


def test_the_proxy_correlation_leaves_out_tied_zeros_and_has_a_null():
    """Half the samples with a zero gradient and a zero proxy (zero-variance groups) and an uninformative proxy on
    the others: over every sample Spearman reads about 0.6 (what the construction gives); over the non-zero samples,
    about 0, inside the shuffled null."""
    torch.manual_seed(0)
    norms = torch.cat([torch.zeros(50), torch.rand(50) + 0.1])
    proxy = torch.cat([torch.zeros(50), torch.rand(50) + 0.1])  # independent of the norms
    got = proxy_correlation(proxy, norms)
    assert got["proxy_corr/samples"] == 50
    assert abs(got["proxy_corr/spearman"]) < got["proxy_corr/spearman_null95"] < 0.4
    everything = torch.corrcoef(torch.stack([_ranks(proxy), _ranks(norms)]))[0, 1]
    assert everything > 0.5  # what the tied zeros give an uninformative proxy
    informative = proxy_correlation(norms + 0.01 * torch.rand(100), norms)
    assert informative["proxy_corr/spearman"] > 0.9 > informative["proxy_corr/spearman_null95"]


def test_the_proxy_correlations_null_is_the_95th_percentile_over_its_shuffles():
    """``proxy_corr/spearman_null95`` is the 95th percentile of |Spearman| of the proxy's ranks shuffled by each row
    of ``null_permutations`` against the norms' ranks (each correlation by torch.corrcoef here); every row is a
    permutation, the rows differ, and a later step of the same size reuses them."""
    from rlgrad.analysis.per_sample import NULL_SHUFFLES, _kept_shuffles, null_permutations

    torch.manual_seed(3)
    proxy, norms = torch.rand(40), torch.rand(40) + 0.1
    perms = null_permutations(40)
    kept = _kept_shuffles(40)
    assert perms.shape == (NULL_SHUFFLES, 40) and perms.dtype == torch.long
    assert torch.equal(null_permutations(40), perms)
    for n in range(8, 129, 8):  # the embedded default's 16 sample counts (a multiple of 8 samples per prompt)
        null_permutations(n)
    assert _kept_shuffles(40) is kept  # still kept after them: not drawn again
    assert torch.equal(perms.sort(1).values, torch.arange(40).expand(NULL_SHUFFLES, -1))
    assert len({tuple(row.tolist()) for row in perms}) > 0.99 * NULL_SHUFFLES
    order = torch.sort(proxy.double(), stable=True).indices  # proxy_correlation's canonical order
    order = order[torch.sort(norms.double()[order], stable=True).indices]
    ranks_p, ranks_n = _ranks(proxy.double()[order]), _ranks(norms.double()[order])
    each = torch.stack([torch.corrcoef(torch.stack([ranks_p[row], ranks_n]))[0, 1].abs() for row in perms])
    got = proxy_correlation(proxy, norms)["proxy_corr/spearman_null95"]
    assert got == pytest.approx(float(torch.quantile(each, 0.95)), rel=1e-12)


def test_the_bucket_analysis_and_the_per_sample_norms_share_one_pass_at_a_step_both_run(model_tok, tmp_path):
    """hooks_from_config: at a step both instruments run at, the bucket analysis runs the prompt-group pass and the
    per-sample norms take it (no forward of their own, verl's proxy included); each instrument's metrics are those
    it computes alone."""
    from rlgrad.analysis import hooks_from_config
    from rlgrad.analysis.buckets import GradientAnalysisHook
    from rlgrad.analysis.per_sample import PerSampleHook
    from rlgrad.config.load import load_config
    from rlgrad.hooks import StepContext

    model, tok = model_tok
    b = make_batch(model, tok)
    s = LossSettings(entropy_coeff=0.01, use_kl_loss=True, kl_loss_coef=0.1)
    cfg = load_config(overrides=["analysis.buckets.every=2", "analysis.per_sample.every=2",
                                 "analysis.buckets.num_buckets=3", "analysis.per_sample.terms=[task,kl]",
                                 "analysis.per_sample.proxy_corr=true"])  # verl's proxy from the same forward
    buckets, per_sample = hooks_from_config(cfg)
    assert isinstance(buckets, GradientAnalysisHook) and isinstance(per_sample, PerSampleHook)
    assert buckets.shared is per_sample.shared is not None
    forwards = []
    handle = model.register_forward_hook(lambda *a: forwards.append(1))
    try:
        ctx = {step: StepContext(step=step, batch=b, actor=model, optimizer=None, loss_settings=s, config=cfg,
                                 run_dir=tmp_path) for step in (1, 2)}
        got = {**buckets.before_update(ctx[1]).metrics, **per_sample.before_update(ctx[1]).metrics}
        assert len(forwards) == 1  # one pass for both
        kept = buckets.shared.kept[2]  # every term's groups' Gram (the buckets'), row norms of the per-sample terms
        assert set(kept.grams) == {"task", "entropy", "kl"} and set(kept.rows) == {"task", "kl"}
        assert buckets.before_update(ctx[2]) is None and per_sample.before_update(ctx[2]) is None
    finally:
        handle.remove()
    alone = {**analyse_buckets(model, b, s, num_buckets=3).metrics,
             **analyse_per_sample(model, b, s, num_buckets=3, terms=["task", "kl"], proxy=True).metrics}
    measured = [k for k in got if not k.startswith(("timing_s/", "actor/"))]
    assert set(measured) == set(alone)
    for k in measured:
        assert got[k] == pytest.approx(alone[k], rel=1e-5, abs=1e-12, nan_ok=True), k


def test_the_nulls_shuffles_are_uniform_and_one_table_serves_every_sample_count():
    """``null_permutations(n)``: each of the 3! orders of 3 samples about equally often (1000 rows: 167 each, a
    binomial sd of 12); a sample count of the same power-of-2 table is the larger one's rows with the entries >= n
    left out (the same n: the same shuffles, drawn once); a count past 128 from a table of its own, still
    permutations."""
    from rlgrad.analysis.per_sample import NULL_SHUFFLES, null_permutations

    counts = collections.Counter(tuple(row) for row in null_permutations(3).tolist())
    assert len(counts) == 6 and all(117 < c < 217 for c in counts.values())
    first = collections.Counter(null_permutations(7)[:, 0].tolist())  # which sample comes first: 1/7 each
    assert len(first) == 7 and all(100 < c < 186 for c in first.values())
    big, small = null_permutations(41), null_permutations(40)
    assert torch.equal(big[big < 40].view(NULL_SHUFFLES, 40), small)
    wide = null_permutations(200)
    assert torch.equal(wide.sort(1).values, torch.arange(200).expand(NULL_SHUFFLES, -1))
