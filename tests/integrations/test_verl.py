"""rlgrad's instruments inside verl's actor worker (``rlgrad.integrations.verl``), on CPU.

verl pins transformers below the version rlgrad's main environment has, so these tests run in their own
environment: ``bash scripts/test_verl.sh`` (``scripts/test_e2e.sh`` runs it after the e2e tests). In the main
environment they are skipped. verl's FSDP2 engine runs here on CPU processes (gloo), built the way verl's
trainer builds it (``tests/helpers/verl_cpu.py``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from functools import partial
from pathlib import Path

import pytest
import torch

verl = pytest.importorskip("verl", reason="verl is tested in its own environment: bash scripts/test_verl.sh")

from verl.utils import tensordict_utils as tu  # noqa: E402
from verl.workers.engine_workers import TrainingWorker as VerlTrainingWorker  # noqa: E402
from verl.workers.utils.losses import ppo_loss  # noqa: E402

from rlgrad.algos.objective import ActorLoss  # noqa: E402
from rlgrad.analysis import analyse_buckets, analyse_per_sample  # noqa: E402
from rlgrad.config.model import ModelConfig, TinyModelConfig  # noqa: E402
from rlgrad.errors import UserError  # noqa: E402
from rlgrad.integrations.verl import check_verl_version  # noqa: E402
from rlgrad.integrations.verl_loss import batch_from_verl, verl_loss_settings  # noqa: E402
from rlgrad.models import build_char_tokenizer, build_tiny_model  # noqa: E402
from rlgrad.runfiles import DOCTOR_HALT_FILE  # noqa: E402
from tests.helpers.per_sample_dp import metric_close  # noqa: E402
from tests.helpers.verl_cpu import N, R, actor_config, verl_batch, worker  # noqa: E402


def free_port() -> int:
    """A port no process listens on (pid-derived ports collided between the two process groups)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    import torch.distributed as dist

    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(free_port()))
    dist.init_process_group("gloo")  # verl's worker joins an existing group
    root = tmp_path_factory.mktemp("verl")
    tok = build_char_tokenizer()
    cfg = ModelConfig(tiny=TinyModelConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                           num_key_value_heads=1, intermediate_size=64))
    build_tiny_model(cfg, tok, 1).save_pretrained(root / "model")
    tok.save_pretrained(root / "model")
    yield root / "model"
    dist.destroy_process_group()


def grads_of(w) -> dict[str, torch.Tensor]:
    trained = [(n, p) for n, p in w.engine.module.named_parameters() if p.requires_grad]  # LoRA: the adapters
    missing = [n for n, p in trained if p.grad is None]
    assert not missing, missing
    return {n: (p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad).detach().clone()
            for n, p in trained}


def rel_err(ours, ref) -> float:
    num = sum(float((ours[n] - ref[n]).pow(2).sum()) for n in ref)
    den = sum(float(ref[n].pow(2).sum()) for n in ref)
    assert den > 0
    return (num / den) ** 0.5


@pytest.mark.parametrize("agg,kw", [("token-mean", {}), ("seq-mean-token-mean", {}), ("seq-mean-token-sum", {}),
                                    ("token-sum", {"policy_loss": {"loss_mode": "gspo"}, "kl_loss_type": "k3+"})])
def test_bucket_gradients_equal_verl_engine_autograd(model_dir, tmp_path, agg, kw):
    """Each bucket's gradient (all terms) equals verl's own engine running verl's own ppo_loss on those rows."""
    w = worker(model_dir)
    ac = actor_config(loss_agg_mode=agg, **kw)
    w.rlgrad_setup(ac, ["analysis.every=null", "analysis.buckets.enable=false"], tmp_path / "run")
    td, _ = verl_batch()
    batch = batch_from_verl(td)
    assert w.engine.module.is_gradient_checkpointing  # verl's default: the analysis forward turns it off
    with w.rlgrad.analysing() as model:  # verl's own FSDP2 module, no copy
        assert model is w.engine.module and not model.is_gradient_checkpointing
        rep = analyse_buckets(model, batch, ActorLoss(w.rlgrad.settings), num_buckets=2, keep_grads=True)
    assert w.engine.module.is_gradient_checkpointing
    assert set(rep.stats.grads) == {"task", "kl", "entropy"}
    for k, name in enumerate(rep.stats.slices):
        ref = verl_bucket_grads(w, ac, rep.buckets.rows[name])
        ours = {n: sum(rep.stats.grads[t][n][k] for t in rep.stats.grads) for n in ref}
        assert rel_err(ours, ref) < 1e-5, (agg, name, rel_err(ours, ref))


def verl_bucket_grads(w, ac, rows) -> dict[str, torch.Tensor]:
    """verl's own engine running verl's own ppo_loss on ``rows`` of the batch: its gradient."""
    td_rows, _ = verl_batch(rows=rows)
    w.engine.optimizer_zero_grad()
    with w.engine.train_mode():
        tu.assign_non_tensor(td_rows, use_remove_padding=False, use_dynamic_bsz=False, max_token_len_per_gpu=None,
                             micro_batch_size_per_gpu=len(rows), use_fused_kernels=False,
                             global_token_num=[1] * len(rows))
        w.engine.forward_backward_batch(td_rows, partial(ppo_loss, config=ac), forward_only=False)
        return grads_of(w)  # inside: leaving train mode may free the gradients


