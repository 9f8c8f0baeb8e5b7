"""``sum_over_ranks`` on 3 ranks under the strict device (it refuses float64 reductions): two all-reduces issued
together (int64, float32) when the keys agree, two more beyond the inline slots, and the same ``MetricKeysMismatch``
on every rank whenever any rank's keys differ (never a hang, never a mixed sum); ``max_over_ranks`` likewise; the
strict device's refusal of a float64 reduction."""

import pytest
from distributed import run_ranks


def _reduce_cases(rank):
    import torch
    import torch.distributed as dist

    import accel_backends
    from engine.runtime import metric_reduce as reduce

    accel_backends.get_backend().init_distributed()
    calls = []
    original = dist.all_reduce

    def counted(tensor, *args, **kwargs):
        calls.append((tensor.numel(), str(tensor.dtype).removeprefix("torch.")))
        return original(tensor, *args, **kwargs)

    dist.all_reduce = counted
    device = torch.device("cpu")
    out = {}

    def attempt(name, values):
        calls.clear()
        try:
            out[name] = {"sums": reduce.sum_over_ranks(values, device), "calls": list(calls)}
        except reduce.MetricKeysMismatch as error:
            out[name] = {"error": str(error), "calls": list(calls)}

    attempt("same", {"loss": torch.tensor(rank + 0.5), "weight": float(rank + 1)})
    many = {f"m{i:03d}": float(i * (rank + 1)) for i in range(reduce.VALUE_SLOTS + 9)}
    attempt("many", many)
    attempt("extra_on_rank2", {"loss": 1.0, **({"extra": 2.0} if rank == 2 else {})})
    # Every rank's keys differ from every other's.
    attempt("all_different", {f"only_rank{rank}": 1.0})
    attempt("many_on_rank0", many if rank == 0 else {"loss": 1.0})
    attempt("empty", {})
    attempt("counts_beyond_float32", {"tokens": 2**24 + 1 + rank, "tokens_tensor": torch.tensor(2**40 + rank)})
    calls.clear()
    out["maxima"] = {"max": reduce.max_over_ranks({"staleness_max": float(rank), "tiny": 1e-300 * (rank + 1),
                                                   "negative": -1.5 - rank}, device), "calls": list(calls)}
    calls.clear()
    try:
        reduce.max_over_ranks({"max": 1.0, **({"extra": 2.0} if rank == 1 else {})}, device)
    except reduce.MetricKeysMismatch as error:
        out["maxima_mismatch"] = str(error)
    # The strict device refuses what HCCL refuses: a float64 reduction, in each spelling, before any rank waits.
    from accel_backends.testing.strict_group import ReductionDtypeRefused

    out["refused"] = []
    for reduction in (lambda: dist.all_reduce(torch.zeros(3, dtype=torch.float64)),
                      lambda: dist.reduce_scatter_tensor(torch.zeros(1, dtype=torch.float64),
                                                         torch.zeros(3, dtype=torch.float64))):
        try:
            reduction()
        except ReductionDtypeRefused as error:
            out["refused"].append(str(error))
    return out


@pytest.mark.slow
def test_sums_and_key_checks_agree_on_every_rank():
    results = run_ranks(_reduce_cases, world_size=3, env={"ACCEL_BACKEND": "strict"})
    from engine.runtime.metric_reduce import FRACTION_PARTS, PACKED_SLOTS, VALUE_SLOTS

    first = [(PACKED_SLOTS, "int64"), (FRACTION_PARTS * VALUE_SLOTS, "float32")]
    many = VALUE_SLOTS + 9
    for out in results:
        assert out["same"] == {"sums": {"loss": 4.5, "weight": 6.0}, "calls": first}
        assert out["many"]["sums"] == {f"m{i:03d}": float(i * 6) for i in range(many)}
        assert out["many"]["calls"] == [*first, (many, "int64"), (FRACTION_PARTS * many, "float32")]
        assert "rank 0 lacks 'extra'; rank 1 lacks 'extra'" in out["extra_on_rank2"]["error"]
        assert "rank 1 lacks 'only_rank0', 'only_rank2'" in out["all_different"]["error"]
        assert "rank 1 lacks 'm000'" in out["many_on_rank0"]["error"]
        assert out["empty"] == {"sums": {}, "calls": first}
        counts = out["counts_beyond_float32"]["sums"]
        assert counts == {"tokens": 3 * (2**24 + 1) + 3, "tokens_tensor": 3 * 2**40 + 3}  # exact
        assert out["maxima"]["max"] == {"staleness_max": 2.0, "tiny": 1e-300 * 3, "negative": -1.5}
        assert out["maxima"]["calls"] == [(PACKED_SLOTS, "int64")]
        assert "rank 0 lacks 'extra'; rank 2 lacks 'extra'" in out["maxima_mismatch"]
        assert [e.split(" (")[0] for e in out["refused"]] == ["backend 'strict' does not reduce float64"] * 2
