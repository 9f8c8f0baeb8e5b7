"""The presets and options tables of a trainer's page (``docs/grpo.md``, ``docs/sft.md``), generated from its schema
and presets so that they cannot drift from ``--print-config`` again: ``python -m engine.train.schema_docs`` rewrites
them, ``--check`` says which differ (a test runs it).

A generated table sits between ``<!-- NAME table: generated ... -->`` and ``<!-- end of NAME table -->``. The
presets table is written whole: one row per option a preset sets, each preset's resolved value. The options table
keeps the page's own rows and their meanings (prose is the page's), and writes every key and default from the
schema: a row naming an option the schema lacks is an error, an option no row names gets a row of its own, its
meaning the comment beside the field.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import re
import sys
from pathlib import Path

DOCS = {"grpo": "docs/grpo.md", "sft": "docs/sft.md", "distill": "docs/distill.md"}
_BLOCK = re.compile(r"(<!-- (?P<name>presets|options) table: generated[^\n]*-->\n)(?P<body>.*?)"
                    r"(<!-- end of (?P=name) table -->)", re.DOTALL)


def value_text(value) -> str:
    """A value as ``--print-config`` means it, in a table cell: null, true, numbers, `text`, `[a, b]`, `{}`."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return re.sub(r"e([+-])0*(\d)", r"e\1\2", repr(value)).replace("e+", "e")
    if isinstance(value, int):
        return str(value)
    if isinstance(value, (list, tuple)):
        return f"`[{', '.join(str(v) for v in value)}]`"
    if isinstance(value, dict):
        return "`{}`" if not value else f"`{value}`"
    return "`" + str(value).replace("\n", "\\n") + "`"  # a cell is one line


@functools.cache
def _source_lines(cls: type) -> list[str]:
    return inspect.getsource(cls).splitlines()


def _field_comment(owner: type, name: str) -> str:
    """The comment beside a dataclass field (or the comment lines just above it)."""
    for cls in owner.__mro__:
        if name not in getattr(cls, "__annotations__", {}):
            continue
        lines = _source_lines(cls)
        for index, line in enumerate(lines):
            if re.match(rf"\s+{name}\s*:", line):
                if "#" in line:
                    return line.split("#", 1)[1].strip()
                above = []
                for previous in reversed(lines[:index]):
                    if not previous.strip().startswith("#"):
                        break
                    above.insert(0, previous.strip().lstrip("#").strip())
                return " ".join(above)
    return ""


def options(schema: type) -> dict[str, tuple[object, str]]:
    """``{key: (default, comment)}`` for every option of ``schema``: the sections' fields one by one, a section
    nested in a section as one ``section.sub.*`` key, a mapping (``engine``) as ``engine.*``."""
    root, found = schema(), {}
    for field in dataclasses.fields(root):
        value = getattr(root, field.name)
        if dataclasses.is_dataclass(value):
            for inner in dataclasses.fields(value):
                nested = getattr(value, inner.name)
                key = f"{field.name}.{inner.name}" + (".*" if dataclasses.is_dataclass(nested) else "")
                found[key] = ("" if dataclasses.is_dataclass(nested) else nested,
                              _field_comment(type(value), inner.name))
        elif isinstance(value, dict):
            found[f"{field.name}.*"] = (value, _field_comment(schema, field.name))
        else:
            found[field.name] = (value, _field_comment(schema, field.name))
    return found


def _keys(cell: str, known: dict) -> list[str]:
    """The options a row's first cell names: `data.path`, `val_path` (a short name is in the first one's section)."""
    keys, section = [], ""
    for name in re.findall(r"`([^`]+)`", cell):
        key = name if name in known or not section else f"{section}.{name}"
        section = key.rsplit(".", 1)[0] if "." in key else section
        keys.append(key)
    return keys


def options_table(schema: type, body: str) -> str:
    """The options table: the page's rows (meanings kept), keys and defaults from ``schema``, missing keys added."""
    known = options(schema)
    lines = [line for line in body.splitlines() if line.strip()]
    rows, named = [], set()
    for number, line in enumerate(lines[2:], start=3):
        cells = [cell.strip() for cell in re.split(r"(?<!\\)\|", line.strip()[1:-1])]
        if len(cells) != 3:
            raise ValueError(f"options table row {number} has {len(cells)} cells for 3 columns: {line}")
        keys = _keys(cells[0], known)
        unknown = [key for key in keys if key not in known]
        if not keys or unknown:
            raise ValueError(f"options table row {number} names {', '.join(unknown) or 'no option'}, which the "
                             f"schema does not have: {line}")
        named.update(keys)
        default = ", ".join(value_text(known[key][0]) if known[key][0] != "" else "" for key in keys)
        rows.append(f"| {cells[0]} | {default} | {cells[2]} |")
    for key, (default, comment) in known.items():
        if key not in named:
            rows.append(f"| `{key}` | {value_text(default) if default != '' else ''} | {comment} |")
    return "\n".join(["| option | default | meaning |", "|---|---|---|", *rows]) + "\n"


def _resolved(schema: type, presets: dict, name: str) -> dict:
    from .config import EngineConfig, build_config
    from .resume import flatten

    flat = flatten(build_config(schema, presets, name, None, []).to_dict())
    engine = {f"engine.{f.name}": flat.pop(f"engine.{f.name}", f.default) for f in dataclasses.fields(EngineConfig)}
    return {**flat, **engine}  # the engine's options last, in EngineConfig's order


def presets_table(schema: type, presets: dict) -> str:
    """One row per option any preset sets, one column per preset: the value it resolves to."""
    from .resume import flatten

    order = {key: index for index, key in enumerate(_resolved(schema, presets, next(iter(presets))))}
    keys = sorted({key for values in presets.values() for key in flatten(values)}, key=lambda k: order.get(k, 0))
    resolved = {name: _resolved(schema, presets, name) for name in presets}
    rows = [f"| `{key}` | " + " | ".join(value_text(resolved[name].get(key)) for name in presets) + " |"
            for key in keys]
    header = "| key | " + " | ".join(f"`{name}`" for name in presets) + " |"
    return "\n".join([header, "|" + "---|" * (len(presets) + 1), *rows]) + "\n"


def render(text: str, recipe) -> str:
    """``text`` (a trainer's page) with its generated tables written from ``recipe``'s schema and presets."""
    def table(match):
        body = (presets_table(recipe.schema, recipe.presets) if match["name"] == "presets"
                else options_table(recipe.schema, match["body"]))
        return match.group(1) + body + match.group(4)

    return _BLOCK.sub(table, text)


def main(argv: list[str] | None = None) -> int:
    """Rewrite the generated tables of every trainer's page; ``--check``: only say which page differs (exit 1)."""
    from .registry import get_recipe

    argv = sys.argv[1:] if argv is None else argv
    root, stale = Path(__file__).resolve().parents[2], []
    for name, page in DOCS.items():
        path = root / page
        text = path.read_text()
        generated = render(text, get_recipe(name))
        if generated != text:
            stale.append(page)
            if "--check" not in argv:
                path.write_text(generated)
    if stale:
        verb = "differ from the schemas: run python -m engine.train.schema_docs" if "--check" in argv else "rewritten"
        print(f"{', '.join(stale)}: generated tables {verb}", file=sys.stderr)
    return 1 if stale and "--check" in argv else 0


if __name__ == "__main__":
    sys.exit(main())