def test_per_sample_norms_equal_verl_engine_autograd_per_row(model_dir, tmp_path):
    """Each row's gradient norm (``analysis.per_sample`` on verl's FSDP2 module) is that of verl's own engine running
    verl's ppo_loss on that row alone, rescaled from the row's own denominator to the batch's (``u_i / Σ u``); no
    entropy or KL loss: verl's loss is the task term alone."""
    w = worker(model_dir)
    ac = actor_config(entropy_coeff=0.0, use_kl_loss=False)
    w.rlgrad_setup(ac, ["analysis.every=null", "analysis.buckets.enable=false"], tmp_path / "run")
    batch = batch_from_verl(verl_batch()[0])
    loss = ActorLoss(w.rlgrad.settings)
    with w.rlgrad.analysing() as model:
        rep = analyse_per_sample(model, batch, loss, num_buckets=2)
    assert set(rep.norms) == {"task"}
    _, share = loss.agg.weights(batch.response_mask)
    want = torch.tensor([sum(float(g.double().pow(2).sum()) for g in verl_bucket_grads(w, ac, [i]).values()) ** 0.5
                         for i in range(len(batch))], dtype=torch.float64) * share.double() / float(share.sum())
    assert float(want.min()) > 0
    assert torch.allclose(rep.norms["task"].double(), want, rtol=1e-5, atol=1e-7 * float(want.max()))


def test_lora_bucket_gradients_are_verl_engine_autograd_of_the_adapters(model_dir, tmp_path):
    """verl's ``lora_rank``: the instruments measure the adapters of verl's PEFT actor, as its engine does."""
    w = worker(model_dir, lora_rank=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "gate_proj"])
    with torch.no_grad():  # lora_B starts at zero, which would leave every lora_A gradient zero on both sides
        g = torch.Generator().manual_seed(1)
        for n, p in w.engine.module.named_parameters():
            if ".lora_B." in n:
                local = p.to_local() if hasattr(p, "to_local") else p
                local.copy_(torch.randn(local.shape, generator=g) * 0.1)
    ac = actor_config()
    w.rlgrad_setup(ac, ["analysis.every=null", "analysis.buckets.enable=false"], tmp_path / "run")
    batch = batch_from_verl(verl_batch()[0])
    with w.rlgrad.analysing() as model:  # verl's PEFT module under FSDP2 itself, no copy
        assert model is w.engine.module
        rep = analyse_buckets(model, batch, ActorLoss(w.rlgrad.settings), num_buckets=2, keep_grads=True)
    assert sorted(rep.stats.gram["task"]) == ["layer_0", "layer_1"]
    for k, name in enumerate(rep.stats.slices):
        ref = verl_bucket_grads(w, ac, rep.buckets.rows[name])
        assert sorted(ref) == sorted(rep.stats.grads["task"]) and all(".lora_" in n for n in ref)
        assert all(float(ref[n].abs().sum()) > 0 for n in ref if ".lora_A." in n)
        ours = {n: sum(rep.stats.grads[t][n][k] for t in rep.stats.grads) for n in ref}
        assert rel_err(ours, ref) < 1e-5, (name, rel_err(ours, ref))
    # a training step through the worker: every instrument, neuron health on the sharded adapters' rows included
    w.set_loss_fn(partial(ppo_loss, config=ac))
    w.rlgrad_setup(ac, ["analysis.every=1", "analysis.buckets.num_buckets=2"], tmp_path / "run2")
    m = tu.get(w.train_mini_batch(verl_batch(seed=1)[0]), "metrics")
    assert {"grad_norm/all/task", "actor/neuron/dormant_ratio", "actor/param/zero_grad_ratio"} <= set(m)


def test_batch_from_verl_matches_the_padded_batch(model_dir):
    td, d = verl_batch(seed=3)
    b = batch_from_verl(td)
    assert torch.equal(b.input_ids[b.attention_mask.bool()], d["input_ids"][d["attention_mask"].bool()])
    assert torch.equal(b.response_mask[:, -R:], d["response_mask"].float())
    assert torch.equal(b.old_log_probs[:, -R:], d["old_log_probs"])
    assert torch.allclose(b.scores, d["token_level_scores"].sum(1))
    # groups from uid; the reward std is each group's unbiased std
    for gid in b.group_ids.unique():
        rows = (b.group_ids == gid).nonzero().squeeze(-1)
        assert len({d["uid"][int(i)] for i in rows}) == 1 and len(rows) == N
        assert torch.allclose(b.reward_std[rows], b.scores[rows].std().expand(N))


