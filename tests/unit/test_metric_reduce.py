"""engine/runtime/metric_reduce.py: the key fingerprint and its verdict, and the int64 + float32 encoding of values
whose sums over ranks equal float64's (counts exactly) while no float64 is reduced."""

import math
import random

import pytest
import torch

from engine.runtime.metric_reduce import (
    HASH_BITS,
    HASHES,
    _decode,
    _encode,
    _fingerprint,
    _same_everywhere,
    from_ordered_int,
    grid_bits,
    ordered_int,
    split_on_device,
    split_on_host,
)


def test_the_fingerprint_is_fixed_size_exact_and_depends_on_every_name():
    one = _fingerprint(["loss", "weight"])
    assert len(one) == 2 * HASHES and one == _fingerprint(["loss", "weight"])
    assert all(isinstance(h, int) and 0 <= h < 2**HASH_BITS for h in one[:HASHES])
    assert one[HASHES:] == [h * h for h in one[:HASHES]]  # the squares travel with the pieces
    assert _fingerprint(["loss", "weights"]) != one and _fingerprint(["loss"]) != one
    assert _fingerprint(["a", "bc"]) != _fingerprint(["ab", "c"])  # names are separated, not concatenated


def test_the_verdict_depends_only_on_sums_every_rank_receives():
    def summed(per_rank):  # one fingerprint piece per rank, repeated in every slot
        return [sum(per_rank)] * HASHES + [sum(h * h for h in per_rank)] * HASHES

    assert _same_everywhere(summed([5, 5, 5]), 3)
    # 1, 2, 3: rank 1's own value times 3 equals the sum, so comparing with one's own value would let rank 1
    # carry on alone while ranks 0 and 2 raise; the variance of the sums says "different" on every rank.
    assert not _same_everywhere(summed([1, 2, 3]), 3)
    assert not _same_everywhere(summed([0, 2**HASH_BITS - 1]), 2)


def _reduce_like_a_collective(per_rank: list[dict], world: int) -> dict:
    """What the ranks' all-reduces give: each rank's encoding summed in its own dtype (int64, float32), in rank
    order as a ring does, then decoded."""
    keys = sorted(per_rank[0])
    k = grid_bits(world)
    wholes, fractions = zip(*(_encode(values, keys, torch.device("cpu"), k) for values in per_rank), strict=True)
    whole, fraction = wholes[0].clone(), fractions[0].clone()
    for w, f in zip(wholes[1:], fractions[1:], strict=True):
        whole += w
        fraction += f  # float32 arithmetic: each addition rounds as the collective's would
    return dict(zip(keys, _decode(whole.tolist(), fraction.tolist()), strict=True))


@pytest.mark.parametrize("world", [2, 3, 8, 64])
def test_sums_equal_float64_sums_and_counts_are_exact_above_2_to_the_24(world):
    rng = random.Random(world)
    per_rank = []
    for rank in range(world):
        per_rank.append({
            "loss_sum": rng.uniform(0.0, 3.0) * 4096,  # a weighted loss: a float64 host number
            "tokens": 2**24 + 3 + 1000 * rank,  # a count beyond float32's exact integers
            "tokens_tensor": torch.tensor(2**31 + 7 * rank, dtype=torch.int64),
            "float32_tensor": torch.tensor(rng.uniform(-5.0, 5.0), dtype=torch.float32),
            "tiny": rng.uniform(-1e-9, 1e-9),  # a KL near zero: relative precision, not absolute
            "mixed_sign": rng.uniform(-1.0, 1.0) * 10.0 ** rng.randint(-6, 6),
            "large": rng.uniform(1e12, 1e13),
        })
    got = _reduce_like_a_collective(per_rank, world)
    for key in per_rank[0]:
        values = [float(r[key]) if not torch.is_tensor(r[key]) else r[key].item() for r in per_rank]
        want = math.fsum(values)  # the exactly rounded float64 sum: today's float64 path is no closer than this
        scale = math.fsum(abs(v) for v in values)
        assert abs(got[key] - want) <= 1e-12 * scale + world**3 * 1e-22, (key, got[key], want)
    assert got["tokens"] == sum(r["tokens"] for r in per_rank)  # exact: 2**24 + 3 is not a float32
    assert got["tokens_tensor"] == sum(int(r["tokens_tensor"]) for r in per_rank)


def test_host_and_device_splits_agree_and_are_exact():
    k = grid_bits(2)
    values = torch.tensor([0.0, -0.0, 1.5, -2.75, 3.14159, -1e-8, 7e6 + 0.25, 2.0**40, 1e-30], dtype=torch.float32)
    device_split = split_on_device(values, k)
    for i, value in enumerate(values.tolist()):
        n, h, m, r = split_on_host(value, k)
        assert (n, h, m, r) == tuple(part[i].item() for part in device_split), value
        assert n + h + m + r == value  # float32 values split without rounding
        assert (h * 2**k).is_integer() and abs(h) <= 1.0
        assert (m * 2 ** (2 * k)).is_integer() and abs(m) <= 2.0**-k
    assert split_on_host(7, k) == (7, 0.0, 0.0, 0.0)  # ints are counts
    assert split_on_host(2**63, k)[0] == 0 and split_on_host(1e30, k) == (0, 1e30, 0.0, 0.0)  # float32 alone


def test_non_finite_values_stay_non_finite():
    per_rank = [{"loss": float("nan"), "grad": float("inf")}, {"loss": 1.0, "grad": 2.0}]
    got = _reduce_like_a_collective(per_rank, 2)
    assert math.isnan(got["loss"]) and got["grad"] == float("inf")


def test_the_ordered_int_keeps_the_order_of_floats_and_maps_back_exactly():
    values = [-math.inf, -1e300, -2.0, -1.0, -1e-300, -0.0, 0.0, 1e-300, 0.1, 1.0, 2.0**60 + 1.0, math.inf]
    mapped = [ordered_int(v) for v in values]
    assert mapped == sorted(mapped) and len(set(mapped)) == len(mapped)
    assert all(-2**63 <= m < 2**63 for m in mapped)
    assert [from_ordered_int(m) for m in mapped] == values
    assert math.copysign(1.0, from_ordered_int(ordered_int(-0.0))) == -1.0
    assert ordered_int(math.nan) > ordered_int(math.inf)
