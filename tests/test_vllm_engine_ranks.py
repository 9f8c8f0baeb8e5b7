"""rollout.engine=vllm for real (the vLLM leg, ci/test-vllm.sh: vLLM's CPU build): two gloo ranks, each with its
FSDP2 policy and its own vLLM engine in the same process.

One spawn checks, on a tiny Qwen2.5-like model directory: greedy responses of vllm against hf on the same prompts;
sampled log-probs against the trainer's (temperature 0.7, top-k, top-p); the engine's log-probs of fixed token
sequences equal to the trainer's before an update, stale after an update with a large learning rate, equal again
after the weight push (and different from before it, so the check can fail); the same with a LoRA policy (merged
adapters pushed); with rollout.vllm.lora_sync=adapter (a second engine serving the base with LoRA) the same
equality after each adapter push, the base pushed once, each push's bytes the adapter's, older versions unloaded
(and again with one trainer rank); with rollout.vllm.weight_sync=delta (one trainer rank) the first push whole,
then after each of three updates moving 5% of the elements a delta far smaller than the model, the engine's copy
equal to the trainer's weights bit for bit and its log-probs equal bit for bit to those after a whole push of the
same weights; the sleep / wake / push order with the real engine wrapped in a recorder (the
CPU has no sleep mode); a tensor of the wrong shape named. Then accel-grpo runs a few steps with
rollout.engine=vllm (FSDP2; tensor-parallel 2 with weight_sync=delta, its figures reported; LoRA in adapter mode,
rollout/weight_sync_bytes the adapter's), and the CPU demo with
LoRA learns in adapter mode as in merged mode. Skipped where vLLM is not importable (the main leg).
"""

import importlib.util
import json
import os

import pytest
from conftest import REPO, run_python
from distributed import run_ranks
from vllm_push_compare import (
    assert_adapter_pushed,
    assert_delta_pushed,
    assert_pushed,
    delta_push_and_compare,
    largest_gap,
    push_adapter_and_compare,
    push_and_compare,
    trainer_log_probs,
)

pytestmark = [pytest.mark.vllm, pytest.mark.slow,
              pytest.mark.skipif(importlib.util.find_spec("vllm") is None and not os.environ.get("ACCEL_EXPECT_VLLM"),
                                 reason="needs vLLM (the vLLM leg: bash ci/test-vllm.sh)")]

HIDDEN = 128  # vLLM's CPU attention has kernels for head sizes 32 and up: hidden 128 / 4 heads
ENV = {"VLLM_CPU_KVCACHE_SPACE": "1"}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from engine.demo_model import make_tiny_model

    # No EOS boost: greedy decoding would otherwise end every response at its first token.
    return make_tiny_model(tmp_path_factory.mktemp("model"), hidden_size=HIDDEN, layers=2, eos_bias=0.0)


def _engine_log_probs(llm, batch, lora_request=None):
    """vLLM's log-probs of each response token of ``batch`` as a fixed sequence (prompt log-probs, temperature 1),
    with the LoRA adapter of ``lora_request`` where given."""
    import torch
    from vllm import SamplingParams

    rows, width, start = len(batch), batch.response_ids.size(1), batch.prompt_length
    result = torch.zeros(rows, width)
    sequences = [batch.input_ids[row][batch.attention_mask[row].bool()].tolist() for row in range(rows)]
    outputs = llm.generate([{"prompt_token_ids": s} for s in sequences],
                           SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=1.0, detokenize=False),
                           use_tqdm=False, lora_request=lora_request)
    for row, output in enumerate(outputs):
        prompt_length = int(batch.attention_mask[row, :start].sum())
        for t in range(int(batch.response_mask[row].sum())):
            token = sequences[row][prompt_length + t]
            result[row, t] = output.prompt_logprobs[prompt_length + t][token].logprob
    return result


class Recorder:
    """Wraps the real vllm.LLM: records sleep / wake_up (which the CPU build lacks) and forwards everything else."""

    def __init__(self, llm):
        self.llm, self.calls = llm, []

    def sleep(self, level):
        self.calls.append(("sleep", level))

    def wake_up(self, tags=None):
        self.calls.append(("wake_up", tuple(tags) if tags else None))

    def collective_rpc(self, method, *args, **kwargs):
        self.calls.append(("push", method))
        return self.llm.collective_rpc(method, *args, **kwargs)

    def reset_prefix_cache(self):
        self.calls.append(("reset_prefix_cache",))
        return self.llm.reset_prefix_cache()

    def generate(self, *args, **kwargs):
        self.calls.append(("generate",))
        return self.llm.generate(*args, **kwargs)