def test_training_unchanged_metrics_and_run_files(model_dir, tmp_path):
    """The same batch through verl's plain worker and rlgrad's: identical weights after two steps; the analysis
    comes back in verl's metric dict and in metrics.jsonl."""
    ac = actor_config()
    plain = worker(model_dir, VerlTrainingWorker)
    plain.set_loss_fn(partial(ppo_loss, config=ac))
    for s in (0, 1):
        plain.train_mini_batch(verl_batch(seed=s)[0])
    ours = worker(model_dir)
    ours.set_loss_fn(partial(ppo_loss, config=ac))
    run = tmp_path / "run"
    ours.rlgrad_setup(ac, ["analysis.every=1", "analysis.buckets.num_buckets=2"], run)
    outs = [ours.train_mini_batch(verl_batch(seed=s)[0]) for s in (0, 1)]
    a = {n: p.full_tensor() for n, p in plain.engine.module.state_dict().items()}
    b = {n: p.full_tensor() for n, p in ours.engine.module.state_dict().items()}
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    initial = {n: p.full_tensor() for n, p in worker(model_dir).engine.module.state_dict().items()}
    assert any(not torch.equal(a[k], initial[k]) for k in a)  # the two steps moved the weights
    m = tu.get(outs[0], "metrics")
    assert {"grad_norm/all/task", "grad_norm/bucket_1/kl", "actor/neuron/dormant_ratio", "actor/pg_loss"} <= set(m)
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert json.loads((run / "metrics_catalogue.json").read_text())["format"] == "rlgrad.metrics_catalogue"
    for r in rows:
        assert {"grad_norm/all/task", "grad_norm/all/entropy", "actor/neuron/dormant_ratio", "actor/pg_loss",
                "actor/grad_norm", "critic/score/mean"} <= set(r["data"])
        assert r["data"]["grad_norm/all/task"] > 0
    written = {p.name for p in (run / "analysis" / "step_1").iterdir()}
    assert {"layers.json", "neurons.json", "group_rv_table.csv"} <= written
    # a new run into the same directory is refused, the first one's files untouched
    before = (run / "metrics.jsonl").read_text()
    again = worker(model_dir)
    again.set_loss_fn(partial(ppo_loss, config=ac))
    again.rlgrad_setup(ac, [], run)
    with pytest.raises(UserError, match="already holds"):
        again.train_mini_batch(verl_batch()[0])
    assert (run / "metrics.jsonl").read_text() == before


def test_hooks_tables_go_to_the_run_and_a_stop_comes_back_to_the_trainer(model_dir, tmp_path):
    """A hook's tables go to tables.jsonl; its stop comes back in the worker's metrics (STOP_METRIC, never in
    metrics.jsonl), which rlgrad's verl trainer takes out of the step's metrics to end verl's loop."""
    from rlgrad.hooks import Hook, HookResult
    from rlgrad.integrations.verl import STOP_METRIC, stop_requested

    class TableAndStop(Hook):
        def before_update(self, ctx):
            return HookResult(tables={"test/rows": (["step", "rows"], [[ctx.step, len(ctx.batch)]])},
                              stop=ctx.step == 2, reason="test")

    ac = actor_config()
    w = worker(model_dir)
    w.set_loss_fn(partial(ppo_loss, config=ac))
    run = tmp_path / "run"
    w.rlgrad_setup(ac, ["analysis.every=null", "analysis.buckets.every=1", "analysis.buckets.num_buckets=2"], run,
                   hooks=[TableAndStop()])
    first, second = (tu.get(w.train_mini_batch(verl_batch(seed=s)[0]), "metrics") for s in (0, 1))
    assert STOP_METRIC not in first and second[STOP_METRIC] == [1.0]
    step_metrics = {f"actor/{STOP_METRIC}": 1.0, "actor/pg_loss": 0.5}  # as verl's trainer reduces the worker's
    assert stop_requested(step_metrics) and step_metrics == {"actor/pg_loss": 0.5}
    assert not stop_requested({"actor/pg_loss": 0.5})
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2] and not any(STOP_METRIC in r["data"] for r in rows)
    tables = [json.loads(x) for x in (run / "tables.jsonl").read_text().splitlines()]
    assert [(x["step"], x["key"]) for x in tables] == [(1, "grad_norm/group_rv_table"), (1, "test/rows"),
                                                       (2, "grad_norm/group_rv_table"), (2, "test/rows")]
    assert tables[1]["rows"] == [[1, 16]] and len(tables[0]["rows"]) == 4  # 16 rows, 4 groups


def test_settings_refused_in_one_line():
    with pytest.raises(UserError, match="loss_mode=sapo"):
        verl_loss_settings(actor_config(policy_loss={"loss_mode": "sapo"}))
    assert verl_loss_settings(actor_config(policy_loss={"loss_mode": "gspo"}, kl_loss_type="k1+")).policy_loss == "gspo"
    with pytest.raises(UserError, match="loss_scale_factor"):
        verl_loss_settings(actor_config(loss_agg_mode="seq-mean-token-sum-norm"))
    s = verl_loss_settings(actor_config(clip_ratio_low=0.1, clip_ratio_high=0.3,
                                        loss_agg_mode="seq-mean-token-sum-norm", loss_scale_factor=64))
    assert (s.policy_loss, s.clip_ratio_low, s.clip_ratio_high, s.horizon, s.kl_loss_coef) == ("ppo", 0.1, 0.3, 64, 0.1)
    with pytest.raises(UserError, match="supports verl >=0.9,<0.10, found 0.8.0"):
        check_verl_version("0.8.0")
    td, _ = verl_batch()
    del td["uid"]
    with pytest.raises(UserError, match="'uid'"):
        batch_from_verl(td)


