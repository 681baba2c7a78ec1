"""Run under ``torchrun --nproc_per_node 2``: ranks score different numbers of rows under
ZeRO-3 (every parameter partitioned), one of them without a response. Each rank writes
``rank<N>.json`` into the directory given as the second argument. Used by test_distributed."""

import json
import sys
from pathlib import Path

from training.batching import TrainRow
from training.trainer import Trainer

trainer = Trainer(
    sys.argv[1],
    {"zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0}},
    1e-3,
    reference=False,
    micro_batch_tokens=32,  # one row per micro-batch
)
row = TrainRow(list(range(5, 25)), [7, 8, 9], [0.0] * 3)
rows = [row] * (4 if trainer.rank == 0 else 1) + [TrainRow([5, 6], [], [])]
scored = trainer.logprobs(rows)
result = {"rank": trainer.rank, "lengths": [len(s) for s in scored], "first": scored[0]}
(Path(sys.argv[2]) / f"rank{trainer.rank}.json").write_text(json.dumps(result))
