"""A tiny model, parquet dataset and reward function for the CPU verl launch (``scripts/checks/verl_launch.sh``).

    python scripts/checks/verl_launch_fixture.py OUT_DIR [--broken-tokenizer]

Writes OUT_DIR/model (a 2-layer Llama-architecture model with rlgrad's character tokenizer and a chat
template), OUT_DIR/train.parquet and OUT_DIR/val.parquet in verl's layout (``prompt`` as chat messages,
``reward_model.ground_truth``), and OUT_DIR/reward.py (``compute_score``: 1 when the response starts with the
answer, else half its share of digits). ``--broken-tokenizer`` saves a tokenizer whose vocabulary lacks the
prompts' characters.
"""

import argparse
import sys
from pathlib import Path

TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
# 1 for the answer; otherwise the share of digits in the response, so that a random model's samples of one
# prompt differ and step 1 has a nonzero policy gradient (the launch check compares its norm with verl's).
REWARD = '''def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kw):
    s = solution_str.strip()
    if s.startswith(str(ground_truth)):
        return 1.0
    return 0.5 * sum(c.isdigit() for c in s) / max(len(s), 1)
'''


def main(out: Path, broken: bool) -> None:
    import pandas as pd
    import torch
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    specials = ["<pad>", "<unk>", "<eos>", "<|im_start|>", "<|im_end|>"]
    chars = [] if broken else [chr(i) for i in range(32, 127)] + ["\n"]
    vocab = {t: i for i, t in enumerate(specials + chars)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"<\|im_(?:start|end)\|>|[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    hf_tok = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", unk_token="<unk>",
                                     eos_token="<|im_end|>", additional_special_tokens=specials[3:])
    hf_tok.chat_template = TEMPLATE
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(vocab), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256,
                      pad_token_id=0, bos_token_id=None, eos_token_id=vocab["<|im_end|>"], tie_word_embeddings=False)
    (out / "model").mkdir(parents=True, exist_ok=True)
    LlamaForCausalLM(cfg).save_pretrained(out / "model")
    hf_tok.save_pretrained(out / "model")
    rows = []
    for i in range(16):
        a, b = i % 5, (i * 3) % 4
        rows.append({"data_source": "rlgrad_add", "prompt": [{"role": "user", "content": f"{a}+{b}="}],
                     "ability": "math", "reward_model": {"style": "rule", "ground_truth": str(a + b)},
                     "extra_info": {"index": i}})
    pd.DataFrame(rows).to_parquet(out / "train.parquet")
    pd.DataFrame(rows[:4]).to_parquet(out / "val.parquet")
    (out / "reward.py").write_text(REWARD)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--broken-tokenizer", action="store_true")
    a = ap.parse_args()
    main(a.out, a.broken_tokenizer)
    sys.exit(0)
