"""Export of full Hugging Face weights from rank 0: plain, LoRA merged, and LoRA as a PEFT adapter."""

import pytest
from distributed import run_ranks

pytestmark = pytest.mark.slow


def _export(rank, root, fsdp_version, lora):
    import torch
    import torch.distributed as dist
    from tiny import make_micro_batches, tiny_qwen2, token_loss
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    from engine import EngineConfig, FSDPEngine

    config = EngineConfig(fsdp_version=fsdp_version, lr=5e-2, lora_rank=4 if lora else 0, lora_alpha=8)
    engine = FSDPEngine(tiny_qwen2, config)
    for step in range(2):  # move the weights (LoRA B starts at zero) so the export has something to show
        with engine.train_mode():
            engine.forward_backward_batch(make_micro_batches(step * 2 + rank, 2), token_loss)
            engine.optimizer_step()
    engine.export_hf(f"{root}/merged", merge_lora=True)
    if lora:
        engine.export_hf(f"{root}/adapter", merge_lora=False)
    full = get_model_state_dict(engine.module, options=StateDictOptions(full_state_dict=True))
    dist.barrier()
    if rank != 0:
        return None

    from transformers import AutoModelForCausalLM

    reference = tiny_qwen2()
    if lora:
        from peft import LoraConfig, get_peft_model

        reference = get_peft_model(reference, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"))
    reference.load_state_dict(full)
    ids = make_micro_batches(7, 1)[0]["input_ids"]
    with torch.no_grad():
        want = reference(input_ids=ids).logits
        merged = AutoModelForCausalLM.from_pretrained(f"{root}/merged")(input_ids=ids).logits
        result = {"merged": (merged - want).abs().max().item()}
        if lora:
            from peft import PeftModel

            adapter = PeftModel.from_pretrained(tiny_qwen2(), f"{root}/adapter")(input_ids=ids).logits
            result["adapter"] = (adapter - want).abs().max().item()
            result["lora_moved"] = any(
                k for k, v in full.items() if "lora_B" in k and v.abs().max().item() > 0)
    return result


@pytest.mark.parametrize("fsdp_version,lora", [(1, False), (2, True), (1, True)])
def test_exported_weights_reload_with_transformers_and_peft(tmp_path, fsdp_version, lora):
    result = run_ranks(_export, str(tmp_path), fsdp_version, lora)[0]
    print(result)
    assert result["merged"] < 1e-4
    if lora:
        assert result["lora_moved"] and result["adapter"] < 1e-5
        assert (tmp_path / "adapter" / "adapter_config.json").exists()
    assert (tmp_path / "merged" / "config.json").exists()
    assert not any(p.name.endswith(".partial") for p in tmp_path.iterdir())
