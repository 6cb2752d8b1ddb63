"""The instruments' metric groups (``rlgrad.analysis``): each instrument declared once, with its name, config
section, schedule and timing key, and the keys and run files it writes, measured at its analysis steps.

Adding an instrument: declare it here (an ``Instrument`` and its ``Group``, its timing key among the group's keys)
and add the group to ``rlgrad.metrics.keys.GROUPS``; its hook (``rlgrad.analysis.instrument.InstrumentHook``)
reads its timing key and files from here, and the doctor's ``--explain``, the report's table of when each
instrument ran and docs/metrics.md follow.
"""

from __future__ import annotations

from rlgrad.metrics.entries import Group, Instrument, Metric

BUCKETS = Instrument("bucket analysis", "analysis.buckets", schedule="buckets", every="analysis.buckets.every",
                     timing="timing_s/analysis/buckets")
PER_SAMPLE = Instrument("per-sample gradients and noise scale", "analysis.per_sample", schedule="per_sample",
                        every="analysis.per_sample.every", timing="timing_s/analysis/per_sample")
COMPONENTS = Instrument("reward-component geometry", "analysis.components", schedule="components",
                        every="analysis.components.every", timing="timing_s/analysis/components")
NEURONS = Instrument("neuron health", "analysis.neurons", schedule="neurons/{role}",
                     every="analysis.neurons.{role}.metric_every", timing="timing_s/neuron/{role}")

_ANALYSIS_EVERY = "analysis.every=N"
_BUCKETS_ON = "analysis.buckets.enable=true (at steps 1, 1+every: analysis.buckets.every=N, or analysis.every=N)"
_PROBE = ("analysis/step_N/batch.safetensors", "analysis/step_N/loss.json", "analysis/step_N/model")

BUCKET_GROUP = Group(
    "buckets", "Bucket analysis (`grad_norm/`)",
    "At analysis.buckets.every steps, on the actor at the hook point (the kept batch "
    "with its advantages, or the separate analysis batch), before the update; no optimizer "
    "step.",
    setting=_BUCKETS_ON, data="analysis", instrument=BUCKETS,
    files=("analysis/step_N/layers.json", "analysis/step_N/group_rv_table.csv", *_PROBE), metrics=(
        ("grad_norm/{bucket}/{term}",
         "L2 norm over all trainable parameters of the gradient of the bucket's aggregated term loss "
         "(with its coefficient), before clipping."),
        ("grad_norm/{bucket}/per_sample/{term}", "grad_norm/{bucket}/{term} / the bucket's sample count."),
        ("grad_norm/{bucket}/per_token/{term}",
         "grad_norm/{bucket}/{term} / the bucket's response-token count."),
        ("grad_norm/{bucket}/loss/{loss}",
         "The loss value aggregated with actor.loss_agg_mode over the bucket's samples alone."),
        ("grad_norm/{bucket}/sample_count", "Number of samples (responses) in the bucket."),
        ("grad_norm/{bucket}/sample_pct", "100 × the bucket's samples / the analysed batch's samples."),
        ("grad_norm/{bucket}/group_rv_count", "Number of prompt groups in the bucket."),
        ("grad_norm/{bucket}/group_rv_zero_count",
         "Number of the bucket's prompt groups whose reward std is 0 (every sample got the same score): the rows "
         "of analysis/step_N/group_rv_table.csv with reward_std 0. The console's zero-variance share is "
         "grad_norm/all/group_rv_zero_count / grad_norm/all/group_rv_count."),
        ("grad_norm/{bucket}/reward_std_mean",
         "Mean over the bucket's prompt groups of the group's reward std (unbiased std of its scores)."),
        ("grad_norm/{bucket}/reward_std_min", "Smallest reward std of the bucket's prompt groups."),
        ("grad_norm/{bucket}/reward_std_max", "Largest reward std of the bucket's prompt groups."),
        ("actor/loss/{loss}",
         "Copy of grad_norm/all/loss/{loss} (policy, entropy, kl, total): the bucket analysis' whole-batch "
         "loss value (analysis steps)."),
        ("actor/grad_norm/{term}",
         "Copy of grad_norm/all/{term} (task, entropy, kl): the bucket analysis' whole-batch gradient "
         "norm of the term, before clipping (analysis steps; not actor/grad_norm)."),
        Metric("trainer/exited_after_gradient_analysis",
               "1.0 at the step where the run stopped after the bucket analysis, before the actor update "
               "(analysis.buckets.exit_after, RAGEN's trainer.exit_after_gradient_analysis).",
               data="event", setting="analysis.buckets.exit_after=true (with the bucket analysis)"),
        Metric("grad_norm/group_rv_table",
               "One row per prompt group of the bucket analysis: bucket, group_id, reward_std (also "
               "analysis/step_N/group_rv_table.csv).",
               data="table"),
        Metric(BUCKETS.timing, "Seconds spent in the bucket analysis at this step (with the engine pass it shares "
               "with the other instruments due at the step when it ran that pass: docs/instruments.md).",
               data="wall_clock"),
    ))
