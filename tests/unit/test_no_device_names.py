"""Device-specific names belong in backend modules only: the engine asks the backend."""

from pathlib import Path

from device_names import DEVICE_NAMES

REPO = Path(__file__).resolve().parents[2]


def test_engine_names_no_device():
    offenders = []
    for path in sorted((REPO / "engine").rglob("*.py")):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            if DEVICE_NAMES.search(code):
                offenders.append(f"{path.relative_to(REPO)}:{number}: {line.strip()}")
    assert list((REPO / "engine").rglob("*.py")), "the engine package is missing"
    assert not offenders, "device names outside accel_backends/backends:\n" + "\n".join(offenders)


def test_the_check_catches_a_device_name(tmp_path):
    assert DEVICE_NAMES.search('x = torch.device("cuda")') and DEVICE_NAMES.search("import torch_npu")
    assert not DEVICE_NAMES.search("backend.device()")
