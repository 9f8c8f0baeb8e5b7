"""accel-dpo and accel-rm end to end, one rank in this process (the frame's spawn-free path; 2-rank exactness:
tests/test_preference_ranks.py): each learns the demo's synthetic preferences to >= 0.9 accuracy on its held-out
pairs; a DPO run resumed from its middle checkpoint repeats its last steps exactly; eval of a run gives the run's
own validation figures; export writes a causal LM (DPO) and a directory that loads with
AutoModelForSequenceClassification and, scored by Hugging Face alone, prefers the held-out chosen responses (the
reward model), and GRPO with that export as its only reward raises its score; with LoRA the reference is the base
model (the first loss is ln 2, the next rewards are not zero); `accel-train dpo|rm` are the same commands; a bad
pair row is refused in one line before any run directory."""

import json
import math
import shutil

import pytest
import torch
from grpo_data import write_jsonl

from engine.offline.objectives.dpo.cli import main as dpo_main
from engine.offline.objectives.rm.cli import main as rm_main

pytestmark = pytest.mark.slow

ONE = ("--nproc", "1", "run.progress=false")  # the demo presets otherwise: 922 training pairs, 102 held out
DPO_RUN = ("train.steps=20", "run.save_every=10", "dpo.ref_param_offload=true")
DPO_COMPARED = ("loss", "rewards/accuracies", "rewards/margins", "logps/chosen", "logps/rejected", "grad_norm")


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("preference-run")


def metrics(root, name):
    return [json.loads(line) for line in (root / "runs" / name / "metrics.jsonl").read_text().splitlines()]


def train(main, root, name, *args):
    code = main([*ONE, f"run.output_dir={root / 'runs'}", f"run.name={name}", *args])
    assert code == 0
    return metrics(root, name)


def evaluated(main, capsys, source, *args) -> dict:
    capsys.readouterr()
    assert main(["eval", str(source), "--nproc", "1", *args]) == 0
    out = capsys.readouterr().out
    return json.loads(out[out.index("{"):])


@pytest.fixture(scope="module")
def dpo_run(root):
    return train(dpo_main, root, "dpo", *DPO_RUN)


@pytest.fixture(scope="module")
def rm_run(root):
    return train(rm_main, root, "rm")  # the demo as it is: two passes in 115 steps of 16 pairs


def test_dpo_learns_the_demo_preferences(dpo_run):
    assert dpo_run[0]["loss"] == pytest.approx(math.log(2), abs=1e-6)  # the policy starts as its reference
    assert [row["step"] for row in dpo_run] == list(range(1, 21))
    assert all(0.0 < row["perf/mfu"] < 1.0 and row["perf/tflops/update"] > 0.0 for row in dpo_run)
    assert dpo_run[-1]["val/rewards/accuracies"] >= 0.9 and dpo_run[-1]["val/pairs"] == 102
    assert dpo_run[-1]["val/rewards/margins"] > 0 and dpo_run[-1]["val/loss"] < math.log(2)


def test_dpo_resume_repeats_the_same_steps_exactly(root, dpo_run):
    runs = root / "runs"
    shutil.copytree(runs / "dpo", runs / "dpo-resumed")
    shutil.rmtree(runs / "dpo-resumed" / "checkpoints" / "step_000020")
    assert dpo_main([*ONE, f"run.output_dir={runs}", "run.name=dpo-resumed", "--resume"]) == 0
    got = metrics(root, "dpo-resumed")
    assert [row["step"] for row in got] == list(range(1, 21))
    for a, b in zip(got[10:], dpo_run[10:], strict=True):
        for key in (*DPO_COMPARED, "val/loss", "val/rewards/accuracies"):
            if key in b:
                assert a[key] == pytest.approx(b[key], rel=1e-5, abs=1e-7), (a["step"], key)


def test_dpo_eval_and_export(root, dpo_run, capsys):
    figures = evaluated(dpo_main, capsys, root / "runs" / "dpo")
    assert figures["step"] == 20 and figures["pairs"] == 102
    for key in ("val/loss", "val/rewards/accuracies", "val/rewards/margins", "val/logps/chosen"):
        assert figures[key] == pytest.approx(dpo_run[-1][key], rel=1e-5, abs=1e-7), key

    from transformers import AutoModelForCausalLM

    out = root / "dpo-export"
    assert dpo_main(["export", str(root / "runs" / "dpo"), str(out)]) == 0
    assert type(AutoModelForCausalLM.from_pretrained(out)).__name__ == "Qwen2ForCausalLM"


