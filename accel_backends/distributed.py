"""What a launcher (torchrun, or ``accel-grpo --nproc``) tells a process about its place in the job."""

from __future__ import annotations

import dataclasses
import os

from .errors import DistributedSetupError

LAUNCHER_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


@dataclasses.dataclass(frozen=True)
class DistributedInfo:
    """This process's coordinates; ``launched`` is False for a plain ``python`` run (a group of one)."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    launched: bool


def read_launcher_env(environ=None) -> DistributedInfo:
    """Read torchrun's variables; none set means a single process, some set is an error that names the gap."""
    environ = os.environ if environ is None else environ
    present = [k for k in LAUNCHER_VARIABLES if k in environ]
    if not present:
        return DistributedInfo(rank=0, world_size=1, local_rank=0, local_world_size=1, launched=False)
    missing = [k for k in LAUNCHER_VARIABLES if k not in environ]
    if missing:
        raise DistributedSetupError(
            f"incomplete launcher environment: {', '.join(present)} set but {', '.join(missing)} missing. "
            "Start the job with torchrun (it sets all of them), or unset them to run as a single process."
        )
    values = {}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        raw = environ.get(key, environ["WORLD_SIZE"] if key == "LOCAL_WORLD_SIZE" else None)
        try:
            values[key] = int(raw)
        except ValueError:
            raise DistributedSetupError(f"{key}={raw!r} is not an integer") from None
    if not 0 <= values["RANK"] < values["WORLD_SIZE"]:
        raise DistributedSetupError(f"RANK={values['RANK']} is outside WORLD_SIZE={values['WORLD_SIZE']}")
    return DistributedInfo(
        rank=values["RANK"],
        world_size=values["WORLD_SIZE"],
        local_rank=values["LOCAL_RANK"],
        local_world_size=values["LOCAL_WORLD_SIZE"],
        launched=True,
    )
