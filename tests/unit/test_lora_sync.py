"""``rollout.vllm.lora_sync`` without vLLM: the modes and their checks, auto's rule, vLLM's rank rounding, the adapter
directory a server's worker writes (PEFT loads it and computes what the policy computes), the bytes of a rank-8
adapter against the mid-size model's, and the server options and adapter pushes with recording stand-ins."""

from __future__ import annotations

import pytest
import torch

from engine.rollout.engines import lora_sync


def test_vllm_ranks_are_rounded_up_and_bad_settings_are_one_line_each():
    assert [lora_sync.vllm_max_lora_rank(r) for r in (1, 4, 8, 9, 300)] == [1, 8, 8, 16, 320]
    with pytest.raises(ValueError, match="larger than vLLM's largest max_lora_rank, 512"):
        lora_sync.vllm_max_lora_rank(513)
    assert lora_sync.problems("auto", 0) == lora_sync.problems("merged", 8) == lora_sync.problems("adapter", 8) == []
    (mode,) = lora_sync.problems("lora", 8)
    assert mode == "rollout.vllm.lora_sync must be one of auto, merged, adapter, got 'lora'"
    (full,) = lora_sync.problems("adapter", 0)
    assert full.startswith("rollout.vllm.lora_sync=adapter pushes a LoRA adapter: it needs engine.lora_rank > 0")
    (wire,) = lora_sync.problems("adapter", 8, own_wire=False)
    assert "needs this package's weight-transfer engine" in wire


def test_auto_takes_the_adapter_where_its_push_saving_outweighs_its_slower_decode():
    threshold = lora_sync.AUTO_MAX_DECODED_TOKENS
    assert lora_sync.choose("merged", 8, 10**9, 1) == "merged" and lora_sync.choose("adapter", 8, 1, 10**9) == "adapter"
    assert lora_sync.choose("auto", 0, 10**9, 1) == "merged"  # no LoRA: nothing to choose
    assert lora_sync.choose("auto", 8, 10**9, 1, own_wire=False) == "merged"  # vLLM's own engine cannot carry one
    assert lora_sync.choose("auto", 8, 10**9, threshold) == "adapter"
    assert lora_sync.choose("auto", 8, 10**9, threshold + 1) == "merged"
    assert lora_sync.choose("auto", 8, 10**9, None) == "merged"  # the step's decoding not known: as before


def test_a_rank_8_adapter_is_under_5_percent_of_the_mid_size_model():
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from engine.tiny_model import tiny_qwen2_config

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(tiny_qwen2_config(vocab_size=2050, hidden_size=512, layers=8))
    base = sum(p.numel() for p in model.parameters())
    peft = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules="all-linear"))
    adapter = sum(p.numel() for name, p in peft.named_parameters() if ".lora_" in name)
    assert 0 < adapter / base < 0.05, (adapter, base)


def test_the_adapter_directory_loads_in_peft_and_computes_the_policys_output(tmp_path):
    from peft import LoraConfig, PeftModel, get_peft_model
    from tiny import tiny_qwen2

    policy = get_peft_model(tiny_qwen2(), LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"))
    with torch.no_grad():
        for name, param in policy.named_parameters():
            if "lora_B" in name:
                param.normal_(std=0.3, generator=torch.Generator().manual_seed(3))
    pushed = {name.replace(".default.", "."): p.detach() for name, p in policy.named_parameters() if ".lora_" in name}
    directory = lora_sync.write_adapter(lora_sync.version_directory(tmp_path, 3), pushed,
                                        lora_sync.adapter_config(policy.peft_config["default"]))
    assert directory.name == "v3" and not (tmp_path / "v3.partial").exists()
    loaded = PeftModel.from_pretrained(tiny_qwen2(), str(directory))
    ids = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])
    with torch.no_grad():
        assert torch.allclose(loaded(input_ids=ids).logits, policy(input_ids=ids).logits, atol=1e-5)
        assert not torch.allclose(tiny_qwen2()(input_ids=ids).logits, policy(input_ids=ids).logits, atol=1e-3)
    for version in (1, 2):
        lora_sync.version_directory(tmp_path, version).mkdir()
    lora_sync.prune(tmp_path, keep_from=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["v2", "v3"]
    assert lora_sync.adapter_name(3) == "accel-policy-v3"
    assert lora_sync.adapter_name(3, "ab12") == "accel-policy-ab12-v3"
    assert lora_sync.version_of("accel-policy-ab12-v3") == 3


def test_servers_serving_adapters_get_lora_and_its_routes():
    from accel_backends.backends.cpu import CPUBackend
    from engine.rollout.engines.vllm_settings import VLLMConfig
    from engine.rollout.vllm_server.plan import server_options, server_specs

    settings, facts = VLLMConfig(mode="server"), CPUBackend().inference_engine_facts()
    options = server_options(settings, facts, "float32", "auto", 96, lora_rank=4)
    assert (options["enable_lora"], options["max_lora_rank"], options["max_loras"]) == (True, 8, 2)
    (spec,) = server_specs(settings, facts, None, options, lambda: 30000)
    assert spec.env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "1" and "--enable-lora" in spec.arguments
    merged = server_options(settings, facts, "float32", "auto", 96)
    assert "enable_lora" not in merged


def test_an_adapters_tokens_carry_its_version_whatever_the_server_labels():
    from engine.rollout.vllm_server.engine import adapter_spans

    choice = {"token_ids": [5, 6, 7], "weight_versions": [{"version": "9", "start": 0, "end": 3}]}
    assert adapter_spans(choice, "accel-policy-ab12-v4")["weight_versions"] == [{"version": "4", "start": 0,
                                                                                  "end": 3}]


class _Policy:
    """Stand-in for FSDPEngine's three weight iterators: what sync_weights draws from, recorded."""

    def __init__(self):
        self.drawn = []

    def _weights(self, kind, tensors):
        self.drawn.append(kind)
        yield from tensors.items()

    def iter_full_weights(self, base_only=False):
        return self._weights("base" if base_only else "merged", {"w": torch.zeros(10, 10), "b": torch.zeros(10)})

    def iter_adapter_weights(self):
        return self._weights("adapter", {"a": torch.zeros(2, 10), "b": torch.zeros(10, 2, dtype=torch.bfloat16)})


def test_an_engine_serving_the_adapter_gets_the_base_once_then_the_adapter_alone_and_the_bytes_are_counted():
    from engine.rollout import sync_weights
    from engine.rollout.engines.base import RolloutEngine

    class Recording(RolloutEngine):
        serves_adapter = True

        def __init__(self):
            self.loaded = []

        def load_weights(self, weights):
            self.loaded.append(("weights", [name for name, _ in weights]))
            self.needs_base_weights = False

        def load_adapter(self, tensors):
            self.loaded.append(("adapter", [name for name, _ in tensors]))

    policy, engine = _Policy(), Recording()
    assert sync_weights(policy, engine) == 110 * 4 + 20 * 4 + 20 * 2  # the base (fp32) and the adapter (fp32, bf16)
    assert sync_weights(policy, engine) == 20 * 4 + 20 * 2  # then the adapter alone
    assert policy.drawn == ["base", "adapter", "adapter"]
    assert engine.loaded == [("weights", ["w", "b"]), ("adapter", ["a", "b"]), ("adapter", ["a", "b"])]
    merged = Recording()
    merged.serves_adapter = False
    assert sync_weights(policy, merged) == 110 * 4 and policy.drawn[-1] == "merged"