def test_reference_engine_refused_on_verls_shards(model_dir, tmp_path):
    """The instruments run on verl's FSDP2 shards, where only the fast engine forms the gradients (autograd of
    the shards would be zero): analysis.method=reference is refused in one line at setup."""
    w = worker(model_dir)
    with pytest.raises(UserError, match="FSDP2 shards with analysis.method=fast only"):
        w.rlgrad_setup(actor_config(), ["analysis.method=reference"], tmp_path / "run")


def test_launcher_selects_rlgrad_trainer_and_worker(tmp_path):
    """``python -m rlgrad.integrations.verl_main``: verl's config, the rlgrad trainer registered through verl's
    registry, and rlgrad's worker in the actor role (the GPU launch itself cannot run here)."""
    pytest.importorskip("transfer_queue", reason="verl's V1 trainer needs TransferQueue (verl[verl-core])")
    from hydra import compose, initialize_config_dir
    from verl.trainer.ppo.v1 import get_trainer_cls

    from rlgrad.integrations import verl_main

    with initialize_config_dir(config_dir=verl_main.VERL_CONFIG, version_base=None):
        cfg = compose("ppo_trainer", overrides=[f"trainer.default_local_dir={tmp_path}/ckpt",
                                                "+actor_rollout_ref.rlgrad.analysis.every=5"])
    verl_main.prepare(cfg)
    assert cfg.trainer.v1.trainer_mode == "rlgrad_sync" and get_trainer_cls("rlgrad_sync") is verl_main.RlgradPPOTrainer
    assert cfg.actor_rollout_ref.rlgrad.dir == str(tmp_path / "ckpt" / "rlgrad")
    trainer = verl_main.RlgradPPOTrainer.__new__(verl_main.RlgradPPOTrainer)
    trainer.config = cfg
    trainer._init_resource_pool_mgr()
    actor = [r for r in verl_main.ACTOR_ROLES if r in trainer.role_worker_mapping]
    assert len(actor) == 1
    assert trainer.role_worker_mapping[actor[0]].__ray_actor_class__ is verl_main.ActorRolloutRefWorker
    cfg.trainer.v1.trainer_mode = "separate_async"
    with pytest.raises(UserError, match="trainer_mode=sync"):
        verl_main.prepare(cfg)


def test_overrides_keep_verls_worker_group_registration():
    """verl's worker group exposes only methods carrying verl's @register attributes: every verl method rlgrad's
    workers override keeps them (the launch died with "'RayWorkerGroup' object has no attribute 'init_model'")."""
    from verl.single_controller.base.decorator import MAGIC_ATTR
    from verl.workers import engine_workers as ew

    from rlgrad.integrations import verl as rv

    checked = []
    for ours, theirs in ((rv.TrainingWorker, ew.TrainingWorker), (rv.ActorRolloutRefWorker, ew.ActorRolloutRefWorker)):
        for name, fn in vars(ours).items():
            want = getattr(getattr(theirs, name, None), MAGIC_ATTR, None)
            if callable(fn) and want is not None:
                assert getattr(fn, MAGIC_ATTR, None) == want, f"{ours.__name__}.{name}"
                checked.append(name)
    assert {"init_model", "train_mini_batch", "load_checkpoint"} <= set(checked)


