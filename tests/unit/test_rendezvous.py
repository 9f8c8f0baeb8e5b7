"""accel_backends/rendezvous.py: rank 0's store listens on MASTER_ADDR alone, and an address that is not this
machine's is said in one line (issue 45)."""

import datetime

import pytest

from accel_backends.errors import DistributedSetupError
from accel_backends.rendezvous import bound_listener, job_store


def test_rank_0_refuses_a_master_addr_that_is_not_this_machines_in_one_line():
    with pytest.raises(DistributedSetupError, match=r"rank 0 cannot listen on MASTER_ADDR=192\.0\.2\.1 ") as caught:
        job_store(0, 2, datetime.timedelta(seconds=5), {"MASTER_ADDR": "192.0.2.1", "MASTER_PORT": "29511"})
    assert "\n" not in str(caught.value)


def test_a_bound_listener_listens_on_the_address_it_was_given():
    with bound_listener("127.0.0.1") as listener:
        assert listener.getsockname()[0] == "127.0.0.1" and listener.getsockname()[1] > 0


def test_a_missing_master_port_is_named():
    with pytest.raises(DistributedSetupError, match="MASTER_ADDR and MASTER_PORT must both be set"):
        job_store(0, 2, datetime.timedelta(seconds=5), {"MASTER_ADDR": "127.0.0.1"})
