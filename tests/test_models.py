"""model.path as a .gguf file: dequantised once into a cached Hugging Face directory, then loaded like one.

The real-model tests use SmolLM2-135M-Instruct (Q4_1), dequantised once per session into a fresh cache
(about half a minute on 2 CPU cores); they skip, saying why, when the file or the gguf package is absent.
"""

import importlib.util
import json
import random
import time
from types import SimpleNamespace

import pytest
import torch

from rlgrad import models
from rlgrad.config.model import ModelConfig
from rlgrad.errors import UserError
from rlgrad.models import is_gguf, load_actor, load_critic, load_pretrained


def _quiet(*_a, **_k):
    pass


@pytest.fixture(scope="module")
def smol(smollm2_gguf, tmp_path_factory):
    """SmolLM2 loaded through rlgrad from a fresh cache, plus the in-memory model the dequantisation made."""
    cache = tmp_path_factory.mktemp("gguf_cache")
    made = []
    real = models._dequantise_gguf

    def spy(path, key):
        out = real(path, key)
        made.append(out[0])
        return out

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(models, "_dequantise_gguf", spy)
        t0 = time.perf_counter()
        model, tokenizer = load_pretrained(smollm2_gguf, cache_dir=cache, log=_quiet)
        seconds = time.perf_counter() - t0
    assert len(made) == 1, "a fresh cache must dequantise the file"
    directory = models.gguf_model_dir(smollm2_gguf, cache, log=_quiet)
    return SimpleNamespace(path=smollm2_gguf, cache=cache, dir=directory, model=model.eval(), tokenizer=tokenizer,
                           dequantised=made[0].eval(), made=made, seconds=seconds)


def _chat_ids(tokenizer, text: str) -> torch.Tensor:
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                           add_generation_prompt=True)
    return tokenizer(prompt, add_special_tokens=False, return_tensors="pt")["input_ids"]


# ---------------------------------------------------------------------------------------------- real model
@pytest.mark.e2e
def test_gguf_logits_match_the_cached_directory(smol):
    """What rlgrad loads (from the cache) is what transformers dequantised, and so is the saved directory."""
    from transformers import AutoModelForCausalLM

    reloaded = AutoModelForCausalLM.from_pretrained(smol.dir, local_files_only=True, dtype=torch.float32).eval()
    want = smol.dequantised.state_dict()
    got = smol.model.state_dict()
    assert want.keys() == got.keys()
    assert all(torch.equal(want[k], got[k]) for k in want)
    ids = _chat_ids(smol.tokenizer, "What is 2+2?")
    with torch.no_grad():
        ref = smol.dequantised(ids).logits
        torch.testing.assert_close(smol.model(ids).logits, ref)
        torch.testing.assert_close(reloaded(ids).logits, ref)
    assert smol.model.dtype == torch.float32 and smol.model.config.model_type == "llama"
    assert not getattr(smol.model, "is_quantized", False)
    assert "quantization_config" not in (smol.dir / "config.json").read_text()


@pytest.mark.e2e
def test_it_is_a_working_instruct_model(smol):
    """A sanity check of the dequantisation itself: greedy decoding answers a chat question."""
    ids = _chat_ids(smol.tokenizer, "What is 2+2?")
    tok = smol.tokenizer
    with torch.no_grad():
        out = smol.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=16,
                                  do_sample=False, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    reply = tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
    assert "4" in reply, reply


@pytest.mark.e2e
def test_second_load_hits_the_cache(smol, monkeypatch):
    """load_actor (the actor and the reference model) reads the cached directory: no second dequantisation,
    nothing rewritten, and model.dtype applies to it."""
    def boom(*_a, **_k):
        raise AssertionError("dequantised a second time")

    monkeypatch.setattr(models, "_dequantise_gguf", boom)
    before = {p: p.stat().st_mtime_ns for p in smol.dir.iterdir()}
    cfg = ModelConfig(path=str(smol.path), cache_dir=str(smol.cache), dtype="bfloat16")
    logged = []
    t0 = time.perf_counter()
    actor, tokenizer = load_actor(cfg, None, 0, log=logged.append)
    seconds = time.perf_counter() - t0
    assert len(smol.made) == 1 and not logged
    assert {p: p.stat().st_mtime_ns for p in smol.dir.iterdir()} == before
    assert [p.name for p in (smol.cache / "gguf").iterdir()] == [smol.dir.name]  # no temporary left behind
    assert smol.dir.name.startswith("SmolLM2-135M-Instruct.Q4_1-") and len(smol.dir.name.rsplit("-", 1)[1]) == 16
    assert actor.dtype == torch.bfloat16
    assert actor.lm_head.weight.data_ptr() == actor.model.embed_tokens.weight.data_ptr()
    assert tokenizer.pad_token_id == smol.tokenizer.pad_token_id
    assert seconds < 30, f"a cached load took {seconds:.1f}s"