def _checks(rank, model_dir):
    import dataclasses
    import time

    import torch
    from transformers import AutoTokenizer

    from engine import EngineConfig, FSDPEngine
    from engine.rl.algorithms.grpo.config import RolloutConfig
    from engine.rollout.engines import RolloutContext, RolloutEngineError, SamplingConfig, create_rollout_engine
    from engine.rollout.single_turn import eos_token_ids, rollout, sync_weights

    out = {}
    tokenizer = AutoTokenizer.from_pretrained(model_dir, padding_side="left")
    policy = FSDPEngine(str(model_dir), EngineConfig(fsdp_version=2, lr=0.05, max_grad_norm=1e9))
    config = RolloutConfig(engine="vllm")
    context = RolloutContext(policy, tokenizer, str(model_dir), config, max_sequence_tokens=96)
    started = time.perf_counter()
    vllm = create_rollout_engine("vllm", context)
    out["build_s"] = time.perf_counter() - started
    hf = create_rollout_engine("hf", context)
    started = time.perf_counter()
    sync_weights(policy, vllm)
    out["sync_s"] = time.perf_counter() - started
    eos = tuple(eos_token_ids(policy.module, tokenizer))
    prompts = [f"how many apples does {name} have {rank}" for name in ("Tom", "Maria", "Sam", "Ana")]

    greedy = SamplingConfig(n=1, max_new_tokens=24, eos_token_ids=eos, temperature=0.0)
    with policy.eval_mode():
        by_vllm = rollout(vllm, tokenizer, prompts, greedy)
        by_hf = rollout(hf, tokenizer, prompts, greedy)
    out["greedy_equal"] = [a == b for a, b in zip(by_vllm.responses, by_hf.responses, strict=True)]
    out["greedy_tokens"] = int(by_vllm.response_mask.sum())

    sampled = SamplingConfig(n=4, max_new_tokens=24, eos_token_ids=eos, temperature=0.7, top_k=20, top_p=0.8,
                             log_probs=True)
    torch.manual_seed(1234 + rank)
    batch = rollout(vllm, tokenizer, prompts, sampled)
    torch.manual_seed(1234 + rank)
    again = rollout(vllm, tokenizer, prompts, sampled)
    out["same_seed_same_tokens"] = torch.equal(batch.input_ids, again.input_ids)
    mask = batch.response_mask.float()
    trainer = trainer_log_probs(policy, batch, 0.7, top_k=20, top_p=0.8)
    out["sampled_gap"] = largest_gap(batch.sampling_log_probs, trainer, mask)

    # More prompt tokens than one engine step schedules (4096): no prompt is cut over two steps on the CPU, where a
    # seeded request's generator cannot rewind ("CPU Generator does not use offset").
    many = SamplingConfig(n=4, max_new_tokens=4, eos_token_ids=eos, temperature=1.0)
    out["many_rows"] = len(rollout(vllm, tokenizer, [" ".join(prompts)] * 64, many))  # ~10k prompt tokens

    # Fixed sequences: the engine's and the trainer's log-probs before, during (stale) and after the push; LoRA.
    compared, trainer_after = push_and_compare(policy, vllm, batch, lambda b: _engine_log_probs(vllm.llm, b),
                                               model_dir)
    out.update(compared)

    # The hand-over order, as on a device with a sleep mode: the real engine behind a recorder.
    real = vllm.llm
    vllm.llm, vllm.facts = Recorder(real), dataclasses.replace(vllm.facts, sleep_level=1)
    vllm.release_memory()
    sync_weights(policy, vllm)
    with policy.eval_mode():
        rollout(vllm, tokenizer, prompts, greedy)
    out["order"] = vllm.llm.calls
    out["after_order_gap"] = largest_gap(_engine_log_probs(real, batch), trainer_after, mask)
    vllm.llm, vllm.facts = real, dataclasses.replace(vllm.facts, sleep_level=0)

    bad = [(name, tensor.clone()) for name, tensor in policy.iter_full_weights()]  # each valid until the next
    bad[-1] = (bad[-1][0], torch.zeros(3, 3))
    out["bad_name"] = bad[-1][0]
    try:
        vllm.load_weights(iter(bad))
    except RolloutEngineError as exc:
        out["bad_tensor"] = str(exc)
    started = time.perf_counter()
    out["adapter"] = _adapter_checks(model_dir, tokenizer, batch)
    out["adapter_checks_s"] = time.perf_counter() - started  # what lora_sync=adapter adds to the test
    return out


