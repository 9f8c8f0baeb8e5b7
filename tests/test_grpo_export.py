"""``accel-grpo export``: sharded checkpoints of 2-rank FSDP1 and FSDP2+LoRA runs become Hugging Face directories
that transformers and PEFT load back with the trained model's logits; bad input to export, eval and a run is
refused with a one-line error (exit 2) and nothing written or deleted."""

import json

import pytest
import torch
from distributed import run_ranks

from engine.rl.algorithms.grpo.cli import main

CHAT_TEMPLATE = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
PROMPT_IDS = [[5, 9, 14, 3, 22, 7, 11], [8, 8, 2, 19, 4, 13, 6]]
RUNS = {"fsdp1": ["engine.fsdp_version=1"], "lora": ["engine.fsdp_version=2", "engine.lora_rank=4",
                                                    "engine.lora_alpha=8"]}


def write_model_dir(directory):
    """A small Hugging Face model directory as a hub model has it: a bf16 config, a tokenizer with a chat
    template, and a generation_config.json with sampling settings of its own."""
    from engine.rl.prompts import EchoTask
    from engine.rl.tokenizer import build_char_tokenizer
    from engine.tiny_model import tiny_qwen2

    tokenizer = build_char_tokenizer(EchoTask.alphabet)
    tokenizer.chat_template = CHAT_TEMPLATE
    model = tiny_qwen2(seed=3, vocab_size=32, hidden_size=64, layers=2, pad_token_id=0, eos_token_id=2)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**config, "dtype": "bfloat16"}))  # as Qwen2.5's says
    generation = {"do_sample": True, "temperature": 0.7, "top_p": 0.8, "eos_token_id": [2], "pad_token_id": 0}
    (directory / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    return directory


def _train_and_save(rank, root, model_dir):
    """Per run: 2 optimizer steps from the model directory, a checkpoint in a run's layout, and the logits of the
    trained, still sharded model."""
    from tiny import make_micro_batches, token_loss

    from engine import FSDPEngine
    from engine.rl.algorithms.grpo.config import build_config, engine_config, resolved

    logits = {}
    for name, overrides in RUNS.items():
        config = build_config(None, None, [f"model.path={model_dir}", "engine.lr=5e-2", *overrides])
        engine = FSDPEngine(str(model_dir), engine_config(config, 2))
        for step in range(2):
            with engine.train_mode():
                batches = make_micro_batches(step * 2 + rank, 2)
                for batch in batches:
                    batch["input_ids"] = batch["input_ids"] % 32
                engine.forward_backward_batch(batches, token_loss)
                engine.optimizer_step()
        run_dir = root / name
        engine.save_checkpoint(run_dir / "checkpoints" / "step_000002")
        if rank == 0:
            (run_dir / "config.json").write_text(json.dumps(resolved(config, 2)))
        with engine.eval_mode(), torch.no_grad():
            logits[name] = engine.module(input_ids=torch.tensor(PROMPT_IDS)).logits.float()
    return logits


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("export")
    model_dir = write_model_dir(root / "base")
    logits = run_ranks(_train_and_save, root, model_dir)[0]
    return root, model_dir, logits


def export(*args):
    return main(["export", *map(str, args)])


def logits_of(model):
    with torch.no_grad():
        return model(input_ids=torch.tensor(PROMPT_IDS)).logits.float()


@pytest.mark.slow
def test_fsdp1_run_exports_fp32_and_bf16_with_the_trained_logits(trained, tmp_path, capsys):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from engine.checkpoint import read_model_state

    root, model_dir, want = trained
    assert export(root / "fsdp1", tmp_path / "fp32", "--dtype", "fp32") == 0
    assert "step 2, full model, fp32" in capsys.readouterr().out
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "fp32")
    assert next(model.parameters()).dtype == torch.float32
    fp32_diff = (logits_of(model) - want["fsdp1"]).abs().max().item()
    assert fp32_diff < 1e-6
    for name in ("tokenizer.json", "chat_template.jinja"):  # as the trained model had them
        assert (tmp_path / "fp32" / name).read_bytes() == (model_dir / name).read_bytes(), name
    # The model's generation config, with the response limit the run trained with (transformers' generate reads it)
    generation = json.loads((model_dir / "generation_config.json").read_text())
    assert json.loads((tmp_path / "fp32" / "generation_config.json").read_text()) == {**generation,
                                                                                       "max_new_tokens": 4}
    assert json.loads((tmp_path / "fp32" / "accel_prompting.json").read_text()) == {"chat_template": "auto",
                                                                                    "max_new_tokens": 4}
    text = AutoTokenizer.from_pretrained(model_dir).apply_chat_template([{"role": "user", "content": "a x2:"}],
                                                                       tokenize=False)
    assert AutoTokenizer.from_pretrained(tmp_path / "fp32").apply_chat_template(
        [{"role": "user", "content": "a x2:"}], tokenize=False) == text

    # The default dtype is the trained model's (bf16 in its config.json): weights are the fp32 ones rounded.
    assert export(root / "fsdp1" / "checkpoints" / "step_000002", tmp_path / "bf16") == 0
    saved = load_file(tmp_path / "bf16" / "model.safetensors")
    trained_weights = read_model_state(root / "fsdp1" / "checkpoints" / "step_000002")
    assert saved.keys() == trained_weights.keys()
    assert all(torch.equal(saved[k], v.to(torch.bfloat16)) for k, v in trained_weights.items())
    rounded = logits_of(AutoModelForCausalLM.from_pretrained(tmp_path / "bf16", dtype=torch.float32))
    bf16_diff = (rounded - want["fsdp1"]).abs().max().item()
    assert 0 < bf16_diff < 2e-2
    print(f"FSDP1 export, max abs logit difference: fp32 {fp32_diff:.3g}, bf16 weights {bf16_diff:.3g} "
          f"(largest logit {want['fsdp1'].abs().max().item():.3g})")


