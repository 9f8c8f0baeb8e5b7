"""Bad configurations fail before any process group or model work, with a message that says what to fix."""

import pytest
import torch.distributed as dist
from distributed import run_ranks

from engine import EngineConfig, FSDPEngine


class FactorySpy:
    calls = 0

    def __call__(self):
        FactorySpy.calls += 1
        raise AssertionError("the model must not be built for a bad config")


@pytest.mark.parametrize(
    "options, message",
    [
        ({"fsdp_version": 3}, "fsdp_version must be 1 or 2, got 3"),
        ({"grad_sync": "sometimes"}, "grad_sync must be one of auto, deferred, every_micro_batch, got 'sometimes'"),
        ({"grad_sync_margin": 1.5}, r"grad_sync_margin is a fraction of free device memory in \[0, 1\)"),
        ({"optimizer_onload": "always"}, "optimizer_onload must be one of mode, step"),
        ({"generate_gather": "never"}, "generate_gather must be one of once, per_layer"),
        ({"keep_params_unsharded": True}, "keep_params_unsharded needs grad_sync='deferred' set explicitly"),
        ({"fsdp_version": 1, "keep_params_unsharded": True}, "keep_params_unsharded is an FSDP2 option"),
        ({"mixed_precision": "fp8"}, "mixed_precision must be one of"),
        ({"lr_schedule": "cosine"}, "set total_steps"),
        ({"lr": 0}, "lr must be positive"),
        ({"max_grad_norm": -1.0}, "max_grad_norm must be positive"),
    ],
)
def test_bad_config_fails_before_any_work(options, message):
    with pytest.raises(ValueError, match=message):
        FSDPEngine(FactorySpy(), EngineConfig(**options))
    with pytest.raises(ValueError, match=message):
        FSDPEngine(FactorySpy(), options)  # a plain mapping (from YAML) is checked the same way
    assert FactorySpy.calls == 0 and not dist.is_initialized()


def test_unknown_option_is_named():
    with pytest.raises(ValueError, match="unknown engine option 'grad_synk'.*grad_sync"):
        FSDPEngine(FactorySpy(), {"grad_synk": "deferred"})
    assert not dist.is_initialized()


def test_model_that_is_not_a_module_is_refused():
    with pytest.raises(ValueError, match="'Qwen/Qwen2-0.5B' is not a local Hugging Face model directory"):
        FSDPEngine("Qwen/Qwen2-0.5B", EngineConfig())
    with pytest.raises(TypeError, match="nn.Module, a zero-argument factory or a local Hugging Face model dir"):
        FSDPEngine(42, EngineConfig())
    assert not dist.is_initialized()


def _runtime_errors(rank, root):
    from pathlib import Path

    from tiny import tiny_qwen2, token_loss

    engine = FSDPEngine(tiny_qwen2, EngineConfig(fsdp_version=2))
    messages = []
    with pytest.raises(ValueError) as err:
        engine.forward_backward_batch([], token_loss)
    messages.append(str(err.value))
    file_path = Path(root, "not-a-directory")
    if rank == 0:
        file_path.write_text("x")
    dist.barrier()
    with pytest.raises(ValueError) as err:
        engine.save_checkpoint(file_path)
    messages.append(str(err.value))
    with pytest.raises(FileNotFoundError) as err:
        engine.load_checkpoint(Path(root, "missing"))
    messages.append(str(err.value))
    with pytest.raises(TypeError) as err:
        engine.forward_backward_batch([{"input_ids": None}], lambda module, batch: 1.5)
    messages.append(str(err.value))
    return messages


def test_runtime_misuse_is_explained(tmp_path):
    empty, is_file, missing, not_a_loss = run_ranks(_runtime_errors, str(tmp_path))[0]
    assert "no micro-batches" in empty
    assert "is a file: pass a directory" in is_file
    assert "no checkpoint at" in missing
    assert "scalar tensor" in not_a_loss


def _offloaded_misuse(rank):
    from tiny import make_micro_batches, tiny_qwen2, token_loss

    engine = FSDPEngine(tiny_qwen2, EngineConfig(param_offload=True))
    with pytest.raises(RuntimeError) as err:
        engine.forward_backward_batch(make_micro_batches(0, 1), token_loss)
    return str(err.value)


def test_work_on_offloaded_parameters_says_to_use_train_mode():
    message = run_ranks(_offloaded_misuse)[0]
    assert "offloaded" in message and "train_mode()" in message


def _frozen(rank):
    from tiny import make_micro_batches, tiny_qwen2, token_loss

    engine = FSDPEngine(tiny_qwen2, EngineConfig(frozen=True, param_offload=True))
    batches = make_micro_batches(rank, 2)
    with engine.eval_mode():
        loss = engine.forward_backward_batch(batches, token_loss, forward_only=True)["loss"]
        with pytest.raises(RuntimeError) as not_trainable:
            engine.forward_backward_batch(batches, token_loss)
    assert not any(p.requires_grad for p in engine.module.parameters())
    assert engine.residency()["params"] == "cpu"
    return loss, str(not_trainable.value)


def test_frozen_reference_engine_is_forward_only():
    loss, message = run_ranks(_frozen)[0]
    assert loss > 0 and "frozen" in message and "forward_only=True" in message
    with pytest.raises(ValueError, match="frozen engine has no optimizer"):
        EngineConfig(frozen=True, optimizer_offload=True)
