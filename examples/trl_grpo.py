"""A complete TRL GRPO script with rlgrad's instruments: the only change to a TRL script is the import.

    python examples/trl_grpo.py --output-dir runs/trl_demo --max-steps 20
    python examples/trl_grpo.py --model /path/to/SmolLM2-135M-Instruct.Q4_1.gguf --output-dir runs/trl_smol
    rlgrad report runs/trl_demo                  # the same report as for an rlgrad run

Task: rlgrad's arithmetic prompts ("12+7=") with two reward functions, correctness and format, weighted
0.8 / 0.2. Model: rlgrad's embedded default (a tiny Qwen2 warm-started on the task, built once and cached),
or ``--model`` (a local Hugging Face directory or .gguf file; an instruct model gets conversational prompts,
which TRL renders with its chat template). Every ``--analyse-every`` steps rlgrad measures the gradient by
reward-variance bucket, the two reward functions' gradient geometry and neuron health.
"""

import argparse
import random

from datasets import Dataset
from transformers import AutoTokenizer
from trl import GRPOConfig

from rlgrad.config.model import ModelConfig
from rlgrad.integrations.trl import GRPOTrainer  # instead of: from trl import GRPOTrainer
from rlgrad.models import embedded_default, resolve_model_path
from rlgrad.tasks import Example, build_task


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--output-dir", required=True)
    p.add_argument("--max-steps", type=int, default=20)
    p.add_argument("--model", help="a local HF directory or .gguf file (default: rlgrad's embedded tiny model)")
    p.add_argument("--analyse-every", type=int, default=5)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--beta", type=float, default=0.04, help="TRL's KL coefficient")
    p.add_argument("--reward-weights", type=float, nargs=2, default=[0.8, 0.2], metavar=("CORRECTNESS", "FORMAT"))
    args = p.parse_args()

    task = build_task("arithmetic", seed=args.seed, val_size=16)
    model_dir = resolve_model_path(args.model) if args.model else embedded_default(ModelConfig(), task, args.seed)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    chat = bool(getattr(tokenizer, "chat_template", None))
    rows = task.train_examples(8 * args.max_steps, random.Random(args.seed))
    data = Dataset.from_dict({"prompt": [[{"role": "user", "content": r.prompt}] if chat else r.prompt for r in rows],
                              "answer": [r.answer for r in rows]})

    def text(x):  # a conversational prompt or completion -> its text
        return x[-1]["content"] if isinstance(x, list) else x

    def component(name):
        def reward(prompts, completions, answer, **kwargs):
            return [task.score(text(c), Example(text(q), a)).components[name]
                    for q, c, a in zip(prompts, completions, answer)]
        reward.__name__ = name  # TRL names the reward function, and rlgrad its component, after it
        return reward

    config = GRPOConfig(output_dir=args.output_dir, max_steps=args.max_steps, per_device_train_batch_size=32,
                        num_generations=4, max_completion_length=16, learning_rate=1e-4, beta=args.beta,
                        loss_type="dapo", reward_weights=args.reward_weights, logging_steps=1, save_strategy="no",
                        report_to=[], use_cpu=True, bf16=False, seed=args.seed)
    trainer = GRPOTrainer(model=str(model_dir), reward_funcs=[component("correctness"), component("format")],
                          args=config, train_dataset=data, processing_class=tokenizer,
                          rlgrad=[f"analysis.every={args.analyse_every}", "analysis.buckets.num_buckets=4"])
    trainer.train()
    print(f"rlgrad run files in {args.output_dir}: rlgrad report {args.output_dir}")


if __name__ == "__main__":
    main()
