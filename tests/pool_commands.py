"""A trainer's command run on the session's warm rank pool: each rank calls the command as torchrun's ranks do
(``torchrun -m engine.rl.algorithms.grpo.cli ...``: the launcher sees torchrun's variables and runs the worker in
this process), so a 2-rank end-to-end run costs no new interpreter and no torch import. For runs whose checks are
about the run (metrics, checkpoints, resume, logs), not about starting a process: those keep ``run_python``."""

from __future__ import annotations

import contextlib
import io
import subprocess

from distributed import run_ranks


def _command_on_rank(rank: int, name: str, argv: list[str]) -> tuple[int, str, str]:
    from engine.train import cli
    from engine.train.registry import get_recipe

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(get_recipe(name), list(argv))
    return code, out.getvalue(), err.getvalue()


def run_command(name: str, argv: list[str], env: dict | None = None, world_size: int = 2,
                timeout: float = 300) -> subprocess.CompletedProcess:
    """``accel-<name> *argv`` on ``world_size`` pool ranks, read as ``run_python``'s result is: rank 0's exit code,
    stdout and stderr. Every rank must end with rank 0's code. A run that fails in a rank costs the pool its
    workers (as any failed job): fault tests keep their own processes."""
    results = run_ranks(_command_on_rank, name, list(argv), world_size=world_size, env=env, timeout=timeout)
    codes = [code for code, _, _ in results]
    assert len(set(codes)) == 1, f"the ranks ended differently: {codes}\n{results[0][2][-3000:]}"
    code, out, err = results[0]
    return subprocess.CompletedProcess([f"accel-{name}", *argv], code, out, err)


def _rank(rank: int) -> int:
    return rank


def start_pool(world_size: int = 2) -> None:
    """The pool's workers started now (they start at the first job and live for the session): a test that counts
    the processes it leaves behind starts the pool before it counts."""
    assert run_ranks(_rank, world_size=world_size) == list(range(world_size))