def test_task_runner_travels_by_reference():
    """Ray pickles verl's task runner by value into its own process, which imports nothing: unpickled and
    started in a fresh interpreter, it brings the trainer registration with it."""
    import base64

    import cloudpickle

    from rlgrad.integrations import verl_main

    blob = base64.b64encode(cloudpickle.dumps(verl_main.TaskRunner.__ray_actor_class__)).decode()
    code = ("import base64, pickle, sys; pickle.loads(base64.b64decode(sys.argv[1]))(); "
            "from verl.trainer.ppo.v1 import get_trainer_cls; print(get_trainer_cls('rlgrad_sync').__module__)")
    res = subprocess.run([sys.executable, "-c", code, blob], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.split()[-1] == "rlgrad.integrations.verl_trainer"


def test_cpu_platform_restores_verls_rng_state():
    """A resume from verl's global_step_N restores the RNG states through the platform's device module (the CPU
    launch's resume died with "module 'torch.cpu' has no attribute 'set_rng_state'")."""
    from verl.utils.checkpoint.checkpoint_manager import BaseCheckpointManager

    state = BaseCheckpointManager.get_rng_state()
    expected = torch.rand(3)
    BaseCheckpointManager.load_rng_state(state)
    assert torch.equal(torch.rand(3), expected)


def launch_fixture(out: Path, broken: bool = False) -> Path:
    """scripts/checks/verl_launch_fixture.py's model, tokenizer and parquet data (what the CPU launch trains on)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("verl_launch_fixture", Path(__file__).parents[2] / "scripts"
                                                  / "checks" / "verl_launch_fixture.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.main(out, broken)
    return out


def launch_config(model_path, train_file, *extra):
    from hydra import compose, initialize_config_dir

    from rlgrad.integrations import verl_main

    with initialize_config_dir(config_dir=verl_main.VERL_CONFIG, version_base=None):
        return compose("ppo_trainer", overrides=[f"actor_rollout_ref.model.path={model_path}",
                                                 f"data.train_files={train_file}", *extra])


def test_preflight_encodes_the_first_prompt_as_verls_agent_loop(tmp_path):
    """Before Ray starts, the launcher encodes the first training prompt with verl's own token builder."""
    from transformers import AutoTokenizer

    from rlgrad.integrations import verl_main

    d = launch_fixture(tmp_path)
    ids = verl_main.preflight(launch_config(d / "model", d / "train.parquet"))
    assert AutoTokenizer.from_pretrained(d / "model").decode(ids) == \
        "<|im_start|>user\n0+0=<|im_end|>\n<|im_start|>assistant\n"


def test_launcher_stops_on_a_tokenizer_that_cannot_serve_the_rollout(tmp_path, capsys):
    """A tokenizer that does not fit the data, or verl's token builder for the model type, stops the launch
    before Ray with one line and exit status 2 (in the launch it failed inside the rollout workers)."""
    from rlgrad.integrations import verl_main

    broken = launch_fixture(tmp_path / "broken", broken=True)
    cfg = launch_config(broken / "model", broken / "train.parquet", f"trainer.default_local_dir={tmp_path}/ckpt")
    with pytest.raises(UserError, match=r"20 of them the unknown token '<unk>'"):
        verl_main.preflight(cfg)
    capsys.readouterr()  # the fixture's progress bars
    with pytest.raises(SystemExit) as e:
        verl_main.check(cfg)
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1 and err[0].startswith("rlgrad: error: actor_rollout_ref.model.path=")
    # a qwen2 model_type over a tokenizer that prefixes a word marker as SentencePiece does ("\n" -> "▁", "\n"):
    # verl's Qwen token builder needs "\n" as one token
    import shutil

    good = launch_fixture(tmp_path / "good")
    qwen = shutil.copytree(good / "model", tmp_path / "qwen")
    for name, edit in (("config.json", lambda c: c.update(model_type="qwen2", architectures=["Qwen2ForCausalLM"])),
                       ("tokenizer.json", lambda t: t.update(normalizer={"type": "Prepend", "prepend": "▁"}))):
        data = json.loads((qwen / name).read_text())
        edit(data)
        (qwen / name).write_text(json.dumps(data))
    with pytest.raises(UserError, match=r"cannot tokenize for model_type 'qwen2'.*newline to tokenize to one token"):
        verl_main.preflight(launch_config(qwen, good / "train.parquet"))
    with pytest.raises(UserError, match="data.train_files: no such file"):
        verl_main.preflight(launch_config(tmp_path / "broken" / "model", tmp_path / "missing.parquet"))
    with pytest.raises(UserError, match="cannot load its tokenizer"):
        verl_main.preflight(launch_config(tmp_path / "nothing", broken / "train.parquet"))


def test_hf_cpu_rollout_fails_hard_in_one_line(tmp_path):
    """rlgrad's hf_cpu rollout server: after a generate error every later request and the trainer's next weight
    update fail with the first cause, in one line (verl pads or refills failed groups instead of stopping)."""
    import asyncio

    from rlgrad.integrations.verl_cpu import HFServer

    d = launch_fixture(tmp_path)
    ids = [3, 90, 88, 74, 87]
    ok = HFServer(str(d / "model"))
    out = asyncio.run(ok.generate(ids, {"max_tokens": 4, "temperature": 1.0}, "r0"))
    assert 1 <= len(out.token_ids) == len(out.log_probs) <= 4
    server = HFServer(str(d / "model"), max_model_len=len(ids))
    cause = f"hf_cpu rollout: generate failed: ValueError: a prompt of {len(ids)} tokens leaves no room to generate"
    for call in (lambda: server.generate(ids, {"max_tokens": 4}, "r1"),
                 lambda: server.generate(ids[:2], {"max_tokens": 2}, "r2"),  # would fit: refused all the same
                 lambda: server.update_weights({})):
        with pytest.raises(RuntimeError) as e:
            asyncio.run(call())
        assert str(e.value).startswith(cause) and "\n" not in str(e.value)


def verl_config(model_dir, run_dir, *extra):
    """verl's own ppo_trainer config, as a user would override it for rlgrad's launcher (CPU-sized)."""
    from hydra import compose, initialize_config_dir

    from rlgrad.integrations import verl_main

    a = "actor_rollout_ref"
    with initialize_config_dir(config_dir=verl_main.VERL_CONFIG, version_base=None):
        return compose("ppo_trainer", overrides=[
            f"{a}.model.path={model_dir}", f"{a}.model.use_remove_padding=false", f"{a}.actor.strategy=fsdp2",
            f"{a}.actor.ppo_micro_batch_size_per_gpu=4", f"{a}.rollout.log_prob_micro_batch_size_per_gpu=4",
            f"{a}.actor.use_dynamic_bsz=false", f"+{a}.model.override_config.attn_implementation=eager",
            f"+{a}.actor.fsdp_config.mixed_precision.param_dtype=fp32", f"{a}.actor.use_kl_loss=true",
            f"{a}.actor.kl_loss_coef=0.05", f"+{a}.rlgrad.dir={run_dir}", *extra])


def test_hybrid_worker_built_from_verl_config(model_dir, tmp_path):
    """rlgrad's ActorRolloutRefWorker as verl's trainer builds it from its config (role actor): the rlgrad
    settings from actor_rollout_ref.rlgrad, verl's loss settings, and update_actor as the trainer calls it."""
    from rlgrad.integrations.verl import ActorRolloutRefWorker

    cfg = verl_config(model_dir, tmp_path / "run", "+actor_rollout_ref.rlgrad.analysis.every=2",
                      "+actor_rollout_ref.rlgrad.analysis.buckets.num_buckets=2")
    w = ActorRolloutRefWorker(cfg.actor_rollout_ref, role="actor")
    w.init_model()
    rl = w.actor.rlgrad
    assert rl.cfg.analysis.every == 2 and rl.cfg.analysis.buckets.num_buckets == 2
    assert (rl.settings.use_kl_loss, rl.settings.kl_loss_coef) == (True, 0.05)
    for s in range(3):
        td, _ = verl_batch(seed=s)
        out = w.update_actor(td)
        m = tu.get(out, "metrics")
        assert ("grad_norm/all/task" in m) == (s != 1)  # steps 1 and 3
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3] and "grad_norm/all/kl" in rows[2]["data"]
    assert "grad_norm/all/kl" not in rows[1]["data"] and "actor/kl_loss" in rows[1]["data"]


