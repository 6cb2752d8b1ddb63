"""Multi-turn episodes: the model and an environment take turns (RAGEN's agent loop), as one batch.

    observation = env.reset(seed)            every episode of a prompt group starts from the group's seed
    for turn in 1 .. agent.max_turn:
        context  = the instruction, the turns shown (agent.context_window_mode), this turn's state, the
                   opening tag (<think> or <answer>)
        response = the model's turn, sampled for every live episode of the batch in one generate call
        actions  = parse_answer(response): the action words, played one by one until the environment is
                   done or the episode's agent.max_actions_per_traj actions are spent; an unreadable turn
                   adds agent.format_penalty
        the episode ends when the environment is done, its actions are spent, the turns are over, or the
        next context would pass data.max_prompt_length

A row of the batch is one episode's tokens in order, assembled from pieces that are tokenized once each and
never re-tokenized as a whole: the environment's text (the instruction, states, rewards, chat-template markup,
the opening tag) with ``response_mask`` 0, and the model's sampled tokens with ``response_mask`` 1 and their
sampling log-probs. So every instrument, the critic and the update see exactly the model's tokens; the
environment's tokens are context, never trained. With ``context_window_mode=full`` the row is the context the
last turn was sampled in, so the sampling log-probs are the old log-probs; with a window the row is the last
turn's window (RAGEN's layout), its earlier turns were sampled in other contexts, and the old log-probs are
recomputed on the row (``Batch.old_log_probs`` is left None).

The episode's score is the sum of its turns' rewards (``env`` component) and format penalties (``format``),
weighted by ``reward.weights`` (both 1 by default): RAGEN's summed score on the last token. With
``agent.use_turn_scores`` each turn's weighted reward sits on that turn's last token (``Batch.token_rewards``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from rlgrad.algos.advantages import group_reward_std
from rlgrad.batch import Batch
from rlgrad.config.agent import AgentConfig
from rlgrad.envs import Env, parse_answer
from rlgrad.envs.dialogue import (
    feedback_text,
    opening_tag,
    plain_continuation,
    plain_opening,
    transcript,
    turn_text,
)
from rlgrad.errors import UserError
from rlgrad.rl.rollout import generate_from_ids, left_pad

# Per-episode counts a step's metrics are made of (``episode_metrics``); gathered over ranks as tensors.
COUNTS = ("success", "num_turns", "num_actions", "words", "valid_words", "effective", "episode_reward")


class TurnFormat:
    """The environment's text pieces as the model sees them: plain text, or user turns of the chat template.

    With a template, the user turn between two model turns is what the template adds after an assistant turn
    (found once by rendering a probe conversation); a model turn cut at the length limit, or one that stopped at
    another stop token (EOS), is closed with the template's end-of-turn text. A template whose rendering of a
    longer conversation does not extend the shorter one (some drop earlier reasoning) cannot be used: the tokens
    the model sampled would not be the conversation it is trained on.
    """

    def __init__(self, tokenizer, chat: bool, system_prompt: str | None, stop_ids: list[int]):
        self.tokenizer, self.chat, self.system_prompt = tokenizer, chat, system_prompt
        if not chat:
            return
        a, b, mark = "rlgrad-probe-a", "rlgrad-probe-b", "rlgrad-probe-user"
        turns = [{"role": "user", "content": a}, {"role": "assistant", "content": b}]
        before = tokenizer.apply_chat_template(turns, tokenize=False)
        after = tokenizer.apply_chat_template(turns + [{"role": "user", "content": mark}], tokenize=False,
                                              add_generation_prompt=True)
        if not after.startswith(before):
            raise UserError("the tokenizer's chat template does not render a conversation as an extension of its "
                            "first turns, which multi-turn episodes need (set data.apply_chat_template=false)")
        self.user_turn = after[len(before):]
        tail = before[before.rindex(b) + len(b):]  # what closes an assistant turn, e.g. "<|im_end|>\n"
        ends = [(i, t) for i, t in ((i, tokenizer.decode([i])) for i in stop_ids) if t and tail.startswith(t)]
        self.end_of_turn_id, self.end_of_turn = ends[0] if ends else (None, "")
        self.after_stop = tail[len(self.end_of_turn):]  # what follows the end-of-turn token

    def opening(self, instruction: str, turn: str, tag: str) -> str:
        if not self.chat:
            return plain_opening(instruction, turn, tag)
        messages = [{"role": "user", "content": f"{instruction}\n{turn}"}]
        if self.system_prompt:
            messages.insert(0, {"role": "system", "content": self.system_prompt})
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) + tag

    def continuation(self, feedback: str, turn: str, tag: str, last_token: int | None) -> str:
        """After a model turn that ended with ``last_token``: the template's end-of-turn text unless the model
        wrote it, the rest of the template's closing, the next user turn."""
        if not self.chat:
            return plain_continuation(feedback, turn, tag)
        close = "" if last_token == self.end_of_turn_id else self.end_of_turn
        return close + self.after_stop + self.user_turn.replace("rlgrad-probe-user", feedback + turn) + tag


