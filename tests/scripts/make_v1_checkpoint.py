"""Write the checkpoint that tests/test_checkpoint_compat.py loads: a tiny Qwen2 trained two steps on 2 ranks.

    PYTHONPATH=. python tests/scripts/make_v1_checkpoint.py tests/data/checkpoint_v1

The directory it wrote (with ``expected.json``: the step and a float64 sum of every parameter, keyed by name) was
made by the engine as it was before the layers moved (commit 744b2d7), so that test proves checkpoints written
then still load now. Run again only to write a fresh one; the committed one must stay as it is.
"""

import json
import sys
from pathlib import Path

import torch


def tiny():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    return Qwen2ForCausalLM(Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                                        tie_word_embeddings=False))


def loss(module, ids):
    return module(input_ids=ids, labels=ids).loss, ids.numel()


def write(rank, out):
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    from engine import EngineConfig, FSDPEngine

    engine = FSDPEngine(tiny, EngineConfig(fsdp_version=2, lr=1e-2))
    g = torch.Generator().manual_seed(rank)
    for _ in range(2):
        with engine.train_mode():
            engine.forward_backward_batch([torch.randint(0, 64, (2, 8), generator=g)], loss)
            engine.optimizer_step()
    engine.save_checkpoint(Path(out) / "step_000002")
    full = get_model_state_dict(engine.module, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if rank == 0:
        sums = {name: float(t.double().sum()) for name, t in full.items()}
        (Path(out) / "expected.json").write_text(json.dumps({"step": 2, "sums": sums}, indent=1, sort_keys=True))


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from distributed import run_ranks

    run_ranks(write, sys.argv[1])