def test_two_ranks_give_the_one_process_numbers(model_dir, tmp_path):
    """verl's worker sharded over 2 CPU processes, every group split over both: each analysed number of the
    first step (before any update) equals the one-process analysis of the whole batch."""
    ac = actor_config()
    one = worker(model_dir)
    one.set_loss_fn(partial(ppo_loss, config=ac))
    one.rlgrad_setup(ac, ["analysis.every=1", "analysis.buckets.num_buckets=2"], tmp_path / "one")
    one.train_mini_batch(verl_batch(seed=0)[0])
    run = tmp_path / "two"
    script = Path(__file__).resolve().parents[1] / "helpers" / "verl_two_ranks.py"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    res = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                          "--master_port", str(free_port()), str(script), str(model_dir), str(run)],
                         env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    first = {}
    for d in ("one", "two"):
        rows = [json.loads(x) for x in (tmp_path / d / "metrics.jsonl").read_text().splitlines()]
        first[d] = next(r["data"] for r in rows if r["step"] == 1)
    # the bucket analysis and the per-sample norms' metrics (grad_norm_sample/, noise_*/, coherence/, proxy_corr/)
    keys = [k for k in first["one"] if k.startswith(("grad_norm", "noise_", "coherence/", "proxy_corr/"))]
    assert len(keys) > 10 and set(keys) <= set(first["two"]) and "noise_trace/all/task" in keys
    one = {k: float(v) for k, v in first["one"].items()}  # a NaN (a noise estimate the batch cannot tell): "nan"
    for k in keys:
        assert metric_close(k, float(first["two"][k]), one[k], one, abs_=1e-9), (k, first["two"][k], one[k])
    # samples.jsonl: every rank's rows, ranks in order (rank 0 held rows 0, 2, ..., rank 1 rows 1, 3, ...)
    one_rows, two_rows = ([json.loads(x) for x in (d / "analysis" / "step_1" / "samples.jsonl").read_text()
                           .splitlines()] for d in (tmp_path / "one", run))
    held = [*range(0, len(one_rows), 2), *range(1, len(one_rows), 2)]
    assert [r["sample"] for r in two_rows] == list(range(len(one_rows))) and len(one_rows) > 0
    for r, i in zip(two_rows, held):
        for k, v in one_rows[i].items():
            assert k == "sample" or r[k] == (v if isinstance(v, str) else pytest.approx(v, rel=1e-5, abs=1e-9)), (i, k)
    assert first["two"]["critic/score/mean"] == pytest.approx(first["one"]["critic/score/mean"])
    groups = (run / "analysis" / "step_1" / "group_rv_table.csv").read_text()
    assert groups == (tmp_path / "one" / "analysis" / "step_1" / "group_rv_table.csv").read_text()


