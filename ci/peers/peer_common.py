"""What the compare scripts (SFT, distillation, preferences against TRL) share: the environment each side's process
runs in, the ratio they report and where they write it. Imported from the scripts' own folder."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def peer_env(extra: dict | None = None) -> dict:
    """One process per side on the CPU backend with ``PEERS_THREADS`` threads (2 unless set), the project importable."""
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("PEERS_THREADS", "2"), "ACCEL_BACKEND": "cpu",
           "PYTHONPATH": str(ROOT)}
    env.update(extra or {})
    return env


def median_ratio(ours: list[float], theirs: list[float]) -> float:
    """The median over rounds of each round's ours / theirs (runs interleaved, so a round shares the machine's load)."""
    return statistics.median(a / b for a, b in zip(ours, theirs, strict=True))


def publish(result: dict, path: Path | None) -> None:
    """Print the result and, with ``--json PATH``, write it there."""
    print(json.dumps(result, indent=2))
    if path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result, indent=2) + "\n")


def comparison_parser(description: str, steps: int, peer: tuple[str, str] | None = None) -> argparse.ArgumentParser:
    """The arguments every side-by-side comparison takes: our interpreter, the peer's (``peer``: its flag and help),
    how many interleaved rounds, steps per run, and where the JSON result goes."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--python", default=sys.executable, help="the interpreter with this project installed")
    flag, help_text = peer or ("--trl-python", "an interpreter with TRL 1.16 installed")
    parser.add_argument(flag, required=True, help=help_text)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=steps)
    parser.add_argument("--json", type=Path)
    return parser
