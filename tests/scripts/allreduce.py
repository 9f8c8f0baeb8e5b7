"""Run under torchrun: join the group through the selected backend and all-reduce each rank's number."""

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

import accel_backends

backend = accel_backends.get_backend()
info = backend.init_distributed(timeout=60)
again = backend.init_distributed()  # must be a no-op returning the same place in the job
value = torch.tensor([float(info.rank + 1)], device=backend.metrics_device())
dist.all_reduce(value)
Path(sys.argv[1], f"rank{info.rank}.json").write_text(
    json.dumps(
        {
            "backend": backend.name,
            "dist_backend": dist.get_backend(),
            "rank": info.rank,
            "again_rank": again.rank,
            "world_size": info.world_size,
            "local_rank": info.local_rank,
            "launched": info.launched,
            "sum": value.item(),
        }
    )
)
dist.destroy_process_group()