@pytest.mark.e2e
def test_critic_starts_from_the_gguf_weights(smol):
    """critic.model.path unset: the value model starts from model.path's (dequantised) weights, head at zero."""
    cfg = ModelConfig(path=str(smol.path), cache_dir=str(smol.cache))
    critic = load_critic(cfg, None, None, 0, log=_quiet)
    assert torch.equal(critic.model.embed_tokens.weight, smol.model.model.embed_tokens.weight)
    assert all(p.eq(0).all() for p in critic.score.parameters())
    assert len(smol.made) == 1


@pytest.mark.e2e
def test_tokenizer_and_tied_embeddings(smol):
    tok, model = smol.tokenizer, smol.model
    assert tok.pad_token is not None and tok.pad_token_id == tok.eos_token_id  # the file names EOS as its pad
    assert tok.eos_token == "<|im_end|>" and tok.padding_side == "left"
    vocab = tok.get_vocab()
    assert "<|im_end|>" in vocab and "<|im_start|>" in vocab
    assert tok.chat_template is not None
    prompt = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert prompt.endswith("<|im_start|>assistant\n")
    assert model.config.tie_word_embeddings
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert torch.equal(model.lm_head.weight, smol.dequantised.model.embed_tokens.weight)


@pytest.mark.e2e
def test_left_padded_batch_matches_single_prompts(smol):
    """rlgrad's prompt batches (left padding with the pad token, positions from the mask) see what a
    single unpadded prompt sees."""
    tok, model = smol.tokenizer, smol.model
    texts = ["What is 2+2?", "Name three colours of the rainbow, please."]
    prompts = [tok.apply_chat_template([{"role": "user", "content": t}], tokenize=False, add_generation_prompt=True)
               for t in texts]
    enc = tok(prompts, add_special_tokens=False, padding=True, return_tensors="pt")
    ids, att = enc["input_ids"], enc["attention_mask"]
    assert att[0, 0] == 0 and ids[0, 0] == tok.pad_token_id and att[:, -1].all()  # left padded
    with torch.no_grad():
        batch = model(input_ids=ids, attention_mask=att, position_ids=(att.cumsum(-1) - 1).clamp(min=0)).logits
        for i, p in enumerate(prompts):
            alone = model(input_ids=tok(p, add_special_tokens=False, return_tensors="pt")["input_ids"]).logits
            torch.testing.assert_close(batch[i, -1], alone[0, -1], atol=1e-4, rtol=1e-4)


def test_truncated_gguf_is_a_user_error(smollm2_gguf, tmp_path):
    bad = tmp_path / "truncated.gguf"
    with open(smollm2_gguf, "rb") as f:
        bad.write_bytes(f.read(1 << 20))
    with pytest.raises(UserError) as e:
        load_pretrained(bad, cache_dir=tmp_path / "cache", log=_quiet)
    msg = str(e.value)
    assert "\n" not in msg and str(bad) in msg and "could not be loaded as a GGUF model" in msg
    assert not (tmp_path / "cache" / "gguf").exists() or not any((tmp_path / "cache" / "gguf").iterdir())


# ---------------------------------------------------------------------------------------------- bad input
def _setup_missing(tmp_path):
    return tmp_path / "missing.gguf", "does not exist"


def _setup_text(tmp_path):
    p = tmp_path / "x.gguf"
    p.write_text("this is not a model\n")
    return p, "is not a GGUF file"


def _setup_empty(tmp_path):
    p = tmp_path / "empty.gguf"
    p.write_bytes(b"")
    return p, "is not a GGUF file"


def _setup_bad_header(tmp_path):  # the magic, then nonsense: the GGUF reader's error (or the missing package)
    p = tmp_path / "garbage.gguf"
    p.write_bytes(b"GGUF" + bytes(64))
    return p, r"could not be loaded as a GGUF model|pip install 'rlgrad\[gguf\]'"


def _setup_missing_dir(tmp_path):
    return tmp_path / "no_such_model", r"is not a directory or a \.gguf file"