PREFILTER_GROUP = Group(
    "prefilter", "Bucket analysis before the filter (`grad_norm_prefilter/`)",
    "The same measurements on the step's whole rollout batch before the rollout filter "
    "(advantages recomputed over it); analysis.buckets.log_prefilter=true only.",
    setting="analysis.buckets.log_prefilter=true (with the bucket analysis)", data="analysis", instrument=BUCKETS,
    files=("analysis/step_N/group_rv_table_prefilter.csv",), metrics=(
        ("grad_norm_prefilter/{bucket}/{term}",
         "grad_norm/{bucket}/{term} of the batch before the rollout filter."),
        ("grad_norm_prefilter/{bucket}/per_sample/{term}",
         "grad_norm/{bucket}/per_sample/{term} of the batch before the rollout filter."),
        ("grad_norm_prefilter/{bucket}/per_token/{term}",
         "grad_norm/{bucket}/per_token/{term} of the batch before the rollout filter."),
        ("grad_norm_prefilter/{bucket}/loss/{loss}",
         "grad_norm/{bucket}/loss/{loss} of the batch before the rollout filter."),
        ("grad_norm_prefilter/{bucket}/sample_count",
         "grad_norm/{bucket}/sample_count of the batch before the rollout filter."),
        ("grad_norm_prefilter/{bucket}/sample_pct",
         "grad_norm/{bucket}/sample_pct of the batch before the rollout filter."),
        ("grad_norm_prefilter/{bucket}/group_rv_count",
         "grad_norm/{bucket}/group_rv_count of the batch before the rollout filter."),
        ("grad_norm_prefilter/{bucket}/group_rv_zero_count",
         "grad_norm/{bucket}/group_rv_zero_count of the batch before the rollout filter."),
        ("grad_norm_prefilter/{bucket}/reward_std_mean",
         "grad_norm/{bucket}/reward_std_mean of the batch before the rollout filter."),
        ("grad_norm_prefilter/{bucket}/reward_std_min",
         "grad_norm/{bucket}/reward_std_min of the batch before the rollout filter."),
        ("grad_norm_prefilter/{bucket}/reward_std_max",
         "grad_norm/{bucket}/reward_std_max of the batch before the rollout filter."),
        Metric("grad_norm_prefilter/group_rv_table",
               "The same for the batch before the rollout filter (analysis/step_N/group_rv_table_prefilter.csv).",
               data="table"),
    ))