@pytest.mark.slow
def test_fsdp2_lora_run_exports_merged_and_as_a_peft_adapter(trained, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    root, model_dir, want = trained
    assert export(root / "lora", tmp_path / "merged", "--dtype", "fp32") == 0
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged")
    assert not any("lora" in name for name, _ in merged.named_parameters())
    base_logits = logits_of(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32))
    assert (base_logits - want["lora"]).abs().max().item() > 1e-3, "the adapters moved the model"
    merged_diff = (logits_of(merged) - want["lora"]).abs().max().item()
    assert merged_diff < 1e-5

    assert export(root / "lora", tmp_path / "adapter", "--lora", "adapter", "--dtype", "fp32") == 0
    adapter_config = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert adapter_config["r"] == 4 and adapter_config["lora_alpha"] == 8
    assert adapter_config["base_model_name_or_path"] == str(model_dir.resolve())
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    adapted = PeftModel.from_pretrained(base, tmp_path / "adapter")
    adapter_diff = (logits_of(adapted) - want["lora"]).abs().max().item()
    assert adapter_diff < 1e-6
    print(f"FSDP2+LoRA export, max abs logit difference: merged {merged_diff:.3g}, adapter {adapter_diff:.3g}")


@pytest.mark.slow
def test_bad_export_input_is_refused_and_nothing_is_written_or_deleted(trained, tmp_path, capsys):
    import shutil

    root, model_dir, _ = trained

    def refused(*args):
        code = export(*args)
        err = capsys.readouterr().err.strip()
        assert code == 2 and err.startswith("accel-grpo export: error: ") and "\n" not in err, err
        return err

    assert "is neither a run directory" in refused(model_dir, tmp_path / "out")
    incomplete = root / "fsdp1" / "checkpoints" / "step_000003"
    shutil.copytree(root / "fsdp1" / "checkpoints" / "step_000002", incomplete)
    (incomplete / "engine_meta.json").unlink()  # a save cut short before its last file
    assert "incomplete checkpoint" in refused(incomplete, tmp_path / "out")
    assert "no complete checkpoint of step 3" in refused(root / "fsdp1", tmp_path / "out", "--step", "3")
    assert "trained the full model" in refused(root / "fsdp1", tmp_path / "out", "--lora", "adapter")
    assert not (tmp_path / "out").exists()
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "keep.txt").write_text("mine")
    assert "is not empty" in refused(root / "fsdp1", taken)
    assert "is not an earlier export" in refused(root / "fsdp1", taken, "--force")  # issue 45: only exports go
    assert "holds the checkpoint being exported" in refused(root / "fsdp1", root, "--force")  # a folder of runs
    assert "is a run directory" in refused(root / "fsdp1", root / "lora", "--force")
    assert [p.name for p in taken.iterdir()] == ["keep.txt"]
    assert export(root / "fsdp1", tmp_path / "model") == 0
    assert "holds an earlier export" in refused(root / "fsdp1", tmp_path / "model")
    assert export(root / "fsdp1", tmp_path / "model", "--force") == 0  # an earlier export is replaced
    assert (tmp_path / "model" / "model.safetensors").is_file() and (tmp_path / "model" / ".accel-export").is_file()
    assert not any(".partial" in p.name for p in tmp_path.iterdir())


@pytest.mark.slow
def test_eval_without_validation_data_and_bad_run_options_exit_2_writing_nothing(trained, tmp_path, capsys):
    root, model_dir, _ = trained
    before = sorted(p.name for p in (root / "fsdp1").iterdir())
    for args, message in (
        (["eval", root / "fsdp1"], "no validation data: give data.val_path=FILE"),
        (["eval", model_dir, f"run.output_dir={tmp_path}"], "no validation data"),
        (["eval", model_dir, f"data.val_path={tmp_path / 'missing.jsonl'}", f"run.output_dir={tmp_path}"],
         "missing.jsonl does not exist"),
        (["run.keep_checkpoints=0", f"run.output_dir={tmp_path}"], "run.keep_checkpoints must be a positive integer"),
        (["run.loggers=[jsonl,comet]", f"run.output_dir={tmp_path}"], "run.loggers: unknown logger 'comet'"),
    ):
        assert main(list(map(str, args))) == 2, args
        err = capsys.readouterr().err
        assert message in err, err
    assert list(tmp_path.iterdir()) == []
    assert sorted(p.name for p in (root / "fsdp1").iterdir()) == before