@pytest.mark.parametrize("setup", [_setup_missing, _setup_text, _setup_empty, _setup_bad_header, _setup_missing_dir])
def test_bad_model_path_is_a_one_line_user_error(tmp_path, setup):
    path, match = setup(tmp_path)
    with pytest.raises(UserError, match=match) as e:
        load_pretrained(path, cache_dir=tmp_path / "cache", log=_quiet)
    assert "\n" not in str(e.value) and str(path) in str(e.value) and "model.path" in str(e.value)


@pytest.mark.parametrize("hub_id", ["Qwen/Qwen2.5-0.5B", "HuggingFaceTB/SmolLM2-135M-Instruct"])
def test_a_hub_id_as_model_path_says_how_to_download_it(hub_id, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no such folder here
    with pytest.raises(UserError) as e:
        load_pretrained(hub_id, cache_dir=tmp_path / "cache", log=_quiet)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"model.path '{hub_id}' is no local folder")
    assert f"hf download {hub_id} --local-dir DIR" in msg and msg.endswith("then set model.path=DIR")
    (tmp_path / hub_id).mkdir(parents=True)  # the same name as a local folder: it is one, read as such
    with pytest.raises(UserError, match="has no config.json"):
        load_pretrained(hub_id, cache_dir=tmp_path / "cache", log=_quiet)


def test_missing_gguf_package_names_the_extra(tmp_path, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "gguf" else real(name, *a))
    p = tmp_path / "m.gguf"
    p.write_bytes(b"GGUF" + bytes(64))
    with pytest.raises(UserError) as e:
        load_pretrained(p, cache_dir=tmp_path / "cache", log=_quiet)
    msg = str(e.value)
    assert "\n" not in msg and str(p) in msg and "gguf package" in msg and "pip install 'rlgrad[gguf]'" in msg


def test_is_gguf(tmp_path):
    (tmp_path / "d.gguf").mkdir()
    (tmp_path / "renamed.bin").write_bytes(b"GGUF\x03\x00\x00\x00")
    (tmp_path / "other.bin").write_bytes(b"PK\x03\x04")
    assert is_gguf(tmp_path / "missing.GGUF") and is_gguf(tmp_path / "renamed.bin")
    assert not is_gguf(tmp_path / "d.gguf") and not is_gguf(tmp_path / "other.bin") and not is_gguf(tmp_path)


def test_cli_missing_gguf_exits_2_with_one_line(tmp_path, capsys, monkeypatch):
    from rlgrad.cli import main

    missing, run = tmp_path / "model.gguf", tmp_path / "run"
    monkeypatch.chdir(tmp_path)  # in process (cli.main, what `python -m rlgrad` calls); test_cli launches `train`
    code = main(["train", f"model.path={missing}", f"trainer.default_local_dir={run}",
                 f"model.cache_dir={tmp_path / 'cache'}"])
    err = capsys.readouterr().err
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("rlgrad: error:") and str(missing) in lines[0], err
    assert not run.exists()


@pytest.mark.e2e
def test_two_grpo_steps_on_smollm2_with_its_chat_template(smol, tmp_path):
    """The real instruct model end to end: prompts through its chat template, the bucket analysis on, the
    completions written with the rendered prompts, a checkpoint that transformers loads."""
    import json

    from transformers import AutoModelForCausalLM

    from rlgrad.cli import main

    run = tmp_path / "run"
    assert main(["train", f"model.path={smol.path}", f"model.cache_dir={smol.cache}", "data.train_batch_size=2",
                 "rollout.n=2", "rollout.response_length=6", "data.val_size=2", "trainer.total_training_steps=2",
                 "trainer.val_before_train=false", "analysis.buckets.every=1", "analysis.buckets.num_buckets=2",
                 "trainer.logger=[jsonl]", "trainer.num_threads=2", f"trainer.default_local_dir={run}"]) == 0
    lines = [json.loads(x) for x in (run / "rollouts" / "step_1.jsonl").read_text().splitlines()]
    assert len(lines) == 4
    for x in lines:
        assert x["prompt"].startswith("<|im_start|>") and x["prompt"].endswith("<|im_start|>assistant\n")
        assert "<|im_start|>user\n" in x["prompt"] and x["finish_reason"] in ("eos", "length")
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert "grad_norm/all/task" in rows[0]["data"] and "val/accuracy" in rows[-1]["data"]
    model = AutoModelForCausalLM.from_pretrained(run / "global_step_2" / "actor", local_files_only=True)
    assert model.config.tie_word_embeddings and sum(p.numel() for p in model.parameters()) > 100e6


