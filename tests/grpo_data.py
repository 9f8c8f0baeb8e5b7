"""Data for the GRPO tests: the fixture model and small files in verl's and TRL's layouts."""

import json
from pathlib import Path

QUESTIONS = [(f"Tom has {a} apples and buys {b} more. How many apples does he have?", str(a + b))
             for a, b in ((2, 3), (4, 5), (7, 1), (6, 6), (3, 9), (8, 2), (5, 4), (1, 1), (9, 3), (2, 7), (4, 4),
                          (6, 1))]


def verl_rows(pairs=QUESTIONS, split="train"):
    """verl's GSM8K parquet layout: chat-message prompt, reward_model.ground_truth, data_source, extra_info."""
    return [{"data_source": "openai/gsm8k", "prompt": [{"role": "user", "content": question}], "ability": "math",
             "reward_model": {"style": "rule", "ground_truth": answer},
             "extra_info": {"split": split, "index": index}} for index, (question, answer) in enumerate(pairs)]


def write_parquet(path, rows):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), path)
    return Path(path)


def write_datasets_dir(directory, rows):
    """What ``Dataset.save_to_disk`` writes: Arrow stream files plus its JSON metadata."""
    import pyarrow as pa

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    table = pa.Table.from_pylist(rows)
    with pa.OSFile(str(directory / "data-00000-of-00001.arrow"), "wb") as sink:
        with pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
    (directory / "state.json").write_text(json.dumps({"_data_files": [{"filename": "data-00000-of-00001.arrow"}]}))
    (directory / "dataset_info.json").write_text("{}")
    return directory


def write_jsonl(path, rows):
    Path(path).write_text("".join(json.dumps(row) + "\n" for row in rows))
    return Path(path)


def fixture_model(directory, **generation):
    """The fixture model (``generation`` overrides generation_config.json keys)."""
    from engine.demo_model import make_tiny_model

    return make_tiny_model(directory, generation=generation or None)


def set_generation_config(directory, **values):
    """Rewrite a model directory's generation_config.json keys (cheaper than building another fixture)."""
    path = Path(directory) / "generation_config.json"
    config = json.loads(path.read_text())
    config.update(values)
    path.write_text(json.dumps(config))
