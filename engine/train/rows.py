"""Rows of a data file as dicts: JSONL, JSON, Parquet and ``datasets`` ``save_to_disk`` directories (both trainers'
data; Parquet and Arrow need pyarrow). A malformed row fails with the file, the row number and what is wrong."""

from __future__ import annotations

import json
from pathlib import Path


def read_rows(path: str) -> list[dict]:
    """All rows of a JSONL/JSON/Parquet file or a ``datasets`` directory, as dicts."""
    source = Path(path)
    if not source.exists():
        raise FileNotFoundError(f"data file {source} does not exist: set data.path (or data.val_path) to a local "
                                "JSONL, JSON or Parquet file or a datasets save_to_disk directory")
    if source.is_dir():
        return _read_arrow_directory(source)
    suffix = source.suffix.lower()
    if suffix == ".parquet":
        return _read_parquet(source)
    if suffix == ".json":
        return _read_json(source)
    return _read_jsonl(source)


def _read_jsonl(file: Path) -> list[dict]:
    rows = []
    with file.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{file}:{number}: not valid JSON ({exc.msg})") from None
            if not isinstance(row, dict):
                raise ValueError(f"{file}:{number}: expected a JSON object, got {type(row).__name__}")
            rows.append(row)
    return rows


def _read_json(file: Path) -> list[dict]:
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        if exc.lineno > 1 or "Extra data" in exc.msg:  # JSON Lines in a .json file
            return _read_jsonl(file)
        raise ValueError(f"{file}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
    if isinstance(data, dict) and isinstance(data.get("data"), list):
        data = data["data"]
    if not isinstance(data, list) or not all(isinstance(row, dict) for row in data):
        raise ValueError(f"{file}: expected a JSON list of objects (or JSON Lines)")
    return data


def _pyarrow(what: str):
    try:
        import pyarrow  # noqa: F401
        import pyarrow.parquet  # noqa: F401
    except ImportError:
        raise ValueError(f"reading {what} needs pyarrow: pip install 'accel-backends[data]' (or pyarrow)") from None
    return pyarrow


def _read_parquet(file: Path) -> list[dict]:
    pyarrow = _pyarrow("Parquet files")
    try:
        table = pyarrow.parquet.read_table(file)
    except Exception as exc:  # noqa: BLE001 - pyarrow raises several types for a corrupt file
        raise ValueError(f"{file}: not a readable Parquet file ({type(exc).__name__}: {exc})") from None
    return table.to_pylist()


def _read_arrow_directory(directory: Path) -> list[dict]:
    """A ``Dataset.save_to_disk`` directory (its ``data-*.arrow`` files), or a ``DatasetDict``'s train split."""
    if (directory / "dataset_dict.json").is_file():
        splits = json.loads((directory / "dataset_dict.json").read_text()).get("splits", [])
        if "train" not in splits:
            raise ValueError(f"{directory} is a DatasetDict without a train split (splits: {splits}); point "
                             "data.path at one split's directory")
        directory = directory / "train"
    files = sorted(directory.glob("*.arrow"))
    if not files:
        raise ValueError(f"{directory} holds no .arrow files: data.path must be a file or a datasets "
                         "save_to_disk directory")
    pyarrow = _pyarrow("datasets directories")
    rows = []
    for file in files:
        try:
            with pyarrow.memory_map(str(file)) as source:
                rows.extend(pyarrow.ipc.open_stream(source).read_all().to_pylist())
        except Exception as exc:  # noqa: BLE001
            raise ValueError(f"{file}: not a readable Arrow file ({type(exc).__name__}: {exc})") from None
    return rows
