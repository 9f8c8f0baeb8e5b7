"""The conformance kit: the CPU backend passes every rule, and broken backends are caught by the rule they break.

The broken backends below are TEST STAND-INS: CPU backends with one deliberate defect each.
"""

import dataclasses
import textwrap

import pytest
import torch
from conftest import REPO, run_python
from device_names import DEVICE_NAMES

from accel_backends import DeviceBackend
from accel_backends.backends.cpu import CPUBackend
from accel_backends.testing import RULE_NAMES, run_conformance

IN_PROCESS = ("attributes", "availability", "devices", "memory", "moves", "rng")


class PeakNeverResets(CPUBackend):
    name = "peak-never-resets"

    def reset_peak_memory_stats(self):
        pass


class AllocationInvisible(CPUBackend):
    name = "allocation-invisible"

    def memory_stats(self):
        return dataclasses.replace(super().memory_stats(), allocated=1 << 30, peak_allocated=1 << 30)


class LossyMoves(CPUBackend):
    name = "lossy-moves"

    def to_host(self, tensor, non_blocking=False):
        return tensor.to(torch.float16).to(tensor.dtype) if tensor.is_floating_point() else tensor.clone()


class DropsLastElement(CPUBackend):
    name = "drops-last-element"

    def to_device(self, tensor, non_blocking=False):
        moved = tensor.clone()
        if moved.numel():
            moved.view(-1)[-1] = 0 if moved.dtype != torch.bool else not bool(moved.view(-1)[-1])
        return moved


class ForgetfulRNG(CPUBackend):
    name = "forgetful-rng"

    def set_rng_state(self, state):
        pass


class ProbeRaises(CPUBackend):
    name = "probe-raises"

    def unavailable_reason(self):
        raise OSError("libvendor.so: cannot open shared object file")


class BadlyNamed(CPUBackend):
    name = "My Device"


class Unavailable(DeviceBackend):
    name = "absent"
    device_type = "cpu"

    def unavailable_reason(self):
        return "the vendor driver is not installed: install it"


@pytest.mark.parametrize(
    ("backend", "rule", "message"),
    [
        (PeakNeverResets(), "memory", "reset_peak_memory_stats() did not reset the peak"),
        (AllocationInvisible(), "memory", "moved `allocated` by only 0 MiB"),
        (LossyMoves(), "moves", "the float32 tensor changed on its way to the device and back"),
        (DropsLastElement(), "moves", "the float32 tensor changed"),
        (ForgetfulRNG(), "rng", "set_rng_state(rng_state()) did not restore the generators"),
        (ProbeRaises(), "availability", "unavailable_reason() must never raise; it raised OSError: libvendor.so"),
        (BadlyNamed(), "attributes", "`name` must be lower case"),
    ],
    ids=lambda value: getattr(value, "name", None),
)
def test_a_broken_backend_fails_exactly_the_rule_it_breaks(backend, rule, message):
    results = {r.rule: r for r in run_conformance(backend, rules=IN_PROCESS)}
    assert results[rule].status == "failed" and message in results[rule].detail, results[rule]
    assert "[contract: " in results[rule].detail, "a failure names the rule of the contract it broke"
    others = {name: r.status for name, r in results.items() if name != rule}
    assert "failed" not in others.values(), others


def test_an_unavailable_backend_passes_availability_and_skips_the_rest_with_its_reason():
    results = run_conformance(Unavailable())  # the multi-process rules are skipped too: nothing is spawned
    assert [r.rule for r in results] == list(RULE_NAMES)
    availability = results[1]
    assert availability.status == "passed" and "the vendor driver is not installed" in availability.detail
    for result in results[2:]:
        assert result.status == "skipped" and "not available here: the vendor driver" in result.detail


def test_unknown_rule_is_refused_before_any_work():
    with pytest.raises(KeyError, match="no conformance rule 'memroy'; the rules are attributes"):
        run_conformance("cpu", rules=["memroy"])


class LonelyRanks(CPUBackend):
    """Ignores the launcher: every rank makes a group of one, so an all-reduce sums nothing."""

    name = "lonely-ranks"

    def init_distributed(self, timeout=60.0):
        import torch.distributed as dist

        from accel_backends.distributed import DistributedInfo

        if not dist.is_initialized():
            dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        return DistributedInfo(rank=0, world_size=1, local_rank=0, local_world_size=1, launched=False)


@pytest.mark.slow
def test_a_backend_that_does_not_join_the_group_fails_distributed_and_skips_the_engine():
    distributed, engine = run_conformance(LonelyRanks(), nproc=2, rules=("distributed", "engine-fsdp2"))
    assert distributed.status == "failed"
    assert "rank 1: init_distributed() returned rank 0 of 1; the launcher said 1 of 2" in distributed.detail
    assert engine.status == "skipped" and "needs the 'distributed' rule to hold" in engine.detail


