"""Does a Sokoban warm start read the board? (issue 47) The first move the model writes on the validation rooms of
the sokoban_demo preset, against the solver's, in one forward pass:

    python scripts/checks/sokoban_warmstart_probe.py                                   # the preset's warm start
    RLGRAD_CACHE=/tmp/ws python scripts/checks/sokoban_warmstart_probe.py model.warmstart_steps=800 \\
        model.warmstart_batch_size=16 model.warmstart_seed=2                          # try other settings

Settings without a shipped warm start are built first, as a run would build them (one CPU thread; the progress
lines give the SFT loss), and cached; point $RLGRAD_CACHE elsewhere to keep them out of your cache.

Prints the share of rooms whose solution does not start with Up where the model's most likely first move is the
solver's (the planner it imitates writes that move 90% of the time, so a model that reads the board gets about 0.9;
one that learnt only how often each word comes writes the commonest, Left, everywhere: about 0.4), the moves it
writes, and its mean probability of Up where Up is needed (the planner's systematic slip leaves about 0.3; RL is
there to raise it). ``tests/test_warmstarts.py`` checks the shipped warm start with ``first_moves``.
"""

from __future__ import annotations

import sys
from collections import Counter

WORDS = ("Up", "Down", "Left", "Right")


def first_moves(model, tokenizer, cfg, task) -> dict:
    """``right``: the share of the validation rooms not needing Up first whose most likely first move is the
    solver's; ``written``: how often each move is the most likely one; ``p_up``: the mean probability of Up where
    the solver's first move is Up (the four words' first characters compared)."""
    import torch

    from rlgrad.envs.dialogue import opening_tag, plain_opening, turn_text
    from rlgrad.envs.sokoban import solve

    contexts, needed = [], []
    for ex in task.val_examples():
        env = task.make_env()
        obs = env.reset(ex.meta["env_seed"])
        contexts.append(plain_opening(env.instruction, turn_text(1, obs, cfg.agent.max_actions_per_traj),
                                      opening_tag(cfg.agent.enable_think)))
        needed.append(solve(env)[0])
    batch = tokenizer(contexts, return_tensors="pt", padding=True, add_special_tokens=False)
    positions = (batch["attention_mask"].cumsum(-1) - 1).clamp(min=0)  # left padding, as in training
    with torch.no_grad():
        last = model(**batch, position_ids=positions).logits[:, -1]
    first = [tokenizer(w[0], add_special_tokens=False)["input_ids"][0] for w in WORDS]
    probs = last[:, first].softmax(-1)
    written = [WORDS[i] for i in probs.argmax(-1).tolist()]
    kept = [(w, n) for w, n in zip(written, needed) if n != "Up"]
    up = [i for i, n in enumerate(needed) if n == "Up"]
    return {"rooms": len(needed), "right": sum(w == n for w, n in kept) / len(kept),
            "written": dict(Counter(written)), "p_up": probs[up, 0].mean().item() if up else float("nan")}


def main(overrides: list[str]) -> int:
    import torch

    from rlgrad.config.load import load_config
    from rlgrad.models import embedded_default, load_pretrained
    from rlgrad.tasks import task_from_config

    torch.set_num_threads(1)
    cfg = load_config(preset="sokoban_demo", overrides=overrides)
    task = task_from_config(cfg)
    model, tokenizer = load_pretrained(embedded_default(cfg.model, task, cfg.trainer.seed))
    got = first_moves(model, tokenizer, cfg, task)
    print(f"{got['rooms']} rooms: right first move where it is not Up {got['right']:.2f}, writes {got['written']}, "
          f"P(Up | Up needed) {got['p_up']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
