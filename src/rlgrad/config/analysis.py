"""The settings of the instruments (``analysis.*``): the bucket analysis, the reward-component geometry, neuron
health. Part of the config schema (``rlgrad.config``); the field docs are the user documentation."""

from __future__ import annotations

from dataclasses import dataclass, field

from rlgrad.config.algorithm import COMPONENT_MODES
from rlgrad.config.fields import setting as _f


@dataclass
class BucketAnalysisConfig:
    """The gradient by reward-variance bucket and loss term (RAGEN's gradient analysis): ``grad_norm/...``."""

    enable: bool = _f(True, "Probe the actor's gradient by reward-variance bucket and loss "
                      "term (no optimizer step). RAGEN: trainer.gradient_analysis_mode.")
    every: int = _f(50, "Analyse at steps 1, 1+every, 1+2·every, ... "
                    "(RAGEN's (global_steps - 1) % every == 0). RAGEN: trainer.gradient_analysis_every.", ge=1)
    num_buckets: int = _f(6, "Number of quantile buckets of prompt groups by in-group reward "
                          "std. RAGEN: actor_rollout_ref.rollout.gradient_analysis_num_buckets.", ge=1)
    bucket_mode: str = _f("quantile", "quantile (equal group counts) | quantile_nonzero (bucket_1: the groups of "
                          "zero reward std; quantiles, ties kept together, over the others) | fixed_rv ([0,1) .. "
                          "[5,inf)). RAGEN: actor_rollout_ref.rollout.gradient_analysis_bucket_mode.",
                          choices=("quantile", "quantile_nonzero", "fixed_rv"))
    env_groups: int | None = _f(None, "Analyse a separate batch of this many prompt groups (null: "
                                "the training batch). RAGEN: trainer.gradient_analysis_env_groups.", ge=1)
    group_size: int | None = _f(None, "Samples per group of the separate analysis batch (null: "
                                "rollout.n). RAGEN: trainer.gradient_analysis_group_size.", ge=1)
    log_prefilter: bool = _f(False, "Also analyse the batch before the rollout filter "
                             "(grad_norm_prefilter/...). RAGEN: trainer.gradient_analysis_log_prefilter.")
    exit_after: bool = _f(False, "Log the analysis, then stop before the actor update, checkpoint "
                          "and validation. RAGEN: trainer.exit_after_gradient_analysis.")
    save_batch: bool = _f(False, "Write analysis/step_N/batch.safetensors and "
                          "loss.json so every number can be recomputed offline.")
    save_model: bool = _f(False, "Also write the probed actor to analysis/step_N/model/ (Hugging Face format).")
    dp_trim: bool = _f(False, "RAGEN's data-parallel trimming: drop each bucket's last samples that do not divide "
                       "by trainer.nnodes x trainer.n_gpus_per_node (the number of processes under torchrun). Off: "
                       "buckets keep every sample and norms are exact global ones (no trimming is needed for that).")


@dataclass
class ComponentAnalysisConfig:
    """The gradient of each reward component (rldynamic's custom_main_ppo.py): ``grad_comp/...``, ``grad_sim/...``."""

    every: int = _f(0, "Reward-component gradient geometry (norms, cosines, shares of the policy gradient per "
                    "reward component) at steps 1, 1+every, ...; 0: off. Needs outcome advantages (grpo / rloo).", ge=0)
    mode: str = _f("shared_std", "Component advantages: shared_std (centred component reward / std of the TOTAL "
                   "reward: they sum to the update's advantage, the gradients to its policy gradient) | own_std (each "
                   "component through the advantage estimator on its own, as rldynamic's custom_main_ppo.py does).",
                   choices=COMPONENT_MODES)
    save_gradients: bool = _f(False, "Also write every component's full per-parameter gradient "
                              "to analysis/step_N/component_grads.npz (background writer).")

PER_SAMPLE_TERMS = ("task", "entropy", "kl")  # the actor loss's terms (algos.objective.ActorTerms.weighted)


@dataclass
class PerSampleConfig:
    """Per-sample gradient norms and the noise scale (``grad_norm_sample/...``, ``noise_*/...``, ``coherence/...``)."""

    every: int = _f(0, "Exact per-sample gradient norms per loss term and layer group, the noise scale B_simple "
                    "with its inter/intra-prompt split and the coherence, per bucket of the bucket analysis "
                    "(analysis.buckets.bucket_mode, num_buckets), at steps 1, 1+every, ...; 0: off. Writes "
                    "analysis/step_N/samples.jsonl. analysis.method=fast models only; under data parallel each "
                    "rank measures its own rows.", ge=0)
    terms: list[str] = _f(["task"], "The loss terms measured: task (the policy loss), entropy, kl. Each costs one "
                          "backward of the analysed batch, about one update's backward: the policy loss alone keeps an "
                          "analysed step near one update (docs/benchmarks.md); the doctor's noise-scale findings and "
                          "rlgrad samples --by grad-norm read task. Add entropy and kl to measure the regularisers' "
                          "per-sample norms too; a term the loss does not have (a zero coefficient, actor.use_kl_loss "
                          "off) is skipped.")
    write_samples: bool = _f(True, "Write analysis/step_N/samples.jsonl: one line per sample (sample, group, "
                             "bucket, reward, advantage, grad_norm/<term>), joinable with rollouts/step_N.jsonl, and "
                             "sample_layers.json (per term and layer group: the batch gradient's norm and the "
                             "mean per-sample norm).")
    proxy_corr: bool = _f(True, "Also compute verl's logit-space variance proxy (A² x W, W = Σ_t 1 - 2π(y_t) + Σπ²; "
                          "read from the engine pass's own forward at the LM head; a model without "
                          "get_output_embeddings: one more no-grad forward) and its rank and linear correlation "
                          "with the true squared per-sample task norms over the samples with a non-zero gradient, "
                          "beside a shuffled-proxy null: proxy_corr/spearman, proxy_corr/pearson, "
                          "proxy_corr/spearman_null95.")