@dataclass
class Turn:
    shown: str  # this turn's state text (turn_text)
    observation: str
    response: str = ""  # the model's text, the opening tag included
    ids: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    cut: bool = False  # the response hit rollout.response_length
    actions: list[str] = field(default_factory=list)
    words: int = 0  # action words written (at most agent.max_actions_per_turn)
    valid: int = 0  # of them, words the environment knows
    reward: float = 0.0  # the environment's rewards of the turn's actions
    penalty: float = 0.0  # agent.format_penalty when the answer was ill-formed
    effective: int = 0


@dataclass
class Episode:
    env: Env
    seed: int
    observation: str
    turns: list[Turn] = field(default_factory=list)
    actions_used: int = 0
    done: bool = False
    success: bool = False
    end: str = ""  # success | env_done | actions_spent | max_turn | context_full


class EpisodeRunner:
    """Plays batches of episodes with one model; ``rollout`` returns them as a ``Batch``."""

    def __init__(self, make_env, settings: AgentConfig, tokenizer, *, chat: bool, system_prompt: str | None,
                 stop_ids: list[int], weights: dict[str, float], max_context_length: int):
        self.make_env, self.agent, self.tokenizer = make_env, settings, tokenizer
        self.format = TurnFormat(tokenizer, chat, system_prompt, stop_ids)
        self.stop_ids, self.weights, self.max_context = stop_ids, weights, max_context_length
        self.tag = opening_tag(settings.enable_think)
        self.window = settings.window
        self._ids: dict[str, list[int]] = {}
        env = make_env()  # a first turn that cannot fit is bad input: refused before the run starts
        obs = env.reset(0)
        first = Episode(env, 0, obs, [Turn(turn_text(1, obs, settings.max_actions_per_traj), obs)])
        self.check_fits(len([t for ids, _ in self.pieces(first, 0, False) for t in ids]))

    def check_fits(self, length: int) -> None:
        if length > self.max_context:
            raise UserError(f"the first turn of an episode takes {length} tokens, more than "
                            f"data.max_prompt_length={self.max_context} (the longest context an episode may "
                            "reach); raise it")

    def ids(self, text: str) -> list[int]:
        if text not in self._ids:
            self._ids[text] = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        return self._ids[text]

    def pieces(self, ep: Episode, last: int, with_response: bool) -> list[tuple[list[int], list[float] | None]]:
        """The token pieces of ``ep`` through turn ``last`` (``dialogue.transcript``): environment pieces carry
        None, model pieces their sampling log-probs."""
        out: list[tuple[list[int], list[float] | None]] = []
        for kind, j in transcript(last, with_response, self.window):
            t = ep.turns[j]
            if kind == "model":
                out.append((t.ids, t.log_probs))
            elif kind == "open":
                out.append((self.ids(self.format.opening(ep.env.instruction, t.shown, self.tag)), None))
            else:
                p = ep.turns[j - 1]
                text = self.format.continuation(feedback_text(self.turn_score(p)), t.shown, self.tag,
                                                p.ids[-1] if p.ids else None)
                out.append((self.ids(text), None))
        return out

    def turn_score(self, t: Turn) -> float:
        return self.weights["env"] * t.reward + self.weights["format"] * t.penalty

    def play(self, ep: Episode, t: Turn, turn: int) -> None:
        """The environment's side of a turn: read the answer, play its actions, decide whether the episode ends."""
        agent = self.agent
        answer = parse_answer(t.response, ep.env.actions, enable_think=agent.enable_think,
                              action_sep=agent.action_sep, max_actions=agent.max_actions_per_turn)
        t.words, t.valid = answer.words, len(answer.actions)
        t.penalty = 0.0 if answer.well_formed else agent.format_penalty
        for action in answer.actions[:agent.max_actions_per_traj - ep.actions_used]:
            ep.observation, reward, done, info = ep.env.step(action)
            t.actions.append(action)
            t.reward += float(reward)
            t.effective += bool(info.get("action_is_effective", False))
            if done:
                ep.done, ep.success = True, bool(info.get("success", False))
                ep.end = "success" if ep.success else "env_done"
                break
        ep.actions_used += len(t.actions)
        if not ep.done and ep.actions_used >= agent.max_actions_per_traj:
            ep.done, ep.end = True, "actions_spent"
        elif not ep.done and turn == agent.max_turn:
            ep.done, ep.end = True, "max_turn"

    def sample_turn(self, model, live: list[Episode], turn: int, gen_kwargs: dict, seeds: list[int] | None) -> None:
        """Open turn ``turn`` of every live episode and sample all their responses in one generate call."""
        contexts, playing, turn_seeds = [], [], []
        for i, ep in enumerate(live):
            left = self.agent.max_actions_per_traj - ep.actions_used
            ep.turns.append(Turn(turn_text(turn, ep.observation, left), ep.observation))
            ctx = [tok for ids, _ in self.pieces(ep, len(ep.turns) - 1, with_response=False) for tok in ids]
            if len(ctx) > self.max_context:  # no room for another turn: the episode ends before it
                if turn == 1:
                    self.check_fits(len(ctx))
                ep.turns.pop()
                ep.done, ep.end = True, "context_full"
                continue
            contexts.append(ctx)
            playing.append(ep)
            if seeds is not None:
                turn_seeds.append((seeds[i] * 1_000_003 + turn) % (1 << 62))
        if not playing:
            return
        ids, att = left_pad(contexts, self.tokenizer.pad_token_id)
        gen = generate_from_ids(model, self.tokenizer, ids, att, n=1, stop_ids=self.stop_ids,
                                seeds=turn_seeds if seeds is not None else None, **gen_kwargs)
        for i, ep in enumerate(playing):
            t, m = ep.turns[-1], gen.response_mask[i].bool()
            t.ids, t.log_probs = gen.input_ids[i][m].tolist(), gen.log_probs[i][m].tolist()
            t.response, t.cut = self.tag + gen.responses[i], bool(gen.truncated[i])
            self.play(ep, t, turn)

    def run(self, model, env_seeds: list[int], gen_kwargs: dict, seeds: list[int] | None = None) -> list[Episode]:
        """One episode per entry of ``env_seeds``; ``seeds`` (optional, one per episode): each episode samples
        from its own generators (group-seeded sampling)."""
        self._ids.clear()  # token ids of this batch's texts only: states differ from batch to batch
        episodes = []
        for seed in env_seeds:
            env = self.make_env()
            episodes.append(Episode(env, seed, env.reset(seed)))
        for turn in range(1, self.agent.max_turn + 1):
            idx = [i for i, ep in enumerate(episodes) if not ep.done]
            if not idx:
                break
            self.sample_turn(model, [episodes[i] for i in idx], turn, gen_kwargs,
                             None if seeds is None else [seeds[i] for i in idx])
        return episodes

    def rollout(self, model, examples: list, n: int, r, *, do_sample: bool, first_group: int = 0,
                seeds: list[int] | None = None) -> tuple[Batch, dict]:
        """``n`` episodes from each example's environment seed (``meta["env_seed"]``), sampled as ``r``
        (``rollout.*``) says, as a batch whose group ids count from ``first_group``; ``seeds``: one per group
        (group-seeded sampling), each episode then draws from its own generators."""
        gen_kwargs = dict(max_new_tokens=r.response_length, do_sample=do_sample, temperature=r.temperature,
                          top_p=r.top_p, top_k=r.top_k, engine=r.engine)
        episodes = self.run(model, [e.meta["env_seed"] for e in examples for _ in range(n)], gen_kwargs,
                            None if seeds is None else [s * 1_009 + j for s in seeds for j in range(n)])
        return self.to_batch(episodes, torch.arange(first_group, first_group + len(examples)).repeat_interleave(n))

    def to_batch(self, episodes: list[Episode], group_ids: torch.Tensor) -> tuple[Batch, dict]:
        """The episodes as rows (see the module docstring) and the per-episode records of ``info``."""
        rows, masks, lps, rewards = [], [], [], []
        for ep in episodes:
            row, mask, lp, rw = [], [], [], []
            for ids, logp in self.pieces(ep, len(ep.turns) - 1, with_response=True) if ep.turns else []:
                row += ids
                mask += [0 if logp is None else 1] * len(ids)
                lp += [0.0] * len(ids) if logp is None else logp
                rw += [0.0] * len(ids)
            if self.agent.use_turn_scores:  # each turn's score on its last token (full window: every turn is here)
                ends = [k for k in range(len(mask)) if mask[k] and (k + 1 == len(mask) or not mask[k + 1])]
                for k, t in zip(ends, ep.turns):
                    rw[k] = self.turn_score(t)
            rows.append(row or [self.tokenizer.pad_token_id])
            masks.append(mask or [0])
            lps.append(lp or [0.0])
            rewards.append(rw or [0.0])
        input_ids, attention_mask = left_pad(rows, self.tokenizer.pad_token_id)

        def pad(values: list[list[float]]) -> torch.Tensor:
            width = input_ids.shape[1]
            return torch.tensor([[0.0] * (width - len(v)) + v for v in values], dtype=torch.float32)

        response_mask = pad([[float(x) for x in m] for m in masks])
        comps = {"env": torch.tensor([sum(t.reward for t in ep.turns) for ep in episodes]),
                 "format": torch.tensor([sum(t.penalty for t in ep.turns) for ep in episodes])}
        comps = {k: v.float() for k, v in comps.items()}
        total = self.weights["env"] * comps["env"] + self.weights["format"] * comps["format"]
        batch = Batch(
            input_ids=input_ids, attention_mask=attention_mask, response_mask=response_mask, group_ids=group_ids,
            scores=total, reward_std=group_reward_std(total, group_ids), components=comps,
            old_log_probs=pad(lps) * response_mask if self.window is None else None,
            token_rewards=pad(rewards) if self.agent.use_turn_scores else None)
        return batch, self.info(episodes, batch)

    def info(self, episodes: list[Episode], batch: Batch) -> dict:
        lengths = batch.response_mask.sum(-1)
        opening = [self.tokenizer.decode(self.pieces(ep, 0, False)[0][0]) if ep.turns else "" for ep in episodes]
        counts = {"success": [ep.success for ep in episodes], "num_turns": [len(ep.turns) for ep in episodes],
                  "num_actions": [ep.actions_used for ep in episodes],
                  "words": [sum(t.words for t in ep.turns) for ep in episodes],
                  "valid_words": [sum(t.valid for t in ep.turns) for ep in episodes],
                  "effective": [sum(t.effective for t in ep.turns) for ep in episodes],
                  "episode_reward": batch.scores.tolist()}
        info = {k: torch.tensor(v, dtype=torch.float32) for k, v in counts.items()}
        info.update({
            "correct": info["success"], "lengths": lengths, "actual_lengths": lengths.long(),
            "valid_format": torch.tensor([all(t.penalty == 0 for t in ep.turns) for ep in episodes]),
            "truncated": torch.tensor([bool(ep.turns) and ep.turns[-1].cut for ep in episodes], dtype=torch.float32),
            "prompts": opening,
            "responses": ["\n".join(t.response for t in ep.turns) for ep in episodes],
            "episodes": [episode_record(ep) for ep in episodes]})
        return info


