"""engine/runtime/metric_reduce.py: the metric-name fingerprint and the verdict every rank reaches from sums."""

from engine.runtime.metric_reduce import HASH_BITS, HASHES, _fingerprint, _same_everywhere


def test_the_fingerprint_is_fixed_size_exact_and_depends_on_every_name():
    one = _fingerprint(["loss", "weight"])
    assert len(one) == 2 * HASHES and one == _fingerprint(["loss", "weight"])
    assert all(0 <= h < 2**HASH_BITS and float(h).is_integer() for h in one[:HASHES])
    assert one[HASHES:] == [h * h for h in one[:HASHES]]  # the squares travel with the pieces
    assert _fingerprint(["loss", "weights"]) != one and _fingerprint(["loss"]) != one
    assert _fingerprint(["a", "bc"]) != _fingerprint(["ab", "c"])  # names are separated, not concatenated


def test_the_verdict_depends_only_on_sums_every_rank_receives():
    def summed(per_rank):  # one fingerprint piece per rank, repeated in every slot
        return [float(sum(per_rank))] * HASHES + [float(sum(h * h for h in per_rank))] * HASHES

    assert _same_everywhere(summed([5, 5, 5]), 3)
    # 1, 2, 3: rank 1's own value times 3 equals the sum, so comparing with one's own value would let rank 1
    # carry on alone while ranks 0 and 2 raise; the variance of the sums says "different" on every rank.
    assert not _same_everywhere(summed([1, 2, 3]), 3)
    assert not _same_everywhere(summed([0, 8191]), 2)
