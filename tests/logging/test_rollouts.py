"""What the model wrote: rollouts/step_N.jsonl (logging/rollouts.py), `rlgrad samples`, and the report's samples."""

import csv
import html
import json
import math
import os
import shutil
import socket
import subprocess
import sys
from collections import defaultdict

import pytest
import torch

from rlgrad import rundata as D
from rlgrad.cli import main
from rlgrad.config.load import load_config
from rlgrad.logging.rollouts import (
    RolloutLog,
    gather_samples,
    prompt_texts,
    read_rollouts,
    sequence_advantages,
    step_samples,
)
from rlgrad.recipes import make_trainer
from rlgrad.runfiles import read_jsonl, rollout_steps
from tests.conftest import REPO, tiny_overrides

N_PROMPTS, N_SAMPLES, MAX_TOKENS = 4, 4, 4  # tiny_overrides: data.train_batch_size, rollout.n, rollout.response_length


def _overrides(model_cache, run_dir, *extra):
    # a warmer start than tiny_overrides' 5 steps, so that some groups have reward variance
    ov = [o for o in tiny_overrides(model_cache, run_dir) if not o.startswith("model.warmstart_steps")]
    return [*ov, "model.warmstart_steps=40", *extra]


@pytest.fixture(scope="module")
def run(tmp_path_factory, model_cache):
    """A 2-step tiny run with the bucket analysis at every step."""
    run_dir = tmp_path_factory.mktemp("rollouts") / "run"
    assert main(["train", *_overrides(model_cache, run_dir, "trainer.total_training_steps=2",
                                      "analysis.buckets.every=1")]) == 0
    return run_dir


def _metrics(run_dir):
    return {r["step"]: r["data"] for r in read_jsonl(run_dir / "metrics.jsonl")}


def _buckets(run_dir, step):
    with open(run_dir / "analysis" / f"step_{step}" / "group_rv_table.csv", newline="") as f:
        return {int(r["group_id"]): r["bucket"] for r in csv.DictReader(f)}


def _one_error_line(capsys) -> str:
    cap = capsys.readouterr()
    lines = cap.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("rlgrad: error: "), cap.err
    return lines[0]


# ----------------------------------------------------------------------------- the files


def test_one_file_per_step_matching_the_metrics(run):
    assert sorted(p.name for p in (run / "rollouts").iterdir()) == ["step_1.jsonl", "step_2.jsonl"]
    assert rollout_steps(run / "rollouts") == [1, 2]
    metrics = _metrics(run)
    rewards = {r["step"]: r for r in read_jsonl(run / "reward_components.jsonl")}
    for step in (1, 2):
        lines = read_rollouts(run / "rollouts" / f"step_{step}.jsonl")
        m = metrics[step]
        assert len(lines) == N_PROMPTS * N_SAMPLES
        assert [s["index"] for s in lines] == list(range(len(lines)))
        assert all(s["step"] == step for s in lines)
        assert [s["group_id"] for s in lines] == [g for g in range(N_PROMPTS) for _ in range(N_SAMPLES)]
        # the default filter keeps every group: every sample kept, with an advantage
        kept = [s for s in lines if s["kept"]]
        assert len(kept) == len(lines) and all(isinstance(s["advantage"], float) for s in kept)
        assert sum(s["total"] for s in kept) / len(kept) == pytest.approx(m["critic/score/mean"], abs=1e-6)
        assert max(s["total"] for s in kept) == pytest.approx(m["critic/score/max"], abs=1e-6)
        # the per-sample reward components are reward_components.jsonl's (the kept samples, in order)
        samples = rewards[step]["samples"]
        assert [(s["group_id"], s["components"], s["total"]) for s in kept] == [
            (s["group_id"], s["components"], s["total"]) for s in samples]
        # token lengths and finish reasons are the logged response-length metrics
        lengths = [s["response_length"] for s in lines]
        assert all(1 <= n <= MAX_TOKENS for n in lengths)
        assert sum(lengths) / len(lengths) == pytest.approx(m["response_length/mean"], abs=1e-6)
        assert {s["finish_reason"] for s in lines} <= {"eos", "length"}
        assert all(s["response_length"] == MAX_TOKENS for s in lines if s["finish_reason"] == "length")
        clipped = sum(s["finish_reason"] == "length" for s in lines) / len(lines)
        assert clipped == pytest.approx(m["response_length/clip_ratio"], abs=1e-6)
        # GRPO: a sequence's advantage is constant along its response, so the token mean is length-weighted
        adv_mean = sum(s["advantage"] * s["response_length"] for s in kept) / sum(lengths)
        assert adv_mean == pytest.approx(m["critic/advantages/mean"], abs=1e-5)
        by_group = defaultdict(list)
        for s in lines:
            by_group[s["group_id"]].append(s)
        for group in by_group.values():
            totals = torch.tensor([s["total"] for s in group], dtype=torch.float64)
            assert {s["prompt"] for s in group} == {group[0]["prompt"]} and group[0]["prompt"].endswith("=")
            assert group[0]["reward_std"] == pytest.approx(float(totals.std()), abs=1e-5)
            if float(totals.std()) > 0:  # GRPO (norm by std): (s - mean) / (std + eps)
                want = ((totals - totals.mean()) / (totals.std() + 1e-6)).tolist()
                assert [s["advantage"] for s in group] == pytest.approx(want, abs=1e-4)
            else:
                assert all(s["advantage"] == 0.0 for s in group)
        assert all(isinstance(s["response"], str) for s in lines)