def episode_record(ep: Episode) -> dict:
    """What the rollout file keeps of an episode (``logging/rollouts.py``)."""
    return {"env_seed": ep.seed, "success": ep.success, "end": ep.end,
            "turns": [{"observation": t.observation, "response": t.response, "actions": t.actions,
                       "reward": t.reward, "format_penalty": t.penalty, "response_length": len(t.ids),
                       "finish_reason": "length" if t.cut else "eos"} for t in ep.turns]}


# The episode metrics of training rollouts (before the rollout filter) and of validation, by their literal keys.
METRIC_KEYS = {
    "train": {"success": "env/success", "num_turns": "env/num_turns", "num_actions": "env/num_actions",
              "episode_reward": "env/episode_reward", "valid": "env/action_is_valid",
              "effective": "env/action_is_effective"},
    "val": {"success": "val/env/success", "num_turns": "val/env/num_turns", "num_actions": "val/env/num_actions",
            "episode_reward": "val/env/episode_reward", "valid": "val/env/action_is_valid",
            "effective": "val/env/action_is_effective"},
}


def episode_metrics(counts: dict[str, torch.Tensor], split: str) -> dict[str, float]:
    """Success rate, mean turns and actions, valid / effective action rates and episode reward over episodes
    (``counts``: the ``COUNTS`` tensors of every rank's episodes; ``split``: train | val)."""
    if counts["success"].numel() == 0:
        return {}
    k = METRIC_KEYS[split]
    out = {k[c]: float(counts[c].mean()) for c in ("success", "num_turns", "num_actions", "episode_reward")}
    words, actions = float(counts["words"].sum()), float(counts["num_actions"].sum())
    if words > 0:  # a rate over no word is undefined, not 0
        out[k["valid"]] = float(counts["valid_words"].sum()) / words
    if actions > 0:
        out[k["effective"]] = float(counts["effective"].sum()) / actions
    return out
