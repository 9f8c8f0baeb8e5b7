"""What ``ci/gpu-check.sh`` leaves in its output folder, rewritten as each step ends (a later step that hangs or
dies loses nothing): ``gpu-check.json`` (every figure), ``gpu-check.md`` (the report cards and the step figures
as tables) and ``gpu-check.log`` (every step's command, output and verdict). Three files: a lent machine sends
back at most 8, none deeper than ``$OUT/a/b/file``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

FILES = ("gpu-check.json", "gpu-check.md", "gpu-check.log")
# The step figures read from a trainer's metrics.jsonl; "n/a" where the metrics do not carry one.
STEP_FIGURES = ("tokens_per_s", "step_time_s", "rollout_time_s", "update_time_s", "peak_memory_gib", "perf/mfu")
MFU_PHASE = re.compile(r"^perf/mfu/(.+)$")
PEAK_PHASE = re.compile(r"^peak_memory_gib/(.+)$|^(.+)/peak_memory_gib$")


def step_figures(metrics: list[dict]) -> dict:
    """The last step's throughput, MFU per phase and peak memory (per phase where the metrics carry it)."""
    if not metrics:
        return {}
    last = metrics[-1]
    figures = {key: last.get(key, "n/a") for key in STEP_FIGURES}
    figures["mfu_per_phase"] = {m.group(1): v for k, v in last.items() if (m := MFU_PHASE.match(k))} or "n/a"
    figures["peak_memory_gib_per_phase"] = {next(g for g in m.groups() if g): v for k, v in last.items()
                                            if (m := PEAK_PHASE.match(k))} or "n/a"
    figures["steps"] = len(metrics)
    return figures


class Report:
    """The output folder's three files, kept in step with ``doc``."""

    def __init__(self, out: Path, doc: dict):
        self.out, self.doc = out, doc
        out.mkdir(parents=True, exist_ok=True)
        (out / "gpu-check.log").write_text(f"gpu-check started {doc['started']} ({doc['mode']}, geometries "
                                           f"{', '.join(doc['geometries'])})\n")
        self.write()

    def log(self, text: str) -> None:
        with open(self.out / "gpu-check.log", "a") as log:
            log.write(text if text.endswith("\n") else text + "\n")

    def step_done(self, name: str, record: dict, output: str) -> None:
        self.doc["steps"][name] = record
        self.log(f"\n===== {name}: {record['cmd']}\n{output.rstrip()}\n===== {name}: "
                 f"{'ok' if record['ok'] else 'FAILED'} (rc {record['rc']}) in {record['seconds']} s")
        self.write()

    def write(self) -> None:
        (self.out / "gpu-check.json").write_text(json.dumps(self.doc, indent=2, default=str))
        (self.out / "gpu-check.md").write_text(markdown(self.doc))


def _cell(value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, dict):
        return ", ".join(f"{k} {_cell(v)}" for k, v in value.items())
    return str(value)


def markdown(doc: dict) -> str:
    env = doc.get("environment", {})
    lines = [f"# GPU check ({doc['mode']}), started {doc['started']}", "",
             f"torch {env.get('torch', '?')}, backend {env.get('selected_backend', '?')}, devices "
             f"{env.get('gpus', env.get('device', '?'))}", "", "## Steps", "",
             "| step | verdict | seconds | limit s |", "|---|---|---|---|"]
    for name, record in doc["steps"].items():
        verdict = "ok" if record["ok"] else f"FAILED ({record.get('failure', 'run')}, rc {record['rc']})"
        lines.append(f"| {name} | {verdict} | {record['seconds']} | {record['limit_s']} |")
    figures = {name: r["figures"] for name, r in doc["steps"].items() if r.get("figures")}
    if figures:
        keys = [*STEP_FIGURES, "mfu_per_phase", "peak_memory_gib_per_phase"]
        lines += ["", "## Step figures (the last step of each run)", "", "| run | " + " | ".join(keys) + " |",
                  "|---" * (len(keys) + 1) + "|"]
        for name, row in figures.items():
            lines.append(f"| {name} | " + " | ".join(_cell(row.get(k, "n/a")) for k in keys) + " |")
    overhead = doc["steps"].get("bench_overhead", {}).get("result", {}).get("scenarios", {}).get("overhead")
    if overhead:
        lines += ["", f"## Engine overhead: the engine's step over a hand-written FSDP2 loop "
                      f"{_cell(overhead['engine_over_hand_written'])} (medians {_cell(overhead['engine']['median_ms'])}"
                      f" ms and {_cell(overhead['hand_written']['median_ms'])} ms, {overhead['micro_batches']} "
                      "micro-batches)"]
    for name, record in doc["steps"].items():
        if record.get("card_markdown"):
            lines += ["", record["card_markdown"].replace("### Report card", f"## {name}: report card", 1)]
    return "\n".join(lines) + "\n"