def test_core_math_equals_verls_core_algos():
    """GSPO, token-sum, the straight-through KL estimators, REINFORCE++(-baseline) and the adaptive KL controller:
    rlgrad's functions against verl's own, values and gradients."""
    import numpy as np
    from verl.trainer.ppo import core_algos as ca
    from verl.workers.config import ActorConfig

    from rlgrad.algos.advantages import reinforce_plus_plus_advantages, reinforce_plus_plus_baseline_advantages
    from rlgrad.algos.aggregation import agg_loss
    from rlgrad.algos.kl import kl_penalty
    from rlgrad.algos.surrogates import policy_loss
    from rlgrad.rl.shaping import KLController

    g = torch.Generator().manual_seed(0)
    mask = (torch.rand(6, 9, generator=g) < 0.8).float()
    mask[:, 0] = 1
    old = -torch.rand(6, 9, generator=g) * 3
    adv = torch.randn(6, generator=g)[:, None] * mask
    for agg in ("token-mean", "token-sum", "seq-mean-token-mean"):
        logp = (old + 0.3 * torch.randn(6, 9, generator=g)).requires_grad_(True)
        cfg = ActorConfig(strategy="fsdp2", rollout_n=1, ppo_micro_batch_size_per_gpu=4, ppo_mini_batch_size=2,
                          clip_ratio_low=0.1, clip_ratio_high=0.15)
        want, metrics = ca.compute_policy_loss_gspo(old, logp, adv, mask, loss_agg_mode=agg, config=cfg)
        got = policy_loss(logp, old, adv, mask, kind="gspo", clip_ratio_low=0.1, clip_ratio_high=0.15,
                          clip_ratio_c=3.0, agg_mode=agg, horizon=9)
        torch.testing.assert_close(got.loss, want)
        (gw,) = torch.autograd.grad(want, logp, retain_graph=True)
        (gg,) = torch.autograd.grad(got.loss, logp)
        torch.testing.assert_close(gg, gw)
        assert float(got.clipfrac) == pytest.approx(metrics["actor/pg_clipfrac"])
    loss = torch.randn(6, 9, generator=g)
    torch.testing.assert_close(agg_loss(loss, mask, "token-sum", horizon=9), ca.agg_loss(loss, mask, "token-sum"))
    ref = -torch.rand(6, 9, generator=g) * 3
    for kind in ("k1+", "kl+", "abs+", "low_var_kl+", "k3+", "k2+", "mse+"):
        lp = (ref + 0.5 * torch.randn(6, 9, generator=g)).requires_grad_(True)
        want, got = ca.kl_penalty(lp, ref, kind), kl_penalty(lp, ref, kind)
        torch.testing.assert_close(got, want)
        torch.testing.assert_close(torch.autograd.grad(got.sum(), lp)[0], torch.autograd.grad(want.sum(), lp)[0])
    rewards = torch.randn(6, 9, generator=g) * mask
    want_a, want_r = ca.compute_reinforce_plus_plus_outcome_advantage(rewards, mask, config=ca.AlgoConfig(gamma=0.9))
    got_a, got_r = reinforce_plus_plus_advantages(rewards, mask, gamma=0.9)
    torch.testing.assert_close(got_a, want_a)
    torch.testing.assert_close(got_r, want_r)
    index = np.array(["a", "a", "b", "b", "b", "c"], dtype=object)
    want_b, _ = ca.compute_reinforce_plus_plus_baseline_outcome_advantage(rewards.clone(), mask, index)
    got_b = reinforce_plus_plus_baseline_advantages(rewards.sum(-1), torch.tensor([0, 0, 1, 1, 1, 2]), mask)
    torch.testing.assert_close(got_b, want_b, rtol=1e-5, atol=1e-6)
    ours, theirs = KLController("adaptive", 0.2, 0.1, 500), ca.AdaptiveKLController(0.2, 0.1, 500)
    for kl, n in ((0.3, 64), (0.05, 32), (0.11, 128)):
        ours.update(kl, n)
        theirs.update(kl, n)
        assert ours.value == pytest.approx(theirs.value, rel=1e-12)


def doctor_trainer(tmp_path, monkeypatch, stream: dict[int, dict], *overrides):
    """rlgrad's verl trainer with verl's step and metric computation replaced by a fake metric stream (step ->
    the metrics verl's trainer would hold after its ``_compute_metrics``), and its checkpoint save recorded."""
    pytest.importorskip("transfer_queue", reason="verl's V1 trainer needs TransferQueue (verl[verl-core])")
    from hydra import compose, initialize_config_dir
    from verl.trainer.ppo.v1 import PPOTrainerSync

    from rlgrad.integrations import verl_main

    with initialize_config_dir(config_dir=verl_main.VERL_CONFIG, version_base=None):
        cfg = compose("ppo_trainer", overrides=[f"trainer.default_local_dir={tmp_path}/ckpt", *overrides])
    verl_main.prepare(cfg)
    monkeypatch.setattr(PPOTrainerSync, "step", lambda self, metrics, timing_raw: None)
    monkeypatch.setattr(PPOTrainerSync, "_compute_metrics", lambda self, batch, metrics, timing_raw, global_steps,
                        epoch: metrics.update(stream[global_steps]))
    trainer = verl_main.RlgradPPOTrainer.__new__(verl_main.RlgradPPOTrainer)
    trainer.config, trainer.saved = cfg, []
    trainer._save_checkpoint = lambda: trainer.saved.append(trainer.global_steps)
    return trainer


def run_verl_loop(trainer, first: int, last: int) -> list[dict]:
    """verl's fit loop as far as the trainer's overrides see it: step, then _compute_metrics, until the bound."""
    trainer.global_steps, trainer.total_training_steps, logged = first, last, []
    while trainer.global_steps <= trainer.total_training_steps:
        metrics = {}
        trainer.step(metrics, {})
        trainer._compute_metrics(None, metrics, {}, trainer.global_steps, 0)
        logged.append(metrics)
        trainer.global_steps += 1
    return logged


