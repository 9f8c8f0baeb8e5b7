"""engine/train/schema_docs.py: the presets and options tables of docs/grpo.md and docs/sft.md come from the
schemas and presets. Bug (issue 39): docs/grpo.md's presets table had rows of 3 cells for 4 columns (the `default`
column read `lr: 2e-3` where --print-config says 1e-5) and its options table said max_new_tokens defaults to 4
(512)."""

import json
from pathlib import Path

import pytest

from engine.train import schema_docs
from engine.train.registry import get_recipe

REPO = Path(__file__).resolve().parents[2]


def _table(text: str, name: str) -> list[list[str]]:
    block = text.split(f"<!-- {name} table: generated", 1)[1].split(f"<!-- end of {name} table -->", 1)[0]
    return [[cell.strip() for cell in line.strip()[1:-1].split("|")] for line in block.splitlines()[1:]]


@pytest.mark.parametrize("trainer", ["grpo", "sft"])
def test_the_docs_tables_are_the_generated_ones(trainer):
    page = (REPO / schema_docs.DOCS[trainer]).read_text()
    assert schema_docs.render(page, get_recipe(trainer)) == page, (
        f"{schema_docs.DOCS[trainer]}'s tables differ from the schema: run python -m engine.train.schema_docs")
    presets = _table(page, "presets")
    assert all(len(row) == len(presets[0]) for row in presets), "every row has a cell per column"
    assert len(_table(page, "options")) > 20


def test_the_tables_say_what_print_config_says():
    page = (REPO / "docs/grpo.md").read_text()
    options = {row[0]: row[1] for row in _table(page, "options")}
    assert options["`rollout.n`, `rollout.max_new_tokens`"] == "8, 512"
    presets = {row[0]: row[1:] for row in _table(page, "presets")}
    assert presets["`engine.lr`"] == ["1e-5", "0.002", "1e-6", "1e-6"]  # default, cpu-demo, h100, ascend-910b
    assert presets["`rollout.max_new_tokens`"] == ["512", "4", "512", "512"]
    recipe = get_recipe("grpo")
    from engine.train.config import build_config

    for name in recipe.presets:  # each column is the preset's --print-config
        printed = json.loads(json.dumps(build_config(recipe.schema, recipe.presets, name, None, []).to_dict()))
        assert schema_docs.value_text(printed["train"]["steps"]) in presets["`train.steps`"]


def test_a_drifted_table_is_rewritten_and_a_wrong_row_is_refused():
    recipe = get_recipe("grpo")
    page = (REPO / "docs/grpo.md").read_text()
    row = "| `rollout.n`, `rollout.max_new_tokens` | 8, "
    drifted = page.replace(row + "512 |", row + "4 |")
    drifted = drifted.replace("| `engine.lr` | 1e-5 | 0.002 |", "| `engine.lr` | 0.002 |")  # 3 cells for 5 columns
    assert drifted != page and schema_docs.render(drifted, recipe) == page
    missing = page.replace("| `run.progress` |", "| `run.progress_bar` |")
    with pytest.raises(ValueError, match="names run.progress_bar, which the schema does not have"):
        schema_docs.render(missing, recipe)
    short = page.replace("| `algorithm.clip_c` | null | dual-clip", "| `algorithm.clip_c` | dual-clip")
    with pytest.raises(ValueError, match="has 2 cells for 3 columns"):
        schema_docs.render(short, recipe)
    dropped = "\n".join(line for line in page.splitlines() if not line.startswith("| `train.seed` |")) + "\n"
    added = schema_docs.render(dropped, recipe)
    assert "| `train.seed` | 0 |" in added  # an option no row names gets one, from the schema


def test_the_command_checks_every_page_and_rewrites_a_drifted_one_only_when_asked(tmp_path, monkeypatch, capsys):
    """``python -m engine.train.schema_docs --check`` (what to run after changing a schema) passes on the checkout,
    names a drifted page without touching it (exit 1), and without ``--check`` writes the generated tables back."""
    assert schema_docs.main(["--check"]) == 0 and capsys.readouterr().err == ""
    page = (REPO / schema_docs.DOCS["grpo"]).read_text()
    drifted = tmp_path / "grpo.md"
    row = "| `rollout.n`, `rollout.max_new_tokens` | 8, "
    drifted.write_text(page.replace(row + "512 |", row + "4 |"))  # issue 39's stale default
    monkeypatch.setattr(schema_docs, "DOCS", {"grpo": str(drifted)})  # an absolute page path: read from the copy
    assert schema_docs.main(["--check"]) == 1
    assert capsys.readouterr().err.strip() == f"{drifted}: generated tables differ from the schemas: run python -m " \
                                              "engine.train.schema_docs"
    assert drifted.read_text() != page
    assert schema_docs.main([]) == 0 and drifted.read_text() == page
    assert capsys.readouterr().err.strip() == f"{drifted}: generated tables rewritten"