def test_the_reader_adds_each_groups_bucket(run):
    rd = D.load_run(run)
    assert D.rollout_dir(rd) == run / "rollouts" and D.rollout_steps(rd) == [1, 2]
    for step in (1, 2):
        table = _buckets(run, step)
        samples = D.rollout_samples(rd, step)
        assert len(samples) == N_PROMPTS * N_SAMPLES
        assert {s["group_id"]: s["bucket"] for s in samples} == table
        groups = D.rollout_groups(rd, step)
        assert [g.group_id for g in groups] == list(range(N_PROMPTS))
        assert all(len(g.samples) == N_SAMPLES and g.kept and g.bucket == table[g.group_id] for g in groups)
    assert D.rollout_samples(rd, 3) == [] and D.rollout_groups(rd, 3) == []


def test_no_bucket_without_an_analysis_of_the_training_batch(run, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(run, copy)
    shutil.rmtree(copy / "analysis" / "step_1")  # step 1 not analysed
    rd = D.load_run(copy)
    assert {s["bucket"] for s in D.rollout_samples(rd, 1)} == {None}
    assert None not in {s["bucket"] for s in D.rollout_samples(rd, 2)}
    # a separate analysis batch (analysis.buckets.env_groups): its group ids are not the training batch's
    rd.config["analysis"]["buckets"]["env_groups"] = 2
    assert {s["bucket"] for s in D.rollout_samples(rd, 2)} == {None}


def test_a_custom_rollout_data_dir_and_the_filter(model_cache, tmp_path, capsys):
    """trainer.rollout_data_dir is honoured (and read back through config.yaml); a dropped sample has no
    advantage."""
    run_dir, out = tmp_path / "run", tmp_path / "elsewhere" / "completions"
    ov = _overrides(model_cache, run_dir, "trainer.total_training_steps=1", f"trainer.rollout_data_dir={out}",
                    "analysis.buckets.every=1", "rollout.rollout_filter_strategy=top_k_abs",
                    "rollout.rollout_filter_value=1")
    assert main(["train", *ov]) == 0
    assert not (run_dir / "rollouts").exists()
    assert sorted(p.name for p in out.iterdir()) == ["step_1.jsonl"]
    lines = read_rollouts(out / "step_1.jsonl")
    assert len(lines) == N_PROMPTS * N_SAMPLES
    kept = [s for s in lines if s["kept"]]
    assert len({s["group_id"] for s in kept}) == 1 and len(kept) == N_SAMPLES  # top_k_abs 1: one group
    assert all(isinstance(s["advantage"], float) for s in kept)
    assert all(s["advantage"] is None for s in lines if not s["kept"])
    rd = D.load_run(run_dir)
    assert D.rollout_dir(rd) == out and D.rollout_steps(rd) == [1]
    groups = D.rollout_groups(rd, 1)
    assert [g.kept for g in groups].count(True) == 1
    assert all(g.bucket is None for g in groups if not g.kept)  # the analysis saw the kept group only
    capsys.readouterr()
    assert main(["samples", str(run_dir)]) == 0
    text = capsys.readouterr().out
    assert "dropped by the rollout filter" in text and "adv –" in text


def test_a_skipped_step_is_written_and_rendered_prompts_are_used(model_cache, tmp_path):
    """The filter kept nothing: the step's file still holds every sample, none kept. A rollout that reports its
    rendered prompts (info["prompts"], the chat template's) is written with them instead of decoded ones."""
    cfg = load_config(overrides=tiny_overrides(model_cache, tmp_path / "run") + ["trainer.total_training_steps=1"])
    t = make_trainer(cfg, log=lambda *a: None)
    rollout = t.rollout

    def with_prompts(examples, n, *a, **k):
        batch, info = rollout(examples, n, *a, **k)
        info["prompts"] = [f"<|user|>{examples[i // n].prompt}<|assistant|>" for i in range(len(batch))]
        return batch, info

    t.rollout = with_prompts
    t.filter = lambda batch, info, among=None: (torch.zeros(len(batch), dtype=torch.bool), {})
    t.fit()
    assert _metrics(tmp_path / "run")[1]["rollout/filter_empty"] == 1.0
    lines = read_rollouts(tmp_path / "run" / "rollouts" / "step_1.jsonl")
    assert len(lines) == N_PROMPTS * N_SAMPLES
    assert all(not s["kept"] and s["advantage"] is None for s in lines)
    assert all(s["prompt"].startswith("<|user|>") and s["prompt"].endswith("=<|assistant|>") for s in lines)


def test_step_samples_and_sequence_advantages():
    rm = torch.tensor([[0, 0, 1, 1, 0], [0, 1, 1, 1, 1]], dtype=torch.float32)
    adv = torch.tensor([[0, 0, 2.0, 2.0, 0], [0, 1.0, 2.0, 3.0, 6.0]])
    assert sequence_advantages(adv, rm, mean=False) == [2.0, 1.0]  # grpo / rloo: the first response token
    assert sequence_advantages(adv, rm, mean=True) == [2.0, 3.0]  # gae: the mean over the response
    assert sequence_advantages(adv[:0], rm[:0], mean=False) == []
    rows = step_samples(3, prompts=["p", "p", "q"], responses=["a", "<b>", ""],
                        group_ids=torch.tensor([5, 5, 6]), components={"correctness": torch.tensor([1.0, 0.0, 0.5])},
                        totals=torch.tensor([1.0, 0.0, 0.5]), reward_std=torch.tensor([0.7, 0.7, 0.0]),
                        lengths=torch.tensor([2.0, 4.0, 1.0]), truncated=torch.tensor([False, True, False]),
                        kept=torch.tensor([True, True, False]), advantages=[0.5, -0.5])
    assert [r["advantage"] for r in rows] == [0.5, -0.5, None]
    assert [r["kept"] for r in rows] == [True, True, False]
    assert [r["finish_reason"] for r in rows] == ["eos", "length", "eos"]
    assert rows[2] == {"step": 3, "index": 2, "group_id": 6, "prompt": "q", "response": "", "components":
                       {"correctness": 0.5}, "total": 0.5, "reward_std": 0.0, "advantage": None, "kept": False,
                       "response_length": 1, "finish_reason": "eos"}
    with pytest.raises(ValueError):
        step_samples(1, prompts=["p"], responses=["a"], group_ids=torch.tensor([0]), components={},
                     totals=torch.tensor([1.0]), reward_std=torch.tensor([0.0]), lengths=torch.tensor([1]),
                     truncated=torch.tensor([False]), kept=torch.tensor([True]), advantages=[])
    assert [r["index"] for r in gather_samples(list(reversed(rows)))] == [0, 1, 2]  # one process: as given


def test_prompts_decoded_from_the_batch_when_the_rollout_gives_none():
    class Chars:  # a tokenizer: token id = character code
        calls = 0

        def decode(self, ids, skip_special_tokens=False):
            assert not skip_special_tokens
            Chars.calls += 1
            return "".join(map(chr, ids))

    pad = 0
    ids = torch.tensor([[pad, 97, 98, 120, 121], [pad, 97, 98, 122, pad], [99, 100, 101, 120, pad]])
    att = torch.tensor([[0, 1, 1, 1, 1], [0, 1, 1, 1, 0], [1, 1, 1, 1, 0]])
    rm = torch.tensor([[0, 0, 0, 1, 1], [0, 0, 0, 1, 0], [0, 0, 0, 1, 0]], dtype=torch.float32)
    assert prompt_texts(Chars(), ids, att, rm) == ["ab", "ab", "cde"]  # left padding and responses left out
    assert Chars.calls == 2  # one decode per distinct prompt


def test_the_file_is_json_lines_with_any_text(tmp_path):
    log = RolloutLog(tmp_path / "r")
    rows = [{"step": 7, "response": "ünïcødé\n<tag> & \"quotes\"", "advantage": None}, {"step": 7, "response": ""}]
    path = log.write(7, rows)
    assert path == tmp_path / "r" / "step_7.jsonl"
    assert read_rollouts(path) == rows
    assert len(path.read_text(encoding="utf-8").splitlines()) == 2
    assert rollout_steps(tmp_path / "r") == [7] and rollout_steps(tmp_path / "missing") == []


# ----------------------------------------------------------------------------- rlgrad samples


def test_samples_prints_the_groups(run, capsys):
    capsys.readouterr()
    assert main(["samples", str(run)]) == 0  # default: the last step with a rollout file
    out = capsys.readouterr().out
    lines = read_rollouts(run / "rollouts" / "step_2.jsonl")
    assert "step 2:" in out and f"{len(lines)} samples in {N_PROMPTS} prompt groups" in out
    for bucket in set(_buckets(run, 2).values()):
        assert bucket in out
    for s in lines:
        assert f"#{s['index']}  total {s['total']:.3f}" in out
        if s["response"].strip() and "\n" not in s["response"]:
            assert s["response"] in out
    assert out.count(lines[0]["prompt"]) >= 1
    assert "reward std" in out and ("eos" in out or "length" in out)

    assert main(["samples", str(run), "--step", "1", "--max", "1"]) == 0
    out = capsys.readouterr().out
    assert "step 1:" in out and "showing 1 of 4 groups" in out and out.count("\ngroup ") == 1

    table = _buckets(run, 1)
    bucket = sorted(set(table.values()))[0]
    assert main(["samples", str(run), "--step", "1", "--bucket", bucket]) == 0
    out = capsys.readouterr().out
    shown = [int(line.split()[1]) for line in out.splitlines() if line.startswith("group ")]
    assert shown == sorted(g for g, b in table.items() if b == bucket)

    assert main(["samples", str(run), "--step", "1", "--group", "2"]) == 0
    out = capsys.readouterr().out
    assert [line.split(" · ")[0] for line in out.splitlines() if line.startswith("group ")] == ["group 2"]


@pytest.mark.parametrize("argv, culprit", [
    (["samples", "{tmp}/nope"], "does not exist"),
    (["samples", "{tmp}/plain"], "no rollout files"),
    (["samples", "{run}", "--step", "9"], "no rollouts for step 9 in"),
    (["samples", "{run}", "--bucket", "bucket_99"], "no bucket 'bucket_99' (buckets: bucket_1"),
    (["samples", "{run}", "--group", "17"], "no group 17 (groups: 0-3)"),
    (["samples", "{run}", "--max", "0"], "--max 0"),
    (["samples", "{run}", "--step", "x"], "invalid int value"),
])
def test_samples_bad_input_exits_2_with_one_line(run, tmp_path, capsys, argv, culprit):
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "metrics.jsonl").write_text('{"step": 1, "data": {"critic/score/mean": 0.5}}\n')
    argv = [a.format(run=run, tmp=tmp_path) for a in argv]
    capsys.readouterr()
    if argv[-1] == "x":
        with pytest.raises(SystemExit) as e:
            main(argv)
        assert e.value.code == 2
    else:
        assert main(argv) == 2
    line = _one_error_line(capsys)
    assert culprit in line
    if "--step" in argv and argv[-1] == "9":
        assert "steps with rollouts: 1-2" in line