def kl_stream(steps: int) -> dict[int, dict]:
    """verl's metric names, rlgrad's worker metrics actor/-prefixed: the KL loss 0 at step 1, then 0.01."""
    return {s: {"actor/kl_loss": 0.0 if s == 1 else 0.01, "critic/score/mean": 0.5, "actor/critic/score/mean": 0.5,
                "actor/entropy": 2.0, "actor/grad_norm/all/task": 0.3, "timing_s/step": 10.0,
                "training/global_step": s} for s in range(1, steps + 1)}


def test_live_doctor_halts_verls_loop_with_a_checkpoint_and_exit_3(tmp_path, monkeypatch, capsys):
    """doctor.halt_on=critical with a KL bound the stream passes at step 2: the finding is said once (console line,
    RUN/doctor.jsonl), verl's checkpoint global_step_2 is saved (save_freq did not ask for it), verl's loop ends
    after logging step 2, and verl_main exits with status 3. The resumed launch (a new trainer, same run
    directory) does not halt again on the finding already said."""
    from rlgrad.integrations import verl_main

    (tmp_path / "t.yaml").write_text("kl_high: 1.0e-3\nkl_floor: 0\n")
    settings = ["trainer.save_freq=10", "+actor_rollout_ref.rlgrad.doctor.halt_on=critical",
                f"+actor_rollout_ref.rlgrad.doctor.thresholds={tmp_path}/t.yaml"]
    trainer = doctor_trainer(tmp_path, monkeypatch, kl_stream(5), *settings)
    logged = run_verl_loop(trainer, 1, 5)
    run = tmp_path / "ckpt" / "rlgrad"
    assert [m["training/global_step"] for m in logged] == [1, 2] and trainer.saved == [2]
    assert all(m["timing_s/doctor"] >= 0 for m in logged)
    said = [json.loads(x) for x in (run / "doctor.jsonl").read_text().splitlines()]
    assert [(r["step"], r["finding"], r["severity"]) for r in said if r["severity"] == "critical"] == \
        [(2, "kl_blowup", "critical")]
    out = capsys.readouterr().out
    assert out.count("CRITICAL kl_blowup") == 1 and "stopped by the doctor after step 2" in out
    assert "verl_main command resumes from verl's global_step_2" in out and f"rlgrad doctor {run}" in out
    with pytest.raises(SystemExit) as stop:
        verl_main.halted(run)
    assert stop.value.code == 3 and "kl_blowup at step 2" in capsys.readouterr().err
    # resumed from global_step_2: verl runs step 3 on; the KL stays high, the finding was said: no halt
    (run / DOCTOR_HALT_FILE).unlink()
    again = doctor_trainer(tmp_path, monkeypatch, kl_stream(5), *settings)
    assert [m["training/global_step"] for m in run_verl_loop(again, 3, 5)] == [3, 4, 5] and again.saved == []
    verl_main.halted(run)  # no halt file: returns


def test_live_doctor_halt_keeps_verls_own_checkpoint_and_last_step(tmp_path, monkeypatch):
    """A halt at a step verl saves anyway saves nothing more; a finding at the last step ends the run as planned
    (no halt, as rlgrad's trainer); doctor.live=false runs no doctor."""
    (tmp_path / "t.yaml").write_text("kl_high: 1.0e-3\nkl_floor: 0\n")
    halt = ["+actor_rollout_ref.rlgrad.doctor.halt_on=critical",
            f"+actor_rollout_ref.rlgrad.doctor.thresholds={tmp_path}/t.yaml"]
    trainer = doctor_trainer(tmp_path / "a", monkeypatch, kl_stream(5), "trainer.save_freq=1", *halt)
    assert len(run_verl_loop(trainer, 1, 5)) == 2 and trainer.saved == []
    trainer = doctor_trainer(tmp_path / "b", monkeypatch, kl_stream(2), "trainer.save_freq=10", *halt)
    assert len(run_verl_loop(trainer, 1, 2)) == 2 and trainer.saved == []
    assert not (tmp_path / "b" / "ckpt" / "rlgrad" / "doctor_halt.json").exists()
    trainer = doctor_trainer(tmp_path / "c", monkeypatch, kl_stream(5), "+actor_rollout_ref.rlgrad.doctor.live=false",
                             *halt)
    logged = run_verl_loop(trainer, 1, 5)
    assert len(logged) == 5 and "timing_s/doctor" not in logged[0]


def test_bad_doctor_setting_stops_before_ray(tmp_path):
    pytest.importorskip("transfer_queue", reason="verl's V1 trainer needs TransferQueue (verl[verl-core])")
    from rlgrad.integrations import verl_main

    cfg = launch_config("m", "t.parquet", f"trainer.default_local_dir={tmp_path}",
                        "+actor_rollout_ref.rlgrad.doctor.halt_on=sometimes")
    with pytest.raises(UserError, match="halt_on"):
        verl_main.prepare(cfg)
