"""What the model wrote: one JSONL file per training step, ``step_<N>.jsonl`` in ``trainer.rollout_data_dir``.

The directory is ``trainer.rollout_data_dir`` (verl's key), ``RUN/rollouts/`` when it is null. Each file holds
one line per sample of the step's rollout (every rank's share, in global order: groups in order, a group's
``rollout.n`` samples together), written atomically by rank 0 when the step's batch is prepared::

    {"step": N, "index": i, "group_id": g, "prompt": "...", "response": "...",
     "components": {c: x}, "total": x, "reward_std": x, "advantage": x | null, "kept": bool,
     "response_length": n, "finish_reason": "eos" | "length"}

``prompt`` is the prompt as the model saw it (chat template applied), special tokens kept; ``response`` the
decoded response, special tokens removed. ``reward_std`` is the group's unbiased score std (``Batch.reward_std``).
``kept``: the rollout filter kept the sample's group; only kept samples have an ``advantage`` (the sequence's:
the first response token's value for grpo / rloo, whose advantage is constant along a response, the mean over
the response for gae). ``response_length`` counts response tokens, the EOS included; ``finish_reason`` is
``length`` when the response hit ``rollout.response_length`` without an EOS. A step the filter emptied is
written too, every sample with ``kept: false``.

The bucket of a group is not in the file: the bucket analysis runs after this file is written (a hook), and
writes ``analysis/step_N/group_rv_table.csv``; ``rlgrad.rundata`` joins the two when it reads a step.

A multi-turn episode (``data.task=sokoban | frozen_lake``) adds its environment seed, ``success``, how it ``end``-ed
(success | env_done | actions_spent | max_turn | context_full) and its ``turns``, each
``{"observation", "response", "actions", "reward", "format_penalty", "response_length", "finish_reason"}``
(the state the turn answered, the model's text from the opening tag on, the actions played, the environment's
reward); ``prompt`` is then the episode's opening (instruction and first state) and ``response`` the model's turns,
``response_length`` the model's tokens over all turns.

A resumed run recomputes the steps past its checkpoint and replaces their files (same content).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from rlgrad.collectives import initialized, world_size
from rlgrad.runfiles import atomic_write_bytes, rollout_file, rollout_steps


def prompt_texts(tokenizer, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                 response_mask: torch.Tensor) -> list[str]:
    """Each row's prompt decoded from its tokens (attention mask 1, response mask 0), special tokens kept.
    Rows of one group share their prompt, which is decoded once."""
    prompt = attention_mask.bool() & ~response_mask.bool()
    cache: dict[tuple[int, ...], str] = {}
    out = []
    for ids, m in zip(input_ids, prompt):
        toks = tuple(ids[m].tolist())
        if toks not in cache:
            cache[toks] = tokenizer.decode(list(toks), skip_special_tokens=False)
        out.append(cache[toks])
    return out


def sequence_advantages(advantages: torch.Tensor, response_mask: torch.Tensor, mean: bool) -> list[float]:
    """One advantage per row of a ``[N, L]`` per-token advantage: the first response token's value, or
    (``mean``: gae, whose advantage varies along the response) the mean over the response tokens."""
    if advantages.shape[0] == 0:
        return []
    rm = response_mask.to(advantages.device).float()
    if mean:
        seq = (advantages.float() * rm).sum(-1) / rm.sum(-1).clamp(min=1)
    else:
        first = rm.argmax(-1)  # the first maximal value: the first response token
        seq = advantages.float().gather(-1, first[:, None])[:, 0]
    return seq.double().cpu().tolist()  # the same Python floats, without a 0-d tensor per row


def step_samples(step: int, *, prompts: list[str], responses: list[str], group_ids: torch.Tensor,
                 components: dict[str, torch.Tensor], totals: torch.Tensor, reward_std: torch.Tensor,
                 lengths: torch.Tensor, truncated: torch.Tensor, kept: torch.Tensor,
                 advantages: list[float] | None, episodes: list[dict] | None = None) -> list[dict]:
    """This rank's lines (``index`` filled in by ``gather_samples``). Per-sample tensors are ``[N]``;
    ``kept`` is ``[N]`` bool, ``advantages`` one value per kept row in row order (None: nothing kept);
    ``episodes`` (multi-turn tasks) one record per sample, merged into its line."""
    n = len(responses)
    kept_l = [bool(x) for x in kept.tolist()]
    adv: list[float | None] = [None] * n
    kept_rows = [i for i, k in enumerate(kept_l) if k]
    if advantages is not None:
        if len(advantages) != len(kept_rows):
            raise ValueError(f"{len(advantages)} advantages for {len(kept_rows)} kept samples")
        for i, a in zip(kept_rows, advantages):
            adv[i] = a
    cols = {c: v.tolist() for c, v in components.items()}
    gids, tot, rstd = group_ids.tolist(), totals.tolist(), reward_std.tolist()
    lens, trunc = lengths.tolist(), truncated.tolist()
    return [{"step": int(step), "index": i, "group_id": int(gids[i]), "prompt": prompts[i], "response": responses[i],
             "components": {c: cols[c][i] for c in cols}, "total": tot[i], "reward_std": rstd[i],
             "advantage": adv[i], "kept": kept_l[i], "response_length": int(lens[i]),
             "finish_reason": "length" if trunc[i] else "eos", **(episodes[i] if episodes else {})} for i in range(n)]


def gather_samples(samples: list[dict]) -> list[dict]:
    """Every rank's lines in rank order (ranks hold contiguous group shares: the global order), indexed.
    Under torchrun a collective: every rank calls it, also one with no sample."""
    if initialized() and world_size() > 1:
        import torch.distributed as dist

        parts: list = [None] * world_size()
        dist.all_gather_object(parts, samples)
        samples = [s for part in parts for s in part]
    for i, s in enumerate(samples):
        s["index"] = i
    return samples


class RolloutLog:
    """Writes ``step_<N>.jsonl`` into the rollout directory. Only the main process makes one."""

    def __init__(self, directory: str | os.PathLike):
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)

    def discard_after(self, step: int) -> int:
        """Move the files of steps past ``step`` (a resumed run recomputes them) into ``discarded/``, as
        ``metrics.jsonl``'s rows go to ``metrics.discarded.jsonl``; returns how many moved."""
        later = [s for s in rollout_steps(self.dir) if s > step]
        if later:
            (self.dir / "discarded").mkdir(exist_ok=True)
        for s in later:
            os.replace(rollout_file(self.dir, s), self.dir / "discarded" / rollout_file(self.dir, s).name)
        return len(later)

    def write(self, step: int, samples: list[dict]) -> Path:
        path = rollout_file(self.dir, step)
        text = "".join(json.dumps(s, ensure_ascii=False) + "\n" for s in samples)
        atomic_write_bytes(path, text.encode("utf-8", "backslashreplace"))
        return path


def read_rollouts(path: str | os.PathLike) -> list[dict]:
    """The lines of one ``step_<N>.jsonl``, in order; a line that does not parse is skipped."""
    out = []
    for line in Path(path).read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict):
            out.append(row)
    return out
