"""Same-run A/B of the CPU step without autograd (the fast path) against the plain autograd
step and a bare PyTorch loop, batch 1024, Double DQN 256x256 on CartPole data. Kept for
the record of the decision to remove the fast path; it runs only on the commit that adds it:

    python benchmarks/fast_path_ab.py 16
"""

from __future__ import annotations

import random
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.bench_train import Bare, sample_data, time_ours, workflow
from reagent_lite.data.tensordict import TensorDict

data = sample_data("dqn", Path("outputs/bench_data"))
tmp = tempfile.mkdtemp()
fast = workflow("dqn", data, Path(tmp) / "a", "cpu", 1024)
plain = workflow("dqn", data, Path(tmp) / "b", "cpu", 1024)
plain.trainer.fused_step = False
plain.trainer._optimizer_step = plain.trainer.optimizer.step
plain.q_net._relu = None
plain.trainer.target._relu = None
bare = Bare(
    TensorDict({k: v.contiguous() for k, v in fast.train_data.items()}),
    1024,
    False,
    graph=False,
)
c = {
    "fast": lambda n, e: time_ours(fast, n, e),
    "plain": lambda n, e: time_ours(plain, n, e),
    "bare": lambda n, e: bare.time(n),
}
res = {k: [] for k in c}
for r in range(int(sys.argv[1]) if len(sys.argv) > 1 else 12):
    for k in random.Random(r).sample(list(c), 3):
        res[k].append(c[k](150, r + 1))
    print(r, {k: round(v[-1]) for k, v in res.items()}, flush=True)
for a, b in [("fast", "plain"), ("fast", "bare"), ("plain", "bare")]:
    pr = [x / y for x, y in zip(res[a], res[b], strict=True)]
    print(
        a,
        "/",
        b,
        "paired median",
        round(statistics.median(pr), 3),
        "range",
        round(min(pr), 3),
        round(max(pr), 3),
    )