def _adapter_checks(model_dir, tokenizer, batch):
    """rollout.vllm.lora_sync=adapter: a second engine in the same process serving the base with LoRA; the base
    once, then the adapter alone after every update (tests/vllm_push_compare.py); only the current version loaded
    and on disk."""
    import os

    from engine import EngineConfig, FSDPEngine
    from engine.rl.algorithms.grpo.config import RolloutConfig
    from engine.rollout.engines import RolloutContext, create_rollout_engine
    from engine.rollout.engines.vllm_settings import VLLMConfig

    lora = FSDPEngine(str(model_dir), EngineConfig(fsdp_version=2, lr=0.05, max_grad_norm=1e9, lora_rank=4))
    config = RolloutConfig(engine="vllm", vllm=VLLMConfig(lora_sync="adapter"))
    engine = create_rollout_engine("vllm", RolloutContext(lora, tokenizer, str(model_dir), config, 96))
    out = push_adapter_and_compare(lora, engine, batch,
                                   lambda b: _engine_log_probs(engine.llm, b, engine.lora_request))
    out["loaded"] = sorted(engine.llm.llm_engine.list_loras())
    out["current"] = engine.lora_request.lora_int_id
    out["on_disk"] = sorted(os.listdir(engine.adapter_root))
    engine.close()
    out["left_on_disk"] = os.path.exists(engine.adapter_root)
    return out


def _one_rank_adapter_checks(rank, model_dir):
    """The adapter checks with one trainer rank (the adapter taken whole, nothing gathered), on sequences the ``hf``
    engine samples."""
    import torch
    from transformers import AutoTokenizer

    from engine import EngineConfig, FSDPEngine
    from engine.rl.algorithms.grpo.config import RolloutConfig
    from engine.rollout.engines import RolloutContext, SamplingConfig, create_rollout_engine
    from engine.rollout.single_turn import eos_token_ids, rollout

    tokenizer = AutoTokenizer.from_pretrained(model_dir, padding_side="left")
    policy = FSDPEngine(str(model_dir), EngineConfig(fsdp_version=2))
    hf = create_rollout_engine("hf", RolloutContext(policy, tokenizer, str(model_dir), RolloutConfig(), 96))
    sampled = SamplingConfig(n=4, max_new_tokens=24, eos_token_ids=tuple(eos_token_ids(policy.module, tokenizer)),
                             temperature=0.7, top_k=20, top_p=0.8)
    torch.manual_seed(1234)
    with policy.eval_mode():
        batch = rollout(hf, tokenizer, [f"how many apples does {name} have" for name in ("Tom", "Maria")], sampled)
    return {"adapter": _adapter_checks(model_dir, tokenizer, batch),
            "delta": _delta_checks(model_dir, tokenizer, batch)}


def _delta_checks(model_dir, tokenizer, batch):
    """rollout.vllm.weight_sync=delta on a colocated engine (tests/vllm_push_compare.py), and its copy of the
    weights against the trainer's, bit for bit, after the last push."""
    import torch

    from engine import EngineConfig, FSDPEngine
    from engine.rl.algorithms.grpo.config import RolloutConfig
    from engine.rollout import sync_weights
    from engine.rollout.engines import RolloutContext, create_rollout_engine
    from engine.rollout.engines.vllm_settings import VLLMConfig
    from engine.rollout.weight_delta import bits

    policy = FSDPEngine(str(model_dir), EngineConfig(fsdp_version=2))
    config = RolloutConfig(engine="vllm", vllm=VLLMConfig(weight_sync="delta"))
    engine = create_rollout_engine("vllm", RolloutContext(policy, tokenizer, str(model_dir), config, 96))
    out = delta_push_and_compare(policy, engine, batch, lambda b: _engine_log_probs(engine.llm, b), engine.copy.drop)
    sync_weights(policy, engine)  # a push with nothing changed: no element sent
    out["unchanged_frac"] = engine.push_stats.changed_frac
    out["copy_equal"] = all(torch.equal(bits(engine.copy.copy[name]), bits(tensor))
                            for name, tensor in policy.iter_full_weights())
    engine.close()
    return out


