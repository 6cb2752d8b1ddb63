"""The training loop, top to bottom.

    for step in 1..total_training_steps:
        rollout   sample rollout.n responses for data.train_batch_size prompts, score them (DAPO: in rounds
                  until that many groups carry a signal, algorithm.filter_groups)
        filter    keep prompt groups by reward variance (or another group metric)
        prepare   old log-probs, reference log-probs, (critic values,) KL in the reward, advantages
        critic    gae only: clipped value-loss epochs over mini-batches, fitting the GAE returns
        hooks     the hook point: the hooks the trainer was handed see the prepared batch, may stop the run
        update    PPO / CISPO / GSPO epochs over mini-batches (AdamW, gradient clipping; skipped during critic_warmup)
        validate  greedy accuracy on the task's validation set (every test_freq, and last)
        log       one metrics.jsonl row per step
        save      global_step_N/ checkpoint (every save_freq, and last)

``collect`` (rollout, filter, prepare), ``update_critic``, ``before_update`` and ``update_actor`` are the pieces of
``train_step``; ``probe`` (``rlgrad probe``) is ``collect`` and ``before_update`` for the step after a restored
checkpoint, with no update. The trainer knows its hooks only through ``rlgrad.hooks`` (``rlgrad.recipes``).

Metrics are logged before the checkpoint of the same step, so a resumed run never lacks a row; rows past the
resumed checkpoint are recomputed (and the stale ones moved aside).

Under torchrun (``rlgrad.distributed``) every rank draws the same prompts and rolls out a contiguous share of the
prompt groups (``shard``), with global group ids; everything a metric or a decision needs from other ranks (filter
metrics, scores, lengths, validation counts, whitening statistics) is gathered or summed, so the logged numbers,
the rollout filter's choice and the update are those of one process on the global batch. Rank 0 alone writes.
"""

from __future__ import annotations

import math
import random
import signal
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict
from pathlib import Path

import torch

from rlgrad import distributed
from rlgrad.algos.advantages import compute_advantages, group_reward_std
from rlgrad.algos.objective import CriticSettings, LossSettings, critic_loss_fn
from rlgrad.batch import Batch
from rlgrad.collectives import all_gather_cat, all_reduce_sum, is_main, rank, world_size
from rlgrad.config.algorithm import PER_TOKEN
from rlgrad.config.schema import RLGradConfig
from rlgrad.config.trainer import cpu_threads
from rlgrad.errors import UserError
from rlgrad.hooks import Hook, HookResult, HookRunner, StepContext
from rlgrad.logging.reward_signal import RewardSignalWatch
from rlgrad.logging.rewards import RewardComponentLog
from rlgrad.logging.rollouts import (
    RolloutLog,
    gather_samples,
    prompt_texts,
    sequence_advantages,
    step_samples,
)
from rlgrad.logging.sinks import MetricLogger, open_sinks, summarize, timer
from rlgrad.models import load_actor, load_critic, load_pretrained, load_value_model
from rlgrad.rl import checkpoint as ckpt
from rlgrad.rl import resume as runs
from rlgrad.rl.actor import build_optimizer, update_actor, update_size
from rlgrad.rl.batch_metrics import kept_batch_metrics
from rlgrad.rl.critic import compute_values, update_critic
from rlgrad.rl.episodes import COUNTS, EpisodeRunner, episode_metrics
from rlgrad.rl.filter import rollout_filter
from rlgrad.rl.lora import add_adapters, load_adapters
from rlgrad.rl.rollout import (
    PromptTooLong,
    check_prompt_lengths,
    check_prompt_rendering,
    compute_log_probs,
    generate,
    group_seed,
    render_prompts,
)
from rlgrad.rl.shaping import KLController, dynamic_sampling, kl_in_reward, kl_reward_share, overlong_penalty
from rlgrad.runfiles import (
    METRICS_FILE,
    checkpoint_due,
    lock_run_dir,
    read_jsonl,
    refuse_if_in_use,
    rollout_dir,
    truncate_jsonl_after,
)
from rlgrad.tasks import task_from_config
from rlgrad.tasks.base import data_rows