PER_SAMPLE_GROUP = Group(
    "per_sample", "Per-sample gradients and the noise scale (`grad_norm_sample/`, `noise_*/`, `coherence/`)",
    "At analysis.per_sample.every steps, before the update, per bucket of the bucket analysis; g_i: "
    "sample i's part of the bucket's gradient, h_i = n·g_i. Formulas, references: docs/noise_scale.md.",
    setting=f"{PER_SAMPLE.every}=N or {_ANALYSIS_EVERY}", data="analysis", instrument=PER_SAMPLE,
    files=("analysis/step_N/samples.jsonl", "analysis/step_N/sample_layers.json"), metrics=(
        ("grad_norm_sample/{bucket}/{term}", "Mean over the bucket's samples of the exact norm ||g_i|| (RAGEN's "
         "grad_norm/{bucket}/per_sample/{term} is ||Σ_i g_i|| / n: lower by the samples' cancellation)."),
        ("noise_samples/{bucket}", "Number of samples n the bucket's per-sample metrics are over."),
        ("noise_groups/{bucket}", "Number of prompt groups P the bucket's per-sample metrics are over: the "
         "independent units of the noise estimates."),
        ("noise_trace/{bucket}/{term}", "The batch gradient's noise in per-sample units, prompt groups as the units: "
         "n (||h̄||² − noise_signal), unbiased; a batch of N samples grown by prompts at the same group size has "
         "noise noise_trace / N."),
        ("noise_signal/{bucket}/{term}", "Unbiased |G|² with prompt groups as the units: Σ_{k≠l} <S_k, S_l> / "
         "(n² − Σ_k K_k²), S_k the sum of group k's h_i (the mean of <u_k, u_l> over pairs of distinct groups)."),
        ("noise_scale/{bucket}/{term}", "B_simple = noise_trace / noise_signal (McCandlish et al. 2018), in samples, "
         "for a batch grown by prompts at fixed rollout.n; NaN (unresolved) where noise_signal's 95% interval "
         "reaches 0."),
        ("noise_trace_se/{bucket}/{term}", "Standard error of noise_trace: jackknife, one prompt group left out."),
        ("noise_signal_se/{bucket}/{term}", "Standard error of noise_signal: jackknife, one prompt group left out."),
        ("noise_cov/{bucket}/{term}", "Jackknife covariance of the noise_trace and noise_signal estimates (pooling "
         "over steps and Fieller's interval need it)."),
        ("noise_scale_low/{bucket}/{term}", "Lower end of noise_scale's 95% interval (Fieller's, Student's t with "
         "P − 1 degrees of freedom); NaN when unresolved."),
        ("noise_scale_high/{bucket}/{term}", "Upper end of noise_scale's 95% interval; NaN when unresolved."),
        ("noise_intra/{bucket}/{term}", "Spread of the h_i around their prompt group's mean: Σ_k Σ_{i∈k} ||h_i − "
         "u_k||² / (n − P). Not a variance component under GRPO's zero-sum advantages (docs/noise_scale.md)."),
        ("noise_inter/{bucket}/{term}", "(noise_trace − noise_intra) / (n/P), so the batch's noise is "
         "(K·inter + intra)/n: the groups' means' spread beyond what their samples' own spread gives; negative "
         "where a group's samples cancel (zero-sum advantages)."),
        ("coherence/{bucket}/{term}",
         "||Σ_i g_i||² / (n Σ_i ||g_i||²): 1 aligned, 0 cancelling samples; compare with coherence_floor, not 1/n."),
        ("coherence_floor/{bucket}/{term}", "Σ_k ||S_k||² / (n Σ_i ||h_i||²): the coherence the batch would have if "
         "its prompt groups' gradients were orthogonal (no shared signal); 1/n only for groups of one sample."),
        ("proxy_corr/spearman", "Rank correlation of verl's logit-space variance proxy A_i²·Σ_t(1 − 2π(y_t) + Σπ²) "
         "with the true ||g_i||² of the task term, over the batch's samples whose task gradient is not 0 (a "
         "zero-variance group's samples are 0 in both: tied points that agree by construction)."),
        ("proxy_corr/pearson", "Linear (Pearson) correlation of the same two, over the same samples."),
        ("proxy_corr/samples", "Number of samples proxy_corr/spearman and proxy_corr/pearson are over: those with a "
         "non-zero task gradient."),
        ("proxy_corr/spearman_null95", "The null beside proxy_corr/spearman: the 95th percentile of |Spearman| over "
         "1,000 shuffles of the proxy among the same samples, what a proxy with no information scores."),
        Metric(PER_SAMPLE.timing, "Seconds spent in the per-sample gradient analysis at this step (with the engine "
               "pass it shares with the other instruments due at the step when it ran that pass).",
               data="wall_clock"),
    ))