def test_samples_bucket_at_a_step_without_analysis(run, tmp_path, capsys):
    copy = tmp_path / "copy"
    shutil.copytree(run, copy)
    shutil.rmtree(copy / "analysis" / "step_2")
    capsys.readouterr()
    assert main(["samples", str(copy), "--step", "2"]) == 0
    assert "no bucket analysis" in capsys.readouterr().out
    assert main(["samples", str(copy), "--step", "2", "--bucket", "1"]) == 2
    assert "analysed steps with rollouts: 1" in _one_error_line(capsys)


# ----------------------------------------------------------------------------- rlgrad report


def test_the_report_shows_samples_of_the_extreme_buckets(run, tmp_path, capsys):
    copy = tmp_path / "copy"
    shutil.copytree(run, copy)
    # a response that must be escaped (the model could write anything)
    f = copy / "rollouts" / "step_2.jsonl"
    lines = read_rollouts(f)
    groups = [g for g in D.rollout_groups(D.load_run(copy), 2) if g.bucket == "bucket_1"]
    first = min(groups, key=lambda g: (g.reward_std, g.group_id))  # the report's first group of the lowest bucket
    target = next(s for s in lines if s["group_id"] == first.group_id)
    target["response"] = '<script>alert("x")</script> & <b>'
    f.write_text("".join(json.dumps(s) + "\n" for s in lines))
    out = tmp_path / "report.html"
    assert main(["report", str(copy), "--output", str(out), "--dpi", "40"]) == 0
    page = out.read_text()
    assert "<script" not in page and html.escape(target["response"]) in page
    assert "What the model wrote" in page and f"rlgrad samples {copy} --step 2" in page
    # step 1's lowest-bucket groups are there too, with their (escaped) responses
    step1 = [s for s in read_rollouts(run / "rollouts" / "step_1.jsonl")
             if _buckets(run, 1)[s["group_id"]] == "bucket_1"]
    assert any(f'<td class="text">{html.escape(s["response"])}</td>' in page for s in step1)
    assert page.count("(lowest reward variance)") >= 2  # one group per analysis step at least
    if len(set(_buckets(run, 2).values())) > 1:
        assert "(highest reward variance)" in page
    assert all(math.isfinite(s["total"]) for s in step1)