class Trainer:
    def __init__(self, cfg: RLGradConfig, hooks: Iterable[Hook] | None = None, log: Callable[..., None] = print):
        """``hooks`` run at the hook points in order, through one ``HookRunner`` (``rlgrad train`` hands it the
        instruments the config asks for, ``rlgrad.analysis.hooks_from_config``); the trainer knows nothing else
        of them. Everything that can reject the input happens before anything is written; under torchrun all
        ranks reject it together (rank 0 alone looks at the run directory)."""
        self.cfg = cfg
        self.hooks = HookRunner(hooks or ())
        self._set_up_process(log)
        distributed.agree(lambda: distributed.check_config(cfg))
        self.task = distributed.agree(lambda: task_from_config(cfg))
        distributed.decide(lambda: refuse_if_in_use(self.run_dir))  # the writer named, checkpoint or not
        self.resume_from = distributed.decide(lambda: runs.find_resume_point(cfg, self.run_dir, log=self.log))
        torch.manual_seed(cfg.trainer.seed)
        self._load_policy()
        self._build_models()
        self._init_loop_state()
        if self.resume_from is not None:
            self._restore(self.resume_from)

    # ------------------------------------------------------------------ construction
    def _set_up_process(self, log: Callable[..., None]) -> None:
        """Threads, device, run directory, this process's rank and log, and how rollouts seed their sampling."""
        cfg, trainer_cfg = self.cfg, self.cfg.trainer
        if threads := cpu_threads(cfg):
            torch.set_num_threads(threads)
        if trainer_cfg.device == "cuda" and not torch.cuda.is_available():
            raise UserError("'trainer.device' is cuda, but this machine has no CUDA device (auto picks one when "
                            "there is)")
        use_cuda = trainer_cfg.device == "cuda" or (trainer_cfg.device == "auto" and torch.cuda.is_available())
        self.device = torch.device("cuda" if use_cuda else "cpu")
        self.run_dir = runs.resolve_run_dir(cfg)
        self.is_main = is_main()
        self.log = log if self.is_main else (lambda *a, **k: None)
        # Under torchrun (any number of processes) each group samples from its own generator, so 1 and N
        # processes sample the same batch; a plain one-process run keeps the single stream.
        seeded = cfg.rollout.group_seeded_sampling
        self.group_seeded = seeded if seeded is not None else distributed.under_torchrun() or world_size() > 1
        if trainer_cfg.rollout_data_dir:  # where it is relative to now, not to wherever the run is looked at from
            trainer_cfg.rollout_data_dir = str(Path(trainer_cfg.rollout_data_dir).resolve())

    def _load_policy(self) -> None:
        """The actor and its tokenizer (the checkpoint's when resuming), how prompts are rendered, and the
        multi-turn episode runner when the task is an environment."""
        cfg, seed = self.cfg, self.cfg.trainer.seed
        lora = cfg.actor.lora.rank > 0
        if self.resume_from is not None and not lora:
            self.actor, self.tokenizer = distributed.agree(
                lambda: load_pretrained(self.resume_from / "actor", cfg.model.dtype))
        else:  # a LoRA checkpoint holds the adapter alone: it goes on the initial weights
            if world_size() > 1:  # rank 0 builds the warm-start cache once, the others then read it
                distributed.decide(lambda: load_actor(cfg.model, self.task, seed, log=self.log) and None)
            self.actor, self.tokenizer = distributed.agree(lambda: load_actor(cfg.model, self.task, seed, log=self.log))
        self.adapter = None  # actor.lora: the PeftModel around the actor, which checkpoints save (rl/lora.py)
        if lora:
            self.adapter = distributed.agree(
                lambda: add_adapters(self.actor, cfg.actor.lora) if self.resume_from is None
                else load_adapters(self.actor, self.resume_from / "actor"))
            self.actor = self.adapter.get_base_model()
        self.actor.to(self.device)
        # Prompts through the tokenizer's chat template (data.apply_chat_template); responses end at EOS or
        # at the template's end-of-turn token. Checked now, before anything is written.
        self.chat, self.stop_ids = distributed.agree(lambda: check_prompt_rendering(
            self.tokenizer, self.actor, cfg.data.apply_chat_template, cfg.data.system_prompt,
            self.task.val_examples()[:1] or self.task.train_examples(1, random.Random(0))))
        distributed.agree(lambda: check_prompt_lengths(self.tokenizer, data_rows(self.task), self.chat,
                                                       cfg.data.system_prompt, cfg.data.max_prompt_length))
        self.agent = None  # a multi-turn environment: its episodes are the rollouts (rl/episodes.py)
        if getattr(self.task, "multi_turn", False):
            self.agent = distributed.agree(lambda: EpisodeRunner(
                self.task.make_env, cfg.agent, self.tokenizer, chat=self.chat, system_prompt=cfg.data.system_prompt,
                stop_ids=self.stop_ids, weights=self.task.weights, max_context_length=cfg.data.max_prompt_length))

    def _build_models(self) -> None:
        """The process wrappers, the reference policy, the optimizers and losses, and the critic with gae."""
        cfg, strategy = self.cfg, self.cfg.trainer.strategy
        # train_actor: what the update runs on (DDP / FSDP2 wrapper); actor: a plain module with the same
        # weights (rollouts, log-probs, hooks, checkpoints). The same object in one process.
        self.train_actor, self.actor = distributed.wrap(self.actor, strategy)
        self.ref = None
        if cfg.actor.use_kl_loss or cfg.algorithm.use_kl_in_reward:  # the initial policy, also when resuming
            self.ref, _ = load_actor(cfg.model, self.task, cfg.trainer.seed, log=self.log)
            self.ref.to(self.device).eval().requires_grad_(False)
        self.optimizer, self.scheduler = build_optimizer(self.train_actor, cfg.actor.optim)
        self.loss_settings = LossSettings.from_config(cfg)
        self.critic = self.train_critic = self.critic_optimizer = self.critic_scheduler = None
        if cfg.algorithm.adv_estimator == "gae":  # PPO with a critic
            self.train_critic, self.critic = distributed.wrap(self._load_critic().to(self.device), strategy)
            self.critic_optimizer, self.critic_scheduler = build_optimizer(self.train_critic, cfg.critic.optim)
            self.critic_settings = CriticSettings.from_config(cfg)

    def _init_loop_state(self) -> None:
        """What the loop carries from step to step (and a checkpoint saves): the KL controller, the data
        stream, the step, the run of empty steps and the summary."""
        kl = self.cfg.algorithm.kl_ctrl
        self.kl_ctrl = KLController(kl.type, kl.kl_coef, kl.target_kl, kl.horizon)  # algorithm.use_kl_in_reward
        # total = Σ weight · component: the task's, and weight 1 for the shaping's components (rl/shaping.py)
        self.reward_weights = {**self.task.weights, "overlong": 1.0, "kl_penalty": 1.0}
        self.data_rng = random.Random(self.cfg.trainer.seed)
        self.step = 0
        self.empty_streak = 0
        self.summary: dict[str, float] = {}
        self.reward_log: RewardComponentLog | None = None
        self.rollout_log: RolloutLog | None = None

    # ------------------------------------------------------------------ state
    def _load_critic(self) -> torch.nn.Module:
        """From the checkpoint when resuming, else critic.model.path or the actor's initial weights."""
        cfg = self.cfg
        if self.resume_from is None:
            return load_critic(cfg.model, cfg.critic.model.path, self.task, cfg.trainer.seed, log=self.log)
        if not (self.resume_from / "critic").is_dir():
            raise UserError(f"checkpoint '{self.resume_from}' has no critic/ (saved by a run without "
                            "algorithm.adv_estimator=gae); it cannot resume a gae run")
        return load_value_model(self.resume_from / "critic", cfg.model.dtype, key="checkpoint critic")

    def _restore(self, path: Path) -> None:
        state = ckpt.load_state(path)
        if any(isinstance(k, int) for k in state["optimizer"]["state"]):
            raise UserError(f"checkpoint '{path}' was written by rlgrad before 0.1's torchrun support (optimizer "
                            "state keyed by position, not parameter name); it cannot be resumed or probed")
        distributed.load_optimizer_state(self.train_actor, self.optimizer, state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        if self.critic is not None:
            distributed.load_optimizer_state(self.train_critic, self.critic_optimizer, state["critic_optimizer"])
            self.critic_scheduler.load_state_dict(state["critic_scheduler"])
        ckpt.set_rng_state(state["rng"])
        self.data_rng.setstate(state["data_rng"])
        self.step = state["step"]
        self.empty_streak = state["empty_streak"]
        self.summary = dict(state.get("summary", {}))
        self.kl_ctrl.load_state_dict(state.get("kl_ctrl", self.kl_ctrl.state_dict()))

    def _state(self) -> dict:
        # every rank calls this (FSDP2 gathers the sharded optimizer state); rank 0 saves it
        state = {"optimizer": distributed.optimizer_state(self.train_actor, self.optimizer),
                 "scheduler": self.scheduler.state_dict(), "rng": ckpt.rng_state(),
                 "data_rng": self.data_rng.getstate(), "step": self.step, "empty_streak": self.empty_streak,
                 "summary": self.summary, "kl_ctrl": self.kl_ctrl.state_dict()}
        if self.critic is not None:
            state["critic_optimizer"] = distributed.optimizer_state(self.train_critic, self.critic_optimizer)
            state["critic_scheduler"] = self.critic_scheduler.state_dict()
        return state

    def _open_run_dir(self) -> MetricLogger:
        run_dir = self.run_dir
        if not self.is_main:  # only rank 0 writes
            return MetricLogger([])
        self.created_run_dir = not (run_dir.exists() and any(run_dir.iterdir()))
        run_dir.mkdir(parents=True, exist_ok=True)
        self.run_lock = lock_run_dir(run_dir)
        unfinished = ckpt.remove_unfinished(run_dir)
        if unfinished:
            self.log(f"removed {len(unfinished)} unfinished checkpoint(s) of a save that was killed: "
                     + ", ".join(unfinished))
        runs.record_settings(run_dir, self.cfg, self.step, self.log)
        moved = truncate_jsonl_after(run_dir / METRICS_FILE, self.step)
        if moved:
            self.log(f"resuming at step {self.step}: {moved} metric rows past the checkpoint moved to "
                     "metrics.discarded.jsonl")
        self.reward_log = RewardComponentLog(run_dir)
        self.rollout_log = RolloutLog(rollout_dir(run_dir, self.cfg.trainer.rollout_data_dir))
        self.rollout_log.discard_after(self.step)
        sinks = open_sinks(self.cfg.trainer, run_dir, self.step, asdict(self.cfg))
        if self.step == 0:  # the first steps of a run say whether its reward can teach anything
            sinks.insert(1, RewardSignalWatch(self.log, self.reward_weights))
        return MetricLogger(sinks)

    # ------------------------------------------------------------------ pieces
    def shard(self, num_groups: int) -> tuple[int, int]:
        """This rank's contiguous range ``[lo, hi)`` of ``num_groups`` prompt groups (ranks in order)."""
        processes, this = world_size(), rank()
        return this * num_groups // processes, (this + 1) * num_groups // processes

    def rollout(self, examples, n: int, do_sample: bool, first_group: int = 0, stream: int = 0,
                step: int = 0) -> tuple[Batch, dict]:
        """Sample ``n`` responses for each of ``examples`` (this rank's groups; ``first_group``: the global id
        of the first) and score them. ``stream``/``step`` seed the group generators of group-seeded sampling."""
        cfg, rollout_cfg = self.cfg, self.cfg.rollout
        seeds = ([group_seed(cfg.trainer.seed, stream, step, first_group + i) for i in range(len(examples))]
                 if self.group_seeded and do_sample else None)
        if self.agent is not None:  # n episodes per group, every one from the group's environment seed
            return self.agent.rollout(self.actor, examples, n, rollout_cfg, do_sample=do_sample,
                                      first_group=first_group, seeds=seeds)
        prompts = render_prompts(self.tokenizer, examples, self.chat, cfg.data.system_prompt)
        try:
            gen = generate(self.actor, self.tokenizer, prompts, n=n, max_new_tokens=rollout_cfg.response_length,
                           do_sample=do_sample, temperature=rollout_cfg.temperature, top_p=rollout_cfg.top_p,
                           top_k=rollout_cfg.top_k, max_prompt_length=cfg.data.max_prompt_length,
                           engine=rollout_cfg.engine, seeds=seeds, stop_ids=self.stop_ids)
        except PromptTooLong as e:  # name the data row it came from (file:line for data files)
            source = (examples[e.index].meta or {}).get("source")
            raise UserError(f"{source}: {e}" if source else str(e)) from None
        scores = [self.task.score(text, examples[i // n], num_tokens=int(gen.response_lengths[i]))
                  for i, text in enumerate(gen.responses)]
        group_ids = torch.arange(first_group, first_group + len(examples)).repeat_interleave(n)
        total = torch.tensor([s.total for s in scores], dtype=torch.float32)
        comps = {k: torch.tensor([s.components[k] for s in scores], dtype=torch.float32) for k in scores[0].components}
        if (overlong := cfg.reward.overlong_buffer).enable:  # DAPO's length shaping: one more component, weight 1
            comps["overlong"] = overlong_penalty(gen.response_lengths, rollout_cfg.response_length, overlong.len,
                                                 overlong.penalty_factor)
            total = total + comps["overlong"]
        batch = Batch(input_ids=gen.input_ids, attention_mask=gen.attention_mask, response_mask=gen.response_mask,
                      group_ids=group_ids, scores=total, reward_std=group_reward_std(total, group_ids),
                      components=comps, old_log_probs=gen.log_probs)
        info = {"correct": torch.tensor([s.correct for s in scores], dtype=torch.float32),
                "lengths": gen.response_lengths.float(), "truncated": gen.truncated.float(),
                "responses": gen.responses, "prompts": [prompts[i // n] for i in range(len(gen.responses))],
                "actual_lengths": torch.tensor([s.actual_length for s in scores], dtype=torch.long)}
        if scores[0].fallback is not None:  # a task with answer extraction: reward/extraction/flexible_share
            info["fallback"] = torch.tensor([bool(s.fallback) for s in scores], dtype=torch.float32)
        return batch, info

    def validate(self) -> dict[str, float]:
        examples = self.task.val_examples()
        lo, hi = self.shard(len(examples))
        with torch.random.fork_rng(devices=[]):  # validation never shifts the training RNG stream
            correct, total, episodes = [torch.zeros(0)], [torch.zeros(0)], []
            for first in range(lo, hi, 256):
                batch, info = self.rollout(examples[first:min(first + 256, hi)], n=1,
                                           do_sample=self.cfg.rollout.val_do_sample, first_group=first, stream=2,
                                           step=self.step)
                correct.append(info["correct"])
                total.append(batch.scores)
                episodes.append(info)
        correct, total = all_gather_cat(torch.cat(correct)), all_gather_cat(torch.cat(total))
        out = {"val/accuracy": float(correct.mean()), "val/score/mean": float(total.mean())}
        if self.agent is not None:
            out.update(episode_metrics({c: all_gather_cat(torch.cat([torch.zeros(0)] + [i[c] for i in episodes]))
                                        for c in COUNTS}, "val"))
        return out

    def prepare(self, batch: Batch, metrics: dict) -> Batch:
        rollout_cfg, algo = self.cfg.rollout, self.cfg.algorithm

        def log_probs(model: torch.nn.Module) -> torch.Tensor:
            return compute_log_probs(model, batch.input_ids, batch.attention_mask, batch.response_mask,
                                     temperature=rollout_cfg.temperature,
                                     micro_batch_size=rollout_cfg.log_prob_micro_batch_size)[0]

        with timer(metrics, "timing_s/old_log_prob"):  # the sampling model is the old policy: its rollout log-probs
            if rollout_cfg.recompute_log_probs or batch.old_log_probs is None:
                batch.old_log_probs = log_probs(self.actor)
        if self.ref is not None:
            with timer(metrics, "timing_s/ref"):
                batch.ref_log_probs = log_probs(self.ref)
        if self.critic is not None:
            with timer(metrics, "timing_s/values"):
                batch.values = compute_values(self.critic, batch,
                                              micro_batch_size=rollout_cfg.log_prob_micro_batch_size)
        if algo.use_kl_in_reward:  # verl's apply_kl_penalty; the KL's share of the reward is a component of its own
            batch.token_rewards, kl = kl_in_reward(batch.scores, batch.token_rewards, batch.old_log_probs,
                                                   batch.ref_log_probs, batch.response_mask, algo.kl_penalty,
                                                   self.kl_ctrl.value)
            batch.components["kl_penalty"] = kl_reward_share(batch.token_rewards, batch.scores, batch.response_mask)
            metrics["actor/reward_kl_penalty"] = float(all_gather_cat(kl).mean())
            metrics["actor/reward_kl_penalty_coeff"] = self.kl_ctrl.value
        with timer(metrics, "timing_s/adv"):
            batch.advantages, batch.returns = compute_advantages(
                algo.adv_estimator, batch.scores, batch.group_ids, batch.response_mask,
                token_rewards=batch.token_rewards, values=batch.values, gamma=algo.gamma, lam=algo.lam,
                norm_by_std=algo.norm_adv_by_std_in_grpo,
                reduce=all_reduce_sum)  # whitening: over the whole batch, not each process's rows
        return batch

    def sample_round(self, step: int, groups: int, round_index: int) -> tuple[Batch, dict]:
        """Round ``round_index`` of a step's rollout: ``groups`` new prompts (the same on every rank), ids from
        round_index·groups."""
        examples = self.task.train_examples(groups, self.data_rng)
        lo, hi = self.shard(len(examples))
        return self.rollout(examples[lo:hi], n=self.cfg.rollout.n, do_sample=True,
                            first_group=round_index * groups + lo, step=step)

    def filter(self, batch: Batch, info: dict, among: torch.Tensor | None = None) -> tuple[torch.Tensor, dict]:
        """``[N]`` bool: the rows of the groups the rollout filter keeps (of the rows ``among``, when given)."""
        if among is not None:
            rows = torch.nonzero(among).squeeze(-1)
            keep = torch.zeros_like(among)
            if float(all_reduce_sum(among.sum())) == 0:
                return keep, {}
            sub, filter_metrics = self.filter(batch.select(rows), {"lengths": info["lengths"][rows]})
            keep[rows[sub]] = True
            return keep, filter_metrics
        rollout_cfg = self.cfg.rollout
        entropies = None
        if rollout_cfg.rollout_filter_metric in ("entropy", "entropy_variance"):
            _, ent = compute_log_probs(self.actor, batch.input_ids, batch.attention_mask, batch.response_mask,
                                       temperature=rollout_cfg.temperature,
                                       micro_batch_size=rollout_cfg.log_prob_micro_batch_size, with_entropy=True)
            entropies = ent.sum(-1) / batch.response_mask.sum(-1).clamp(min=1)
        gather = all_gather_cat  # one global decision, on every rank, from every rank's groups
        res = rollout_filter(
            gather(batch.group_ids), gather(batch.scores), strategy=rollout_cfg.rollout_filter_strategy,
            value=rollout_cfg.rollout_filter_value, filter_type=rollout_cfg.rollout_filter_type,
            metric=rollout_cfg.rollout_filter_metric, top_p_prob_mode=rollout_cfg.rollout_filter_top_p_prob_mode,
            include_zero=rollout_cfg.rollout_filter_include_zero,
            selection_eps=rollout_cfg.rollout_filter_selection_eps,
            entropies=None if entropies is None else gather(entropies), lengths=gather(info["lengths"]))
        keep = torch.isin(batch.group_ids, torch.tensor(res.kept_groups, dtype=batch.group_ids.dtype))
        return keep, res.metrics

    def analysis_batch(self, step: int, groups: int, size: int) -> tuple[Batch | None, Batch]:
        """A separate rollout for analysis: own data stream, forked RNG, training batch untouched."""
        rng = random.Random(self.cfg.trainer.seed * 1_000_003 + step)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.cfg.trainer.seed * 1_000_003 + step)
            examples = self.task.train_examples(groups, rng)
            lo, hi = self.shard(len(examples))
            full, info = self.rollout(examples[lo:hi], n=size, do_sample=True, first_group=lo, stream=1, step=step)
            keep, _ = self.filter(full, info)
            kept = (self.prepare(full.select(torch.nonzero(keep).squeeze(-1)), {})
                    if float(all_reduce_sum(keep.sum())) > 0 else None)
        return kept, full

    # ------------------------------------------------------------------ the loop
    def collect(self, step: int, metrics: dict) -> tuple[Batch, Batch] | None:
        """rollout -> filter -> prepare for ``step``: ``(prepared filtered batch, unfiltered batch)``, or None
        when the filter kept no group (a skipped step). Logs the rollout, reward and advantage metrics."""
        full, info, signal_rows = self._sample(step, metrics)
        gather = all_gather_cat  # global metrics: every rank's samples
        metrics["rollout/accuracy"] = float(gather(info["correct"]).mean())
        metrics["rollout/score/mean"] = float(gather(full.scores).mean())
        metrics.update(summarize("response_length/{stat}", gather(info["lengths"])))
        metrics["response_length/clip_ratio"] = float(gather(info["truncated"]).mean())
        if self.agent is not None:
            metrics.update(episode_metrics({c: gather(info[c]) for c in COUNTS}, "train"))
        with timer(metrics, "timing_s/filter"):
            keep, filter_metrics = self.filter(full, info, signal_rows)
        metrics.update(filter_metrics)
        if float(all_reduce_sum(keep.sum())) == 0:
            self._log_rollouts(step, full, info, keep, None)
            self._skip_empty(step, metrics)
            return None
        self.empty_streak = 0
        kept = torch.nonzero(keep).squeeze(-1)
        batch = self.prepare(full.select(kept), metrics)
        if self.cfg.algorithm.use_kl_in_reward:  # verl: the controller moves after each batch, by its sample count
            self.kl_ctrl.update(metrics["actor/reward_kl_penalty"], int(all_reduce_sum(torch.tensor(len(batch)))))
        per_token = batch.token_rewards is not None or self.cfg.algorithm.adv_estimator in PER_TOKEN
        self._log_rollouts(step, full, info, keep,
                           sequence_advantages(batch.advantages, batch.response_mask, mean=per_token))
        metrics.update(kept_batch_metrics(step, batch, info, kept, has_critic=self.critic is not None,
                                          reward_weights=self.reward_weights, reward_log=self.reward_log))
        return batch, full

    def _sample(self, step: int, metrics: dict) -> tuple[Batch, dict, torch.Tensor | None]:
        """The step's rollout: ``(batch, info, rows that carry a signal or None)``. With
        ``algorithm.filter_groups`` (DAPO) rounds of data.gen_batch_size groups until enough carry a signal."""
        size, filter_groups = self.cfg.data.train_batch_size, self.cfg.algorithm.filter_groups
        round_groups = self.cfg.data.gen_batch_size or size
        with timer(metrics, "timing_s/gen"):
            if not filter_groups.enable:
                return (*self.sample_round(step, size, 0), None)
            return dynamic_sampling(lambda round_index: self.sample_round(step, round_groups, round_index), size,
                                    filter_groups.max_num_gen_batches, filter_groups.metric, metrics)

    def _log_rollouts(self, step: int, full: Batch, info: dict, keep: torch.Tensor, advantages: list | None) -> None:
        """rollouts/step_<N>.jsonl (``logging/rollouts.py``): every rank gathers (a collective), rank 0 writes."""
        prompts = info.get("prompts") or prompt_texts(self.tokenizer, full.input_ids, full.attention_mask,
                                                      full.response_mask)
        samples = gather_samples(step_samples(
            step, prompts=list(prompts), responses=list(info["responses"]), group_ids=full.group_ids,
            components=full.components, totals=full.scores, reward_std=full.reward_std, lengths=info["lengths"],
            truncated=info["truncated"].bool(), kept=keep, advantages=advantages, episodes=info.get("episodes")))
        if self.rollout_log is not None:  # main process only (_open_run_dir)
            self.rollout_log.write(step, samples)

    def _skip_empty(self, step: int, metrics: dict) -> None:
        """A step whose filter kept nothing: counted, and the run stops after too many in a row."""
        self.empty_streak += 1
        metrics["rollout/filter_empty"] = 1.0
        limit = self.cfg.rollout.rollout_filter_empty_stop_steps
        if self.empty_streak >= limit:
            raise runs.RunStopped(f"the rollout filter kept nothing for {self.empty_streak} consecutive steps "
                                  f"(rollout.rollout_filter_empty_stop_steps={limit}); "
                                  "loosen rollout.rollout_filter_value or rollout.rollout_filter_include_zero")
        self.log(f"step {step}: the rollout filter kept no group; step skipped")

    def context(self, step: int, batch: Batch, full: Batch) -> StepContext:
        """What the hooks see of this step. Under torchrun ``batch`` is this rank's share; ``actor`` is a plain
        module with the current weights (FSDP2: a full replica, refreshed after the update)."""
        ctx = StepContext(step=step, batch=batch, actor=self.actor, optimizer=self.optimizer,
                          loss_settings=self.loss_settings, config=self.cfg, run_dir=self.run_dir, ref=self.ref,
                          critic=self.critic, critic_optimizer=self.critic_optimizer, tokenizer=self.tokenizer,
                          is_main=self.is_main, unfiltered_batch=full, reward_weights=self.reward_weights,
                          prepare=lambda b: self.prepare(b, {}),
                          sample_batch=lambda groups, size: self.analysis_batch(step, groups, size),
                          sync_actor=lambda: distributed.sync_policy(self.train_actor, self.actor))
        if self.critic is not None:
            ctx.critic_loss = critic_loss_fn(self.critic_settings)
            ctx.sync_critic = lambda: distributed.sync_policy(self.train_critic, self.critic)
        return ctx

    def one_pass_update(self, ctx: StepContext) -> bool:
        """``StepContext.one_pass_update`` of a training step: the actor's first optimizer step is over the whole
        batch in ONE forward and backward, in one process, on the module the hooks see."""
        return (self.actor_updates(ctx.step) and self.train_actor is self.actor and world_size() == 1
                and 0 < len(ctx.batch) <= min(self.actor_mini_rows(), self.cfg.actor.ppo_micro_batch_size))

    def actor_updates(self, step: int) -> bool:
        """Whether the actor is updated at ``step`` (a critic's warm-up holds it back)."""
        return self.critic is None or step > self.cfg.trainer.critic_warmup

    def actor_mini_rows(self) -> int:
        """Rows of an actor mini-batch (one optimizer step)."""
        return (self.cfg.actor.ppo_mini_batch_size or self.cfg.data.train_batch_size) * self.cfg.rollout.n

    def _grad_hooks(self, ctx: StepContext, role: str, metrics: dict) -> dict[str, Callable | None]:
        """The callbacks ``ppo_update`` calls before each mini-batch's forward (``before_grads``) and after its
        backward (``on_grads``), as its keyword arguments (None: no hooks)."""
        def inner(model):  # DDP: the inner module (whole summed gradient); FSDP2: the sharded module
            return model.module if isinstance(model, torch.nn.parallel.DistributedDataParallel) else model

        def before(model, mini):
            self.hooks.before_grads(ctx, inner(model), mini, role=role)

        def call(model, mini):
            metrics.update(self.hooks.on_grads(ctx, inner(model), mini, role=role))
        return {"before_grads": before, "on_grads": call} if len(self.hooks) else {}

    def before_update(self, ctx: StepContext, logger: MetricLogger, metrics: dict) -> HookResult:
        """The hook point (``HookRunner.before_update``): the hooks' metrics into ``metrics``, their tables to the
        logger; the result says whether one of them stopped the run."""
        res = self.hook_result(self.hooks.before_update(ctx), ctx.step, logger, metrics)
        if res.stop:
            self.log(f"step {ctx.step}: stopping before the actor update ({res.reason})")
        return res

    @staticmethod
    def hook_result(res: HookResult, step: int, logger: MetricLogger, metrics: dict) -> HookResult:
        """A hook point's answer: its metrics into ``metrics``, its tables to the logger."""
        metrics.update(res.metrics)
        for table, (columns, rows) in res.tables.items():
            logger.log_table(table, columns, rows, step)
        return res

    def update_critic(self, ctx: StepContext, metrics: dict) -> None:
        cfg, critic_cfg = self.cfg, self.cfg.critic
        mini_prompts = critic_cfg.ppo_mini_batch_size or cfg.data.train_batch_size
        with timer(metrics, "timing_s/update_critic"):
            metrics.update(update_critic(
                self.train_critic, self.critic_optimizer, ctx.batch, self.critic_settings,
                ppo_epochs=critic_cfg.ppo_epochs, mini_batch_size=mini_prompts * cfg.rollout.n,
                micro_batch_size=critic_cfg.ppo_micro_batch_size, max_grad_norm=critic_cfg.max_grad_norm,
                shuffle=critic_cfg.shuffle, seed=cfg.trainer.seed * 100_019 + ctx.step,
                scheduler=self.critic_scheduler, **self._grad_hooks(ctx, "critic", metrics)))
            distributed.sync_policy(self.train_critic, self.critic)

    def update_actor(self, ctx: StepContext, metrics: dict) -> None:
        cfg, actor_cfg = self.cfg, self.cfg.actor
        with timer(metrics, "timing_s/update_actor"), update_size(self.actor, metrics):  # actor/update_ratio
            metrics.update(update_actor(
                self.train_actor, self.optimizer, ctx.batch, self.loss_settings,
                ppo_epochs=actor_cfg.ppo_epochs, mini_batch_size=self.actor_mini_rows(),
                micro_batch_size=actor_cfg.ppo_micro_batch_size, max_grad_norm=actor_cfg.max_grad_norm,
                shuffle=actor_cfg.shuffle, seed=cfg.trainer.seed * 100_003 + ctx.step,
                scheduler=self.scheduler, **self._grad_hooks(ctx, "actor", metrics),
                tap=self.hooks.update_tap(ctx) if ctx.one_pass_update else None))
            distributed.sync_policy(self.train_actor, self.actor)  # FSDP2: the rollout replica gets the new weights

    def train_step(self, step: int, logger: MetricLogger) -> tuple[dict[str, float], bool]:
        """One step (the module docstring's order); returns its metrics and whether a hook stopped the run."""
        metrics: dict[str, float] = {}
        t0 = time.perf_counter()
        try:
            collected = self.collect(step, metrics)
        except runs.RunStopped:
            metrics["timing_s/step"] = time.perf_counter() - t0
            logger.log(step, metrics)
            raise
        stop = False
        if collected is not None:
            ctx = self.context(step, *collected)
            ctx.one_pass_update = self.one_pass_update(ctx)  # a probe has no update: never there
            if self.critic is not None:  # before the hook point, as in RAGEN
                self.update_critic(ctx, metrics)
            stop = self.before_update(ctx, logger, metrics).stop
            if not stop:
                if self.actor_updates(step):  # critic warm-up: the actor waits
                    self.update_actor(ctx, metrics)
                self.hook_result(self.hooks.after_update(ctx), step, logger, metrics)
        metrics["timing_s/step"] = time.perf_counter() - t0
        return metrics, stop

    def probe(self) -> dict[str, float]:
        """RAGEN's checkpoint probe: the batch of the step after the restored checkpoint, rolled out, filtered
        and prepared as training would, then every hook's ``before_update`` -- no update of the actor or the
        critic, no checkpoint -- and one metrics row. ``trainer.val_before_train`` validates first."""
        step = self.step + 1
        logger = distributed.agree(self._open_run_dir)
        try:
            if self.cfg.trainer.val_before_train:
                logger.log(self.step, self.validate())
            metrics: dict[str, float] = {}
            t0 = time.perf_counter()
            try:
                collected = self.collect(step, metrics)
                if collected is not None:
                    self.before_update(self.context(step, *collected), logger, metrics)
            finally:  # also when the run stops (the filter kept nothing too often): the row says so
                metrics["timing_s/step"] = time.perf_counter() - t0
                logger.log(step, metrics)
        finally:
            logger.close()
            self.hooks.close()
            self._release_run_dir()
        return metrics

    def fit(self) -> dict[str, float]:
        """Train from the restored step (0 for a new run) to ``trainer.total_training_steps``; returns the run's
        summary. A hook's stop ends it early; a signal (SIGTERM/SIGINT) ends it after the running step, with a
        checkpoint (``runs.Interrupted``)."""
        if self.step >= self.cfg.trainer.total_training_steps:  # nothing to train: one line, or refused
            distributed.decide(lambda: runs.check_finished_run(self.run_dir, self.cfg, self.step, self.log))
            return self.summary
        if self.resume_from is not None:  # the first line of a resumed run says so, and from where
            self.log(f"resuming the run in {self.run_dir} from its checkpoint of step {self.step} "
                     f"({self.resume_from}): steps {self.step + 1} to {self.cfg.trainer.total_training_steps}")
        logger = distributed.agree(self._open_run_dir)
        start = self.step
        with runs.stop_requests() as signals:
            try:
                self._validate_before_training(logger)
                for step in range(self.step + 1, self.cfg.trainer.total_training_steps + 1):
                    if not self._run_step(step, logger, signals):
                        break
            except UserError:
                if self.step == start and getattr(self, "created_run_dir", False):
                    logger.close()
                    if self.is_main:  # bad input found before the first step: leave no trace, the rerun starts
                        runs.forget_run_dir(self.run_dir)
                raise
            finally:
                logger.close()
                self.hooks.close()
                self._release_run_dir()
        return self.summary

    def _release_run_dir(self) -> None:
        """Unlocks the run directory (``lock_run_dir``) once the run is written: another trainer, also in this
        process, may then resume it, whenever this one is collected."""
        lock = getattr(self, "run_lock", None)
        if lock is not None:
            lock.close()
            self.run_lock = None

    def _validate_before_training(self, logger: MetricLogger) -> None:
        """``trainer.val_before_train``: a step-0 (or resumed-step) validation row, unless the run has that row."""
        has_row = distributed.decide(
            lambda: any(row.get("step") == self.step for row in read_jsonl(self.run_dir / METRICS_FILE)))
        if self.cfg.trainer.val_before_train and not has_row:
            val = self.validate()
            self.summary.setdefault("val/accuracy_before", val["val/accuracy"])
            logger.log(self.step, val)

    def _run_step(self, step: int, logger: MetricLogger, signals: list[int]) -> bool:
        """One step of ``fit`` with its validation, metrics row and checkpoint where due; False when a hook
        stopped the run (its row logged, nothing else)."""
        trainer_cfg = self.cfg.trainer
        metrics, stop = self.train_step(step, logger)
        if stop:
            logger.log(step, metrics)
            self.summary["stopped_at_step"] = step
            return False
        # A signal stops the run after this step, as the step would have ended anyway (validation only
        # where due, so the checkpoint's RNG state is the uninterrupted run's), plus a checkpoint.
        interrupted = distributed.decide(lambda: signals[0] if signals else 0)
        last = step == trainer_cfg.total_training_steps
        if last or _due(trainer_cfg.test_freq, step):
            with timer(metrics, "timing_s/val"):
                metrics.update(self.validate())
            self.summary.setdefault("val/accuracy_before", math.nan)
            self.summary["val/accuracy_after"] = metrics["val/accuracy"]
        self.step = step
        halt = self.hooks.after_step(step, metrics)  # the live doctor reads the whole row
        metrics.update(halt.metrics)
        logger.log(step, metrics)
        if interrupted or halt.stop or checkpoint_due(step, trainer_cfg.save_freq, last):
            self._save_checkpoint(step)
        if halt.stop and not last:
            self.summary["stopped_at_step"] = step
            raise runs.Halted(f"stopped after step {step} by a hook, its metrics and checkpoint written: {halt.reason}")
        if interrupted and not last:
            raise runs.Interrupted(f"{signal.Signals(interrupted).name} after step {step}: its metrics and "
                                   "checkpoint are written; the same command resumes", interrupted)
        return True

    def _save_checkpoint(self, step: int) -> None:
        state = self._state()  # every rank: FSDP2 gathers the optimizer state
        if self.is_main:
            models = {"actor": self.actor if self.adapter is None else self.adapter}
            if self.critic is not None:
                models["critic"] = self.critic
            ckpt.save_checkpoint(self.run_dir, step, models, self.tokenizer, state, self.cfg.trainer.max_ckpt_to_keep)


def _due(every: int, step: int) -> bool:
    """A ``*_freq`` setting's steps: every-th step, never when it is 0 or negative."""
    return every > 0 and step % every == 0
