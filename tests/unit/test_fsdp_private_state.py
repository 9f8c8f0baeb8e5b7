"""FSDP's private state is touched in engine/fsdp/private_state.py only: a torch upgrade breaks at most that module."""

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
COMPAT = REPO / "engine" / "fsdp" / "private_state.py"
# FSDP1 handles and flat parameters, FSDP2 state and parameter groups, private torch.distributed.fsdp modules.
PRIVATE_FSDP = re.compile(r"\._handle\b|\._flat_param\b|\bflat_param\b|_get_fsdp_state|_fsdp_param_groups?\b"
                          r"|_sharding_strategy|_use_sharded_(grad_)?views|_local_shard\b|\._sync_gradients"
                          r"|\._lazy_init|_state_ctx|torch\.distributed\.fsdp\._")


def _offenders(paths):
    for path in paths:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if PRIVATE_FSDP.search(line.split("#", 1)[0]):
                yield f"{path.relative_to(REPO)}:{number}: {line.strip()}"


def test_only_compat_touches_fsdp_private_state():
    paths = [p for folder in ("engine", "accel_backends", "plugins") for p in sorted((REPO / folder).rglob("*.py"))
             if p != COMPAT and ".venv" not in p.parts]
    assert len(paths) > 20, "the packages are missing"
    offenders = list(_offenders(paths))
    assert not offenders, "FSDP private state outside engine/fsdp/private_state.py:\n" + "\n".join(offenders)


def test_the_check_finds_what_compat_uses():
    """private_state.py itself must match: otherwise the pattern has drifted from what private state looks like."""
    found = list(_offenders([COMPAT]))
    for name in ("_handle", "_get_fsdp_state", "_sharding_strategy", "_use_sharded_views", "_sync_gradients"):
        assert any(name in line for line in found), f"the pattern no longer matches {name} in private_state.py"
    assert not PRIVATE_FSDP.search("engine.fsdp_version == 1 and compat.fsdp1_flat_params(module)")