# ----------------------------------------------------------------------------- torchrun


@pytest.mark.e2e
def test_two_processes_write_the_one_process_file(model_cache, tmp_path):
    """Under torchrun each rank holds a share of the groups: rank 0 gathers every rank's lines and alone writes the
    file, which is the one-process file (group-seeded sampling). The filter keeps one group, so one rank keeps
    nothing."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    base = tiny_overrides(model_cache) + ["trainer.total_training_steps=1", "rollout.group_seeded_sampling=true",
                                          "rollout.rollout_filter_strategy=top_k_abs", "rollout.rollout_filter_value=1",
                                          "analysis.buckets.every=1"]
    one, two = tmp_path / "one", tmp_path / "two"
    make_trainer(load_config(overrides=base + [f"trainer.default_local_dir={one}"]), log=lambda *a: None).fit()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO / "src")}
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
                        str(port), "-m", "rlgrad", "train", *base, f"trainer.default_local_dir={two}"],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    a, b = (read_rollouts(d / "rollouts" / "step_1.jsonl") for d in (one, two))
    assert len(a) == len(b) == N_PROMPTS * N_SAMPLES
    assert sum(s["kept"] for s in b) == N_SAMPLES
    for x, y in zip(a, b):
        adv_x, adv_y = x.pop("advantage"), y.pop("advantage")
        assert x == y
        assert (adv_x is None and adv_y is None) or adv_x == pytest.approx(adv_y, abs=1e-6)
    assert sorted(p.name for p in (two / "rollouts").iterdir()) == ["step_1.jsonl"]  # no temp files left by rank 1


def test_a_resumed_run_moves_the_files_of_steps_it_recomputes_aside(tmp_path):
    from rlgrad.logging.rollouts import RolloutLog

    log = RolloutLog(tmp_path / "rollouts")
    for s in (1, 2, 3):
        log.write(s, [{"step": s}])
    assert log.discard_after(1) == 2
    assert rollout_steps(tmp_path / "rollouts") == [1]
    assert sorted(p.name for p in (tmp_path / "rollouts" / "discarded").iterdir()) == ["step_2.jsonl", "step_3.jsonl"]
    assert log.discard_after(5) == 0