COMPONENT_GROUP = Group(
    "components", "Reward-component gradient geometry (`grad_comp/`, `grad_sim/`)",
    "At analysis.components.every steps, on the kept batch before the actor update "
    "(grpo / rloo): policy-loss gradients, before clipping, no optimizer step.",
    setting=f"{COMPONENTS.every}=N or {_ANALYSIS_EVERY} (outcome advantages: adv_estimator=grpo or rloo)",
    data="analysis", instrument=COMPONENTS,
    files=("analysis/step_N/components.json", "analysis/step_N/component_grads.npz"), metrics=(
        ("grad_comp/{component}/norm",
         "L2 norm over all trainable parameters of the policy-loss gradient with the component's "
         "advantage (analysis.components.mode)."),
        ("grad_comp/{component}/share",
         "⟨g_c, g_total⟩ / |g_total|²: the component's share of the update's policy gradient (the shares "
         "sum to 1 in shared_std); absent when g_total = 0."),
        ("grad_comp/total/norm",
         "L2 norm of the update's policy gradient (shared_std: the sum of the component gradients; "
         "own_std: with the update's own advantage)."),
        Metric("grad_comp/save_failures",
               "component_grads.npz writes failed so far in this run (analysis.components.save_gradients only).",
               data="event"),
        ("grad_sim/{pair}",
         "Cosine between the policy-loss gradients of components a and b of a__b over all trainable "
         "parameters; absent when either is zero."),
        Metric(COMPONENTS.timing, "Seconds spent in the reward-component gradient analysis at this step (with the "
               "engine pass it shares with the other instruments due at the step when it ran that pass).",
               data="wall_clock"),
    ))
NEURON_GROUP = Group(
    "neurons", "Neuron health (`{role}/neuron/`, `{role}/param/`)",
    "At analysis.neurons.{role}.metric_every / reset_every steps, on the gradient of the step's "
    "first mini-batch, before clipping. A neuron is an MLP unit or an attention head.",
    setting=f"{NEURONS.every}=N or {_ANALYSIS_EVERY}", data="analysis", instrument=NEURONS,
    files=("analysis/step_N/neurons.json",), metrics=(
        ("{role}/neuron/dormant_ratio",
         "Fraction of neurons whose GraMa score (mean |gradient| of its incoming weights / its layer's "
         "mean) is <= tau."),
        ("{role}/neuron/act_dormant_ratio",
         "Fraction of neurons whose mean |activation| over the sampled sequences' response tokens / its "
         "layer's mean is <= tau (the sample's steps: nullspace_every)."),
        ("{role}/neuron/zero_grad_ratio",
         "Fraction of neurons whose incoming-weight gradient is exactly zero."),
        ("{role}/param/zero_grad_ratio",
         "Fraction of trainable parameter elements whose gradient is exactly zero (or absent)."),
        ("{role}/neuron/nullspace_ratio",
         "Fraction of eigenvalues below 1e-10·λ_max of the unit-diagonal Gram matrix of up to "
         "nullspace_samples sampled sequences' loss gradients (the sample's steps: nullspace_every)."),
        Metric("{role}/neuron/reset_count",
               "Number of neurons the ReDo-style reset re-initialised after this step's update "
               "(reset_every steps).",
               setting="analysis.neurons.{role}.reset_every=N"),
        Metric(NEURONS.timing, "Seconds spent in the neuron-health measurement of the role at this step.",
               data="wall_clock"),
    ))