@pytest.mark.slow
def test_cpu_passes_every_rule_from_the_command_line():
    result = run_python(["-m", "accel_backends.testing", "cpu", "--nproc", "2"], timeout=600)
    lines = result.stdout.splitlines()
    assert result.returncode == 0, result.stdout + result.stderr
    assert lines[0].startswith("conformance of backend 'cpu'") and "accel-backends (built-in)" in lines[0]
    # The ranks' gloo on torch 2.10 prints (interleaved) connection lines among the kit's: compare the kit's.
    rules = [line.split(":")[0] for line in lines[1:-1] if line.startswith(("PASSED", "FAILED", "SKIPPED"))]
    assert rules == [f"PASSED  {name}" for name in RULE_NAMES]
    assert lines[-1] == f"{len(RULE_NAMES)} passed, 0 failed, 0 skipped"


@pytest.mark.cuda
@pytest.mark.slow
def test_cuda_passes_every_rule_on_a_gpu_machine():
    import torch

    nproc = str(min(2, torch.cuda.device_count()))
    result = run_python(["-m", "accel_backends.testing", "cuda", "--nproc", nproc], timeout=600)
    assert result.returncode == 0 and f"{len(RULE_NAMES)} passed" in result.stdout, result.stdout + result.stderr


def test_command_line_errors_are_one_line(capsys):
    from accel_backends.testing.cli import main

    assert main(["nosuch"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: unknown backend 'nosuch'") and err.count("\n") == 1


VENDOR_SUITE = '''
from accel_backends.backends.cpu import CPUBackend
from accel_backends.testing import BackendConformance


class Truncating(CPUBackend):
    name = "truncating"

    def to_host(self, tensor, non_blocking=False):
        return tensor.to(tensor.dtype).flatten()[:-1] if tensor.numel() > 1 else tensor


class TestTruncating(BackendConformance):
    backend = Truncating()
'''


@pytest.mark.slow
def test_pytest_plugin_and_vendor_suite(tmp_path):
    (tmp_path / "test_vendor.py").write_text(textwrap.dedent(VENDOR_SUITE))
    args = ["-m", "pytest", "-p", "accel_backends.testing", "--accel-backend", "cpu", "-k", "moves or memory",
            "-p", "no:cacheprovider", "-rA", "-q", "--rootdir", str(tmp_path), str(tmp_path / "test_vendor.py")]
    result = run_python(args)
    # "FAILED path::node - reason": pytest adds the reason in CI (CI=true) and may truncate it elsewhere.
    outcomes = {line.split()[1].split("::", 1)[-1]: line.split()[0] for line in result.stdout.splitlines()
                if line.startswith(("PASSED", "FAILED"))}
    assert outcomes == {"conformance[cpu-memory]": "PASSED", "conformance[cpu-moves]": "PASSED",
                        "TestTruncating::test_conformance[memory]": "PASSED",
                        "TestTruncating::test_conformance[moves]": "FAILED"}, result.stdout
    assert "conformance rule 'moves' broke: the float32 tensor changed" in result.stdout
    assert result.returncode == 1


def test_the_kit_and_the_trace_plugin_name_no_device():
    sources = [*(REPO / "accel_backends" / "testing").glob("*.py"), *(REPO / "plugins" / "accel-trace").rglob("*.py")]
    offenders = [f"{p.name}:{n}" for p in sources for n, line in enumerate(p.read_text().splitlines(), 1)
                 if DEVICE_NAMES.search(line.split("#", 1)[0])]
    assert sources and not offenders


class LoopbackAllToAll(CPUBackend):
    """An all-to-all that keeps what each rank sent (a library that only copies locally)."""

    name = "loopback-all-to-all"

    def all_to_all(self, output, input, group=None):
        output.copy_(input)


@pytest.mark.slow
def test_an_all_to_all_that_exchanges_nothing_fails_its_rule():
    (result,) = run_conformance(LoopbackAllToAll(), nproc=2, rules=("all-to-all",))
    assert result.status == "failed"
    # Both ranks get their own chunks back; whichever reports first is named.
    rank1 = "rank 1: all_to_all() gave [100.0, 100.0, 100.0, 101.0, 101.0, 101.0], expected [1.0"
    rank0 = "rank 0: all_to_all() gave [0.0, 0.0, 0.0, 1.0, 1.0, 1.0], expected [0.0, 0.0, 0.0, 100.0"
    assert rank1 in result.detail or rank0 in result.detail, result.detail
