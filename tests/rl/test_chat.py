"""Chat templates: prompts rendered as the tokenizer's own apply_chat_template renders them, responses ending at
the template's end-of-turn token."""

import pytest
import torch

from rlgrad.config.model import ModelConfig, TinyModelConfig
from rlgrad.errors import UserError
from rlgrad.models import build_char_tokenizer, build_tiny_model
from rlgrad.rl.rollout import generate, render_prompts, stop_token_ids, uses_chat_template
from rlgrad.tasks import Example

TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.fixture(scope="module")
def chat_tok():
    tok = build_char_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tok.chat_template = TEMPLATE
    return tok


def test_prompts_render_as_the_tokenizers_own_template(chat_tok):
    ex = Example("2+3=", "5")
    own = chat_tok.apply_chat_template([{"role": "user", "content": "2+3="}], tokenize=False,
                                       add_generation_prompt=True)
    assert render_prompts(chat_tok, [ex], chat=True) == [own]
    assert own == "<|im_start|>user\n2+3=<|im_end|>\n<|im_start|>assistant\n"
    with_system = chat_tok.apply_chat_template([{"role": "system", "content": "Be brief."},
                                                {"role": "user", "content": "2+3="}], tokenize=False,
                                               add_generation_prompt=True)
    assert render_prompts(chat_tok, [ex], chat=True, system_prompt="Be brief.") == [with_system]
    # verl's parquet messages go as they are; their own system turn is kept, not doubled
    verl = Example("q", "a", messages=[{"role": "system", "content": "S"}, {"role": "user", "content": "q"}])
    own = chat_tok.apply_chat_template(verl.messages, tokenize=False, add_generation_prompt=True)
    assert render_prompts(chat_tok, [verl], chat=True, system_prompt="other") == [own]
    assert render_prompts(chat_tok, [ex], chat=False) == ["2+3="]


def test_the_setting_decides_and_a_tokenizer_without_a_template_stays_plain(chat_tok):
    plain = build_char_tokenizer()
    assert uses_chat_template(chat_tok, "auto") and not uses_chat_template(chat_tok, "false")
    assert not uses_chat_template(plain, "auto") and not uses_chat_template(plain, "false")
    with pytest.raises(UserError, match="no chat template"):
        uses_chat_template(plain, "true")


def test_a_response_ends_at_the_templates_end_of_turn(chat_tok):
    end = chat_tok.convert_tokens_to_ids("<|im_end|>")
    assert stop_token_ids(chat_tok, chat=True) == sorted({chat_tok.eos_token_id, end})
    assert stop_token_ids(chat_tok, chat=False) == [chat_tok.eos_token_id]
    tok = build_char_tokenizer()
    model = build_tiny_model(ModelConfig(tiny=TinyModelConfig(hidden_size=32, num_hidden_layers=1,
                                                               num_attention_heads=2, num_key_value_heads=1,
                                                               intermediate_size=48)), tok, seed=0)
    stop = tok.convert_tokens_to_ids("1")  # a frequent character as the end of turn
    for engine in ("hf", "native"):
        torch.manual_seed(0)
        gen = generate(model, tok, ["12+34=", "7-9="], n=8, max_new_tokens=12, do_sample=True, engine=engine,
                       stop_ids=[tok.eos_token_id, stop])
        ended = 0
        for ids, rm in zip(gen.input_ids, gen.response_mask):
            resp = ids[rm.bool()].tolist()
            hits = [i for i, t in enumerate(resp) if t in (stop, tok.eos_token_id)]
            assert not hits or hits[0] == len(resp) - 1, engine  # nothing after the first stop token
            ended += bool(hits)
        assert ended > 0, engine  # some response did stop at it


def test_asking_for_a_template_the_embedded_default_lacks_is_one_line(tiny, capsys):
    from rlgrad.cli import main

    assert main(["train", *tiny, "data.apply_chat_template=true", "trainer.total_training_steps=1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "data.apply_chat_template=true" in err[0] and "no chat template" in err[0]


def test_a_template_that_refuses_the_prompts_or_a_system_prompt_without_one_is_one_line(chat_tok):
    from rlgrad.rl.rollout import check_prompt_rendering

    strict = build_char_tokenizer()
    strict.chat_template = ("{% for m in messages %}{% if m['role'] == 'system' %}"
                            "{{ raise_exception('System role not supported') }}{% endif %}{{ m['content'] }}"
                            "{% endfor %}")
    ex = [Example("2+3=", "5")]
    assert check_prompt_rendering(strict, None, "auto", None, ex) == (True, [strict.eos_token_id])
    with pytest.raises(UserError, match="System role not supported"):
        check_prompt_rendering(strict, None, "auto", "Be brief.", ex)
    with pytest.raises(UserError, match="data.system_prompt needs a chat template"):
        check_prompt_rendering(build_char_tokenizer(), None, "auto", "Be brief.", ex)
    with pytest.raises(UserError, match="data.system_prompt needs a chat template"):
        check_prompt_rendering(chat_tok, None, "false", "Be brief.", ex)