def test_a_warm_start_says_how_far_it_is(tmp_path):
    from rlgrad.config.model import TinyModelConfig
    from rlgrad.tasks import build_task

    lines = []
    cfg = ModelConfig(cache_dir=str(tmp_path), warmstart_steps=20, warmstart_batch_size=4,
                      tiny=TinyModelConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                           num_key_value_heads=1, intermediate_size=48))
    models.embedded_default(cfg, build_task("arithmetic", val_size=4), seed=0, log=lines.append)
    progress = [x for x in lines if "warm start: step" in x]
    assert [x.split("step ")[1].split(",")[0] for x in progress] == [f"{k}/20" for k in range(2, 20, 2)]
    assert all("min left" in x for x in progress)
    # each line's loss is the mean of the steps since the previous line: it starts near ln(vocabulary) and falls
    losses = [float(x.split("loss ")[1].split(",")[0]) for x in progress]
    assert 3.0 < losses[0] < 5.0 and losses[-1] < losses[0], losses
    lines.clear()
    models.embedded_default(cfg, build_task("arithmetic", val_size=4), seed=0, log=lines.append)
    assert lines == []  # cached: nothing to say


def test_the_embedded_tokenizer_keeps_spaces_and_newlines_after_the_cache(tmp_path):
    """transformers' AutoTokenizer took the Qwen2 class from config.json and its byte-level pre-tokenizer dropped
    every space and newline of the character tokenizer: sokoban grids and countdown prompts lost their layout."""
    from rlgrad.config.model import TinyModelConfig
    from rlgrad.tasks import build_task

    cfg = ModelConfig(cache_dir=str(tmp_path), warmstart_steps=1, warmstart_batch_size=2,
                      tiny=TinyModelConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                           num_key_value_heads=1, intermediate_size=48))
    _, tok = load_actor(cfg, build_task("arithmetic", val_size=4), seed=0)
    text = "Turn 1:\nState:\n#_P#\n## X #"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert ids == models.build_char_tokenizer()(text, add_special_tokens=False)["input_ids"]
    assert tok.decode(ids) == text and len(ids) == len(text)


def test_runs_that_differ_only_in_trainer_seed_share_one_warm_start(tmp_path):
    from rlgrad.config.model import TinyModelConfig
    from rlgrad.tasks import build_task

    task = build_task("arithmetic", seed=1, val_size=4, weights={})
    tiny = TinyModelConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                           intermediate_size=32)
    cfg = ModelConfig(tiny=tiny, warmstart_steps=2, warmstart_batch_size=4, cache_dir=str(tmp_path))
    built = []
    a = models.initial_weights(cfg, task, seed=1, log=built.append)
    b = models.initial_weights(cfg, task, seed=7, log=built.append)
    assert a == b and len(built) == 1  # the second run read the cache: no second warm start
    per_seed = ModelConfig(tiny=tiny, warmstart_steps=2, warmstart_batch_size=4, cache_dir=str(tmp_path),
                           warmstart_seed=None)
    c = models.initial_weights(per_seed, task, seed=7, log=built.append)
    d = models.initial_weights(per_seed, task, seed=8, log=built.append)
    assert c != d and len(built) == 3
    wa, wc = load_pretrained(a)[0].state_dict(), load_pretrained(c)[0].state_dict()
    assert any(not torch.equal(wa[k], wc[k]) for k in wa)  # seed 7's own initial model differs from the shared one


def test_initializer_range_sets_the_initial_weights_and_only_a_changed_one_renames_the_warm_start():
    """model.tiny.initializer_range is Qwen2's init std (the Sokoban demo's 0.08 leaves the SFT plateau sooner);
    the default keeps the key, so the warm starts shipped before the setting existed are still found."""
    from dataclasses import asdict, replace

    from rlgrad.config.model import TinyModelConfig

    tok = models.build_char_tokenizer()
    wide = TinyModelConfig(hidden_size=64, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                           intermediate_size=64)
    for std in (0.02, 0.08):
        model = models.build_tiny_model(ModelConfig(tiny=replace(wide, initializer_range=std)), tok, seed=0)
        weight = model.model.layers[0].mlp.up_proj.weight  # 64 x 64 normal draws: within 10% of the std
        assert abs(weight.std().item() - std) < 0.1 * std
    default, changed = ModelConfig(), ModelConfig(tiny=TinyModelConfig(initializer_range=0.08))
    old = {k: v for k, v in asdict(default.tiny).items() if k != "initializer_range"}  # the key's input before
    spec = {"v": models.WARMSTART_VERSION, "tiny": old, "task": "arithmetic", "seed": 1,
            "steps": default.warmstart_steps, "lr": default.warmstart_lr, "bs": default.warmstart_batch_size}
    before = models.hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]
    assert models.warmstart_key(default, "arithmetic", 1) == before
    assert models.warmstart_key(changed, "arithmetic", 1) != before