@dataclass
class NeuronHealthConfig:
    """Neuron health of one model (gradient / activation dormancy, zero-gradient and nullspace ratios) and
    its ReDo-style reset. verl/RAGEN spellings: ``<role>.redo_metric_freq`` etc. (``actor_rollout_ref.actor.redo_*``).
    See docs/architecture.md, "Neuron health"."""

    metric_every: int = _f(0, "Neuron-health metrics at steps N, 2N, ... (redo_metric_freq's step % N == 0; 0: off): "
                           "<role>/neuron/dormant_ratio, act_dormant_ratio, zero_grad_ratio, nullspace_ratio, "
                           "<role>/param/zero_grad_ratio, and analysis/step_N/neurons.json.", ge=0)
    reset_every: int = _f(0, "Reset dormant neurons at steps N, 2N, ..., "
                          "after the optimizer step (redo_reset_freq; 0: off).", ge=0)
    tau: float = _f(0.1, "Dormancy threshold (redo_tau): neuron i is dormant when "
                    "s_i = a_i / mean_k a_k <= tau within its layer (a = mean |gradient| of its incoming weights; "
                    "for act_dormant_ratio, mean |activation| over response tokens).", ge=0)
    mode: str = _f("threshold", "Which neurons a reset takes (redo_mode): threshold (s <= tau) | percentage (the "
                   "lowest max_reset_frac of each layer) | hybrid (s <= tau, at most max_reset_frac of each layer).",
                   choices=("threshold", "percentage", "hybrid"))
    max_reset_frac: float = _f(0.1, "percentage/hybrid: fraction of a layer's neurons a reset "
                               "may take (rounded down), in [0, 1] (redo_max_reset_frac).", ge=0, le=1)
    nullspace_samples: int = _f(32, "Sequences (at most) sampled from the step's first mini-batch for the "
                                "nullspace ratio and the activation scores (0: skip both; redo_nullspace_samples).",
                                ge=0)
    nullspace_every: int = _f(1, "The sample (nullspace_ratio, act_dormant_ratio, most of neuron health's cost) at "
                              "the metric steps at least this many steps apart (rounded up to a multiple of the "
                              "metric cadence; 1: each, as verl's redo_metric_freq does); the gradient scores, which "
                              "the doctor reads, at each. With analysis.every=1, 10 keeps the gradient scores on "
                              "every step and pays for the sample on every tenth.", ge=1)
    reset_outgoing: str = _f("zero", "Outgoing weights of a reset neuron (redo_reset_outgoing): zero | small "
                             "(N(0, (0.01 x RMS of the layer's other outgoing columns)^2)).", choices=("zero", "small"))


@dataclass
class NeuronsConfig:
    actor: NeuronHealthConfig = field(default_factory=NeuronHealthConfig)
    critic: NeuronHealthConfig = field(default_factory=NeuronHealthConfig)


@dataclass
class AnalysisConfig:
    """Every instrument's settings. The instruments run at the trainer's hook points and never change training."""

    every: int | None = _f(None, "Run EVERY instrument at steps 1, 1+every, ...: the bucket analysis, the "
                           "reward-component geometry (outcome advantages only), per-sample gradients and "
                           "neuron-health metrics "
                           "of the actor (and of the critic with gae). Overrides each instrument's own "
                           "cadence and switch; resets keep theirs. null: each instrument's own setting. 1: every "
                           "step (the instruments due at one step share one engine pass; docs/instruments.md).",
                           ge=1)
    method: str = _f("fast", "Gradient engine: fast (one forward, one backward per term, "
                     "buckets by linearity) | reference (RAGEN's per-bucket passes: a "
                     "sub-batch, a forward and a backward per bucket and term).", choices=("fast", "reference"))
    buckets: BucketAnalysisConfig = field(default_factory=BucketAnalysisConfig)
    components: ComponentAnalysisConfig = field(default_factory=ComponentAnalysisConfig)
    per_sample: PerSampleConfig = field(default_factory=PerSampleConfig)
    neurons: NeuronsConfig = field(default_factory=NeuronsConfig)
