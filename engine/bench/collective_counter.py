"""Count the collectives a piece of work issues (benchmarks and tests compare counts, not times)."""

from __future__ import annotations

from collections import Counter

import torch.distributed as dist

# Names differ across torch versions (FSDP in torch 2.13 calls the *_single ones); all are counted by kind.
COLLECTIVES = {
    "all_gather": ("all_gather_single", "all_gather_into_tensor", "_all_gather_base", "all_gather"),
    "reduce_scatter": ("reduce_scatter_single", "reduce_scatter_tensor", "_reduce_scatter_base", "reduce_scatter"),
    "all_reduce": ("all_reduce",),
}


class CollectiveCounter:
    """While active, counts calls through ``torch.distributed`` by kind (only the outermost of nested calls).

    FSDP looks these functions up on the module at call time, so wrapping the module attributes sees them all.
    """

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self._depth = 0
        self._saved: dict[str, object] = {}

    def __enter__(self) -> CollectiveCounter:
        for kind, names in COLLECTIVES.items():
            for name in names:
                original = getattr(dist, name, None)
                if original is not None:
                    self._saved[name] = original
                    setattr(dist, name, self._wrap(kind, original))
        return self

    def _wrap(self, kind: str, original):
        def counted(*args, **kwargs):
            if self._depth == 0:
                self.counts[kind] += 1
            self._depth += 1
            try:
                return original(*args, **kwargs)
            finally:
                self._depth -= 1

        return counted

    def __exit__(self, *exc) -> None:
        for name, original in self._saved.items():
            setattr(dist, name, original)
        self._saved.clear()
