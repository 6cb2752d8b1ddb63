"""Every logged number of 6 steps with the task-term instruments (every step, riding on the update: the setting of
bench/always_on_cost.py --instruments task actor.ppo_micro_batch_size=128), as the repr of each float, and every step
file's text, into one JSON file; run on two trees (``PYTHONPATH=<tree>/src``), then ``--compare`` the two files.
``timing_s/*`` are left out (wall times).

    OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 PYTHONPATH=$PWD/src python same_numbers.py OUT.json
    python same_numbers.py --compare A.json B.json
"""
import json
import pathlib
import sys
import tempfile

import torch

from rlgrad.config.load import load_config
from rlgrad.logging.sinks import MetricLogger
from rlgrad.recipes import make_trainer

if sys.argv[1] == "--compare":
    a, b = (json.load(open(p)) for p in sys.argv[2:4])
    assert set(a) == set(b), set(a) ^ set(b)
    for k in sorted(a):
        same = a[k] == b[k]
        what = f"{len(a[k])} metrics" if k.startswith("metrics/") else "file"
        print(f"{'same' if same else 'DIFFERENT'}: {k} ({what})")
    print(f"{sum(a[k] != b[k] for k in a)} of {len(a)} differ")
    sys.exit(0)
TASK = ["analysis.buckets.every=1", "analysis.components.every=1", "analysis.per_sample.every=1",
        "analysis.per_sample.terms=[task]", "actor.entropy_coeff=0", "actor.use_kl_loss=false"]
torch.set_num_threads(1)
out = {}
with tempfile.TemporaryDirectory() as tmp:
    cfg = load_config(overrides=["trainer.logger=[]", f"trainer.default_local_dir={tmp}/run", "trainer.num_threads=1",
                                 "actor.ppo_micro_batch_size=128", *TASK])
    tr = make_trainer(cfg, log=lambda *a: None)
    lg = MetricLogger([])
    for k in range(1, 7):
        m, _ = tr.train_step(k, lg)
        out[f"metrics/{k}"] = {key: (repr(v) if isinstance(v, float) else v) for key, v in sorted(m.items())
                               if not key.startswith("timing_s/")}
    for p in sorted(pathlib.Path(tmp, "run", "analysis").rglob("*")):
        if p.is_file():
            out[str(p.relative_to(tmp))] = p.read_text()
json.dump(out, open(sys.argv[1], "w"), indent=0, sort_keys=True)