def test_the_lora_reference_is_the_base_model(root):
    rows = train(dpo_main, root, "dpo-lora", "train.steps=2", "engine.lora_rank=4", "engine.lr=5e-2")
    assert rows[0]["loss"] == pytest.approx(math.log(2), abs=1e-6)
    assert rows[0]["rewards/chosen"] == 0.0 and abs(rows[1]["rewards/chosen"]) > 1e-4


@pytest.fixture(scope="module")
def rm_export(root, rm_run):
    out = root / "rm-export"
    assert rm_main(["export", str(root / "runs" / "rm"), str(out)]) == 0
    return out


def test_rm_learns_evaluates_and_exports_a_sequence_classifier(root, rm_run, rm_export, capsys):
    assert rm_run[0]["loss"] == pytest.approx(math.log(2), abs=1e-2)  # a new head scores near 0
    assert rm_run[-1]["val/accuracy"] >= 0.9 and rm_run[-1]["val/pairs"] == 102
    figures = evaluated(rm_main, capsys, root / "runs" / "rm")
    for key in ("val/loss", "val/accuracy", "val/rewards/margins"):
        assert figures[key] == pytest.approx(rm_run[-1][key], rel=1e-5, abs=1e-7), key

    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from engine.offline.pair_data import PairDataConfig, evaluation_pairs

    model = AutoModelForSequenceClassification.from_pretrained(rm_export).eval()
    held_out = evaluation_pairs(PairDataConfig(), AutoTokenizer.from_pretrained(rm_export), seed=0)
    assert len(held_out) == 102

    def reward(sequence):  # Hugging Face's own reading: the score at the last token
        with torch.no_grad():
            return model(input_ids=torch.tensor([sequence.ids])).logits[0, 0].item()

    preferred = [reward(p.chosen) > reward(p.rejected) for p in held_out]
    assert sum(preferred) / len(preferred) >= 0.9


def test_grpo_with_the_trained_reward_model_as_its_reward_raises_its_score(root, rm_export):
    """The pipeline of docs/preference.md: accel-rm's export is GRPO's only reward (reward_model.path), on the demo
    preferences' prompts, the policy the causal LM the reward model started from."""
    from engine.offline.pair_data import demo_pairs
    from engine.rl.algorithms.grpo.cli import main as grpo_main

    prompts = write_jsonl(root / "prompts.jsonl", [{"prompt": pair.prompt} for pair in demo_pairs(64, seed=11)])
    policy = next((root / "runs" / ".models").glob("tiny-chat-*"))  # the reward model's base, written by its run
    assert grpo_main([*ONE, f"model.path={policy}", f"data.path={prompts}", f"reward_model.path={rm_export}",
                      "train.steps=12", "train.prompts_per_step=8", "rollout.n=8", "rollout.max_new_tokens=4",
                      "engine.lr=2e-2", "algorithm.kl_loss_coef=0", f"run.output_dir={root / 'runs'}",
                      "run.name=grpo-rm"]) == 0
    rows = metrics(root, "grpo-rm")
    assert len(rows) == 12 and all(row["reward_model/failures"] == 0 for row in rows)
    # The random policy (entropy ln 1024) starts near -2 and, at this high lr, ends near +2 (seed 0 here).
    scores = [row["reward_model/score_mean"] for row in rows]
    assert sum(scores[-3:]) / 3 > sum(scores[:3]) / 3 + 1.0, scores


def test_accel_train_names_the_same_recipes(root, capsys):
    from engine.train.cli import generic_main

    for name in ("dpo", "rm"):
        assert generic_main([name, "--print-config", *ONE]) == 0
        assert json.loads(capsys.readouterr().out)["trainer"] == name


def test_a_bad_pair_row_is_one_line_before_any_worker(root, capsys):
    from engine.demo_model import make_tiny_model

    model = make_tiny_model(root / "model", vocab_size=512)
    good = {"prompt": "how many?", "chosen": "3", "rejected": "4"}
    data = write_jsonl(root / "bad.jsonl", [good, {"prompt": "how many?", "chosen": "3"}])
    for main, tool in ((dpo_main, "accel-dpo"), (rm_main, "accel-rm")):
        capsys.readouterr()
        code = main([f"model.path={model}", f"data.path={data}", f"run.output_dir={root / 'bad'}", "--nproc", "1"])
        err = capsys.readouterr().err.strip()
        assert code == 2 and err.startswith(f"{tool}: error: ") and "\n" not in err, err
        assert f"{data}:2: " in err and "rejected" in err
        assert not (root / "bad").exists()