def test_every_task_character_survives_a_save_and_autotokenizer_reload(tmp_path):
    """The embedded default is saved with a qwen2 model config; TRL, verl and the HF tools reload its tokenizer with
    AutoTokenizer, which under transformers 5 takes Qwen2's class and dropped the character tokenizer's spaces and
    newlines. Every character the tasks write must come back as the same token ids, and decode to itself."""
    from transformers import AutoTokenizer

    from rlgrad.config.model import TinyModelConfig
    from rlgrad.tasks import TASK_NAMES, build_task
    from tests.conftest import REPO

    data = REPO / "tests" / "data"
    options = {"math": {"train_files": [str(data / "math_train.jsonl")], "val_files": [str(data / "math_val.jsonl")]},
               "reasoning_gym": {"reasoning_gym": {"dataset": "chain_sum", "config": {}}}}
    alphabet: dict[str, set[str]] = {}
    for name in TASK_NAMES:
        if name == "reasoning_gym" and importlib.util.find_spec("reasoning_gym") is None:
            continue  # an optional extra (rlgrad[reasoning]; the dev install has it)
        task = build_task(name, seed=3, val_size=4, **options.get(name, {}))
        examples = task.train_examples(16, random.Random(3)) + task.val_examples()
        alphabet[name] = {ch for ex in examples for ch in ex.prompt + str(ex.answer)}
        if hasattr(task, "warmstart_pairs"):  # a multi-turn environment: the turns the warm start writes
            contexts, answers = task.warmstart_pairs(4, random.Random(3), "")
            alphabet[name] |= set("".join(contexts + answers))
    tok = models.build_char_tokenizer()
    everything = sorted(set().union(*alphabet.values()))
    assert "\n" in everything and " " in everything  # the tasks' layout: the characters transformers 5 dropped
    def known(ch: str) -> bool:  # one token of its own, not <unk>
        ids = tok(ch, add_special_tokens=False)["input_ids"]
        return len(ids) == 1 and ids[0] != tok.unk_token_id

    unknown = {name: sorted(ch for ch in chars if not known(ch)) for name, chars in alphabet.items()}
    assert not any(unknown.values()), f"task characters outside the tokenizer: {unknown}"
    cfg = ModelConfig(tiny=TinyModelConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                           num_key_value_heads=1, intermediate_size=16))
    model = models.build_tiny_model(cfg, tok, 0)
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["model_type"] == "qwen2"
    again = AutoTokenizer.from_pretrained(tmp_path, local_files_only=True)
    for ch in everything:  # one at a time: a dropped character cannot hide behind its neighbours
        ids = tok(ch, add_special_tokens=False)["input_ids"]
        assert len(ids) == 1 and tok.decode(ids) == ch, repr(ch)
        assert again(ch, add_special_tokens=False)["input_ids"] == ids, (repr(ch), type(again).__name__)
        assert again.decode(ids) == ch, (repr(ch), type(again).__name__)
    text = "".join(everything) + "\n\n  " + "".join(reversed(everything))
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert len(ids) == len(text) and again(text, add_special_tokens=False)["input_ids"] == ids
    assert again.decode(ids) == text == tok.decode(ids)
    assert (again.eos_token_id, again.pad_token_id) == (tok.eos_token_id, tok.pad_token_id)


def _warmstart_lrs(make_sched, steps):
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.AdamW([p], lr=1e-3)
    sched = make_sched(opt)
    lrs = []
    for _ in range(steps):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return lrs


def test_every_warmstart_length_has_a_schedule_and_the_working_ones_are_unchanged():
    for steps in range(1, 31):
        lrs = _warmstart_lrs(lambda opt, s=steps: models.warmstart_schedule(opt, 1e-3, s), steps)
        assert len(lrs) == steps and all(0 < lr <= 1e-3 for lr in lrs)
        if steps != 10:  # 10 crashed (ZeroDivisionError); every other length keeps its schedule exactly
            old = _warmstart_lrs(lambda opt, s=steps: torch.optim.lr_scheduler.OneCycleLR(
                opt, max_lr=1e-3, total_steps=max(s, 2), pct_start=0.1), steps)
            assert lrs == old
    ten = _warmstart_lrs(lambda opt: models.warmstart_schedule(opt, 1e-3, 10), 10)
    assert ten[0] < ten[1] and ten[1:] == sorted(ten[1:], reverse=True)  # a warm-up step, then annealing