def _assert_adapter_engine(adapter):
    assert_adapter_pushed(adapter)
    assert adapter["current"] == 3 and adapter["loaded"] == [3], adapter  # older versions unloaded
    assert adapter["on_disk"] == ["v3"] and not adapter["left_on_disk"], adapter  # closed: removed


def test_vllm_engine_on_two_ranks(model_dir):
    outs = run_ranks(_checks, model_dir, env=ENV, timeout=400, fresh=True)  # vLLM: its own processes
    for out in outs:
        assert all(out["greedy_equal"]), out["greedy_equal"]  # vllm and hf decode the same greedy responses
        assert out["greedy_tokens"] > 8
        assert out["same_seed_same_tokens"]
        assert out["many_rows"] == 256
        assert out["sampled_gap"] < 1e-4, out  # temperature 0.7, top-k 20, top-p 0.8
        assert_pushed(out)
        assert out["after_order_gap"] < 1e-4, out
        assert out["order"] == [("sleep", 1), ("wake_up", ("weights",)), ("push", "reload_weights"),
                                ("reset_prefix_cache",), ("wake_up", ("kv_cache",)), ("generate",)], out["order"]
        assert f"cannot take weight '{out['bad_name']}' of shape (3, 3): the engine's model has shape" in \
            out["bad_tensor"], out
        _assert_adapter_engine(out["adapter"])
    print({key: [round(out[key], 4) for out in outs] for key in ("build_s", "sync_s", "push_after_update_s",
                                                                 "adapter_checks_s")})


def test_the_adapter_reaches_a_one_rank_engine(model_dir):
    """rollout.vllm.lora_sync=adapter with one trainer rank: the same checks as on two; rollout.vllm.weight_sync=delta
    on a colocated engine."""
    (out,) = run_ranks(_one_rank_adapter_checks, model_dir, world_size=1, env=ENV, timeout=300, fresh=True)
    _assert_adapter_engine(out["adapter"])
    assert_delta_pushed(out["delta"])
    assert out["delta"]["unchanged_frac"] == 0.0 and out["delta"]["copy_equal"], out["delta"]
    print({"delta": [(step["sent"], round(step["changed"], 4)) for step in out["delta"]["steps"]],
           "model_bytes": out["delta"]["model_bytes"]})


SMALL = ["train.prompts_per_step=4", "rollout.n=4", "train.micro_batch_size=8", "rollout.max_new_tokens=12",
         "run.progress=false", "rollout.engine=vllm", "data.max_prompt_tokens=64"]


def _model_bytes(model_dir):
    """The model's bytes in fp32 (every parameter once: tied embeddings count once)."""
    from transformers import AutoModelForCausalLM

    return 4 * sum(p.numel() for p in AutoModelForCausalLM.from_pretrained(model_dir).parameters())


def _adapter_bytes(model, rank, alpha):
    """A rank-``rank`` all-linear LoRA adapter's bytes (fp32) on ``model``, counted by PEFT."""
    from peft import LoraConfig, get_peft_model

    lora = get_peft_model(model, LoraConfig(r=rank, lora_alpha=alpha, target_modules="all-linear"))
    return 4 * sum(p.numel() for name, p in lora.named_parameters() if ".lora_" in name)


@pytest.mark.parametrize("variant", [[], ["rollout.vllm.tensor_parallel_size=2", "rollout.vllm.weight_sync=delta"]],
                         ids=["fsdp2", "tensor-parallel-2-delta"])
