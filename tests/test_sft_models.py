"""Model breadth: tiny Qwen3 (dense) and Qwen3-MoE (fused experts) train with the SFT loss under FSDP1 and FSDP2
on 2 gloo ranks: their decoder layers are the sharded units, the first loss and gradient norm equal a plain
process's, and a step on the batch lowers its loss. One spawn for the four combinations."""

import pytest
from distributed import run_ranks

pytestmark = pytest.mark.slow

SIZES = {"vocab_size": 96, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, "tie_word_embeddings": False}


def _model(kind: str):
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

    torch.manual_seed(0)
    if kind == "qwen3":
        return Qwen3ForCausalLM(Qwen3Config(**SIZES))
    return Qwen3MoeForCausalLM(Qwen3MoeConfig(**SIZES, moe_intermediate_size=16, num_experts=4, num_experts_per_tok=2,
                                              decoder_sparse_step=1, mlp_only_layers=[]))


def _items():
    import torch

    from engine.offline.masks import Tokenized

    g = torch.Generator().manual_seed(5)
    items = []
    for index in range(8):
        length = 6 + index * 3
        ids = torch.randint(1, SIZES["vocab_size"], (length,), generator=g).tolist()
        items.append(Tokenized(ids, [0] * (length // 2) + [1] * (length - length // 2), f"r:{index}"))
    return items


def _sharded_units(module) -> list[str]:
    """The class of every module FSDP shards as a unit (FSDP1 wraps it, FSDP2 subclasses it as FSDP<name>)."""
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    units = []
    for m in module.modules():
        if isinstance(m, FSDP):
            units.append(type(m.module).__name__)
        elif isinstance(m, FSDPModule):
            units.append(type(m).__name__.removeprefix("FSDP"))
    return units


def _train(rank: int) -> dict:
    import torch

    import accel_backends
    from engine import EngineConfig, FSDPEngine
    from engine.offline.objectives.sft.batches import rank_micro_batches
    from engine.offline.objectives.sft.trainer import token_loss
    from engine.offline.sequences import MicroBatch, sequence_batch
    from engine.packing import build_layout

    cpu, items, results = torch.device("cpu"), _items(), {}
    backend = accel_backends.get_backend()
    for kind in ("qwen3", "qwen3_moe"):
        reference = _model(kind)
        batch, masks = sequence_batch(items)
        layout = build_layout(batch, list(range(len(items))), packed=False)
        whole = MicroBatch(layout, masks[layout.rows, batch.starts[layout.rows] + layout.columns])
        ref_loss, _, _ = token_loss(reference, whole, cpu)
        ref_loss.backward()
        ref_norm = torch.sqrt(sum(p.grad.double().norm() ** 2 for p in reference.parameters() if p.grad is not None))
        for version in (1, 2):
            engine = FSDPEngine(lambda kind=kind: _model(kind), EngineConfig(fsdp_version=version, lr=1e-2,
                                                                              max_grad_norm=None), backend)
            units = _sharded_units(engine.module)
            packed = engine.packed_input_supported()
            micro, _ = rank_micro_batches(items, rank, 2, micro_batch_tokens=64, micro_batch_size=8, packed=packed)
            losses = []
            for _ in range(2):
                with engine.train_mode():
                    metrics = engine.forward_backward_batch(micro, lambda module, m: token_loss(module, m, cpu))
                    norm = engine.optimizer_step()
                losses.append(metrics["loss"])
                if len(losses) == 1:
                    first_norm = norm
            results[f"{kind}-fsdp{version}"] = {
                "units": units, "packed": packed, "losses": losses,
                "loss_error": abs(losses[0] - ref_loss.item()) / ref_loss.item(),
                "norm_error": abs(first_norm - float(ref_norm)) / float(ref_norm)}
    return results


def test_qwen3_and_qwen3_moe_train_under_fsdp1_and_fsdp2():
    results = run_ranks(_train, world_size=2)
    for name, got in results[0].items():
        layer = "Qwen3DecoderLayer" if name.startswith("qwen3-") else "Qwen3MoeDecoderLayer"
        assert got["units"].count(layer) == SIZES["num_hidden_layers"], (name, got["units"])
        assert got["loss_error"] <= 1e-5, (name, got)
        assert got["norm_error"] <= 1e-4, (name, got)
        assert got["losses"][1] < got["losses"][0], (name, got)
    assert results[0].keys() == {"qwen3-fsdp1", "qwen3-fsdp2", "qwen3_moe-fsdp1", "qwen3_moe-fsdp2"}