def test_grpo_runs_with_the_vllm_engine(tmp_path, model_dir, variant):
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"Tom has {i} apples", "answer": str(i)}) + "\n"
                            for i in range(16)))
    env = {"PYTHONPATH": str(REPO / "tests"), "ACCEL_BACKEND": "cpu", "OMP_NUM_THREADS": "1", **ENV}
    result = run_python(["-m", "engine.rl.algorithms.grpo.cli",
                         "--preset", "cpu-demo", *SMALL, *variant, f"model.path={model_dir}",
                         "data.task=gsm8k",
                         f"data.path={data}", "train.steps=3", f"run.output_dir={tmp_path}", "run.name=vllm"],
                        env=env, timeout=400)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "vllm" / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [1, 2, 3]
    for row in rows:
        assert row["rollout/weight_sync_s"] > 0
        if "rollout.vllm.weight_sync=delta" in variant:  # an update with no reward signal moves nothing: 0 bytes
            sent, changed = row["rollout/weight_sync_bytes"], row["rollout/weight_sync_changed_frac"]
            assert 0 <= sent <= _model_bytes(model_dir) and 0 <= changed <= 1 and (sent == 0) == (changed == 0), row
        else:
            assert row["rollout/weight_sync_bytes"] == _model_bytes(model_dir), row  # the whole model
            assert "rollout/weight_sync_changed_frac" not in row
        assert row["rollout/logprob_diff_max"] < 1e-3, row  # the engine samples the trainer's policy
        assert 0.99 < row["rollout/is_ratio_min"] <= row["rollout/is_ratio_max"] < 1.01, row
        assert row["rollout/is_masked_frac"] == 0.0
        assert row["response_length"] > 0
    assert "keeps its weights and KV cache in memory during updates" in result.stderr
    print({key: [row.get(key) for row in rows] for key in ("rollout/weight_sync_bytes",
                                                           "rollout/weight_sync_changed_frac", "reward_std")})


def test_an_architecture_vllm_cannot_load_is_named_before_training(tmp_path, model_dir):
    import shutil

    from engine.rl.algorithms.grpo.config import build_config, check

    other = tmp_path / "model"
    shutil.copytree(model_dir, other)
    config_file = other / "config.json"
    config_file.write_text(config_file.read_text().replace('"Qwen2ForCausalLM"', '"NoSuchModelForCausalLM"'))
    config = build_config(None, None, ["rollout.engine=vllm", f"model.path={other}", "data.task=gsm8k",
                                       f"data.path={config_file}", "data.reward=x:y"])
    (problem,) = [p for p in check(config, 2) if "vLLM cannot load" in p]
    assert problem.startswith(f"model.path {other}: vLLM cannot load architecture NoSuchModelForCausalLM (not "
                              "among the ")
    assert problem.endswith("choose rollout.engine=hf-continuous for this model")
    assert not [p for p in check(build_config(None, None, ["rollout.engine=vllm", f"model.path={model_dir}"]), 2)
                if "vLLM" in p]


LORA_DEMO = ["rollout.engine=vllm", "model.hidden_size=128", "rollout.vllm.kv_cache_gib=1", "run.progress=false",
             "engine.lora_rank=8", "engine.lora_alpha=16", "engine.lr=2e-2", "train.steps=10"]


def test_the_lora_demo_trains_in_adapter_mode_as_in_merged_mode(tmp_path):
    """The CPU demo (2 ranks) with a LoRA policy, rollout.vllm.lora_sync=merged and =adapter, same seeds: the same
    run step for step (the engine samples the trainer's policy either way, so the same tokens, rewards and losses),
    the adapter's bytes a fraction of the merged model's every update."""
    env = {"ACCEL_BACKEND": "cpu", "OMP_NUM_THREADS": "1", **ENV}
    rows = {}
    for mode in ("merged", "adapter"):
        result = run_python(["-m", "engine.rl.algorithms.grpo.cli", *LORA_DEMO, f"rollout.vllm.lora_sync={mode}",
                             f"run.output_dir={tmp_path}", f"run.name={mode}"], env=env, timeout=400)
        assert result.returncode == 0, result.stderr[-3000:]
        rows[mode] = [json.loads(line) for line in (tmp_path / mode / "metrics.jsonl").read_text().splitlines()]
    merged, adapter = rows["merged"], rows["adapter"]
    print({mode: [round(row["reward_mean"], 4) for row in rows[mode]] for mode in rows})
    from engine.rl.model import build_model
    from engine.train.settings import ModelConfig

    model = build_model(ModelConfig(path="builtin:tiny-char", hidden_size=128))[1]()
    whole, lora = 4 * sum(p.numel() for p in model.parameters()), _adapter_bytes(model, 8, 16)
    assert [row["step"] for row in merged] == [row["step"] for row in adapter] == list(range(1, 11))
    for m, a in zip(merged, adapter, strict=True):
        assert m["rollout/logprob_diff_max"] < 1e-3 and a["rollout/logprob_diff_max"] < 1e-3, (m, a)
        assert (m["rollout/weight_sync_bytes"], a["rollout/weight_sync_bytes"]) == (whole, lora), (m, a)
        assert abs(m["reward_mean"] - a["reward_mean"]) < 1e-6, rows  # the same samples
        assert abs(m["loss"] - a["loss"]) < 1e-3, (m, a)
