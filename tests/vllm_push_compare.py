"""The push-and-compare checks both vLLM modes share (tests/test_vllm_engine_ranks.py: the colocated engine,
tests/test_vllm_server_ranks.py: a server): an engine's log-probs of fixed token sequences against the trainer's
before an update, stale after it, equal again after the push (and different from before it, so the check can
fail), and the same with a LoRA policy whose merged adapters are pushed."""

import time


def trainer_log_probs(policy, batch, temperature=1.0, top_k=0, top_p=1.0):
    import torch

    from engine.rl.logprobs import response_log_probs

    with policy.eval_mode(), torch.no_grad():
        return response_log_probs(policy.module, batch.input_ids, batch.attention_mask, batch.prompt_length,
                                  temperature, top_k=top_k, top_p=top_p).float().cpu()


def largest_gap(a, b, mask):
    return float(((a - b).abs() * mask).max())


def big_update(policy, batch):
    """One optimizer step that raises the log-probs of ``batch``'s responses (large learning rate)."""
    from engine.rl.logprobs import response_log_probs

    mask = batch.response_mask.float()

    def step(module, _):
        log_probs = response_log_probs(module, batch.input_ids, batch.attention_mask, batch.prompt_length, 1.0)
        return -(log_probs * mask).sum() / mask.sum()

    with policy.train_mode():
        policy.forward_backward_batch([None], step)
        policy.optimizer_step()


def _update_then_push(policy, engine, batch, engine_log_probs, out: dict):
    """The engine against the trainer before an update (``before_gap``), after it (``stale_gap``) and after the
    push (``after_gap``; ``moved``: against before), the push's seconds and bytes; returns the updated trainer's
    log-probs of ``batch``."""
    from engine.rollout import sync_weights

    mask = batch.response_mask.float()
    engine_before = engine_log_probs(batch)
    out["before_gap"] = largest_gap(engine_before, trainer_log_probs(policy, batch), mask)
    big_update(policy, batch)
    trainer_after = trainer_log_probs(policy, batch)
    out["stale_gap"] = largest_gap(engine_log_probs(batch), trainer_after, mask)
    started = time.perf_counter()
    out["pushed_bytes"] = sync_weights(policy, engine)
    out["push_after_update_s"] = time.perf_counter() - started
    engine_after = engine_log_probs(batch)
    out["after_gap"] = largest_gap(engine_after, trainer_after, mask)
    out["moved"] = largest_gap(engine_after, engine_before, mask)
    return trainer_after


def push_and_compare(policy, engine, batch, engine_log_probs, model_dir) -> tuple[dict, object]:
    """The gaps (``before_gap``, ``stale_gap``, ``after_gap``, ``moved``, ``lora_gap``, ``lora_moved``), the push's
    seconds after the update (``push_after_update_s``), and the updated policy's log-probs of ``batch``.
    ``engine_log_probs(batch)``: the engine's log-probs of the batch's responses as fixed sequences."""
    from engine import EngineConfig, FSDPEngine
    from engine.rollout import sync_weights

    out, mask = {}, batch.response_mask.float()
    trainer_after = _update_then_push(policy, engine, batch, engine_log_probs, out)
    # LoRA: the merged adapters arrive under the plain names.
    lora = FSDPEngine(str(model_dir), EngineConfig(fsdp_version=2, lr=0.05, max_grad_norm=1e9, lora_rank=4))
    big_update(lora, batch)
    lora_log_probs = trainer_log_probs(lora, batch)
    sync_weights(lora, engine)
    out["lora_gap"] = largest_gap(engine_log_probs(batch), lora_log_probs, mask)
    out["lora_moved"] = largest_gap(lora_log_probs, trainer_after, mask)
    return out, trainer_after


def assert_pushed(out: dict) -> None:
    """What every push-and-compare must show."""
    assert out["before_gap"] < 1e-4, out
    assert out["stale_gap"] > 0.05, out  # the update moved the policy; the engine has not seen it yet
    assert out["after_gap"] < 1e-4 and out["moved"] > 0.05, out  # pushed: equal again, and not the old ones
    assert out["lora_gap"] < 1e-4 and out["lora_moved"] > 0.05, out  # LoRA merged into the pushed weights


def push_adapter_and_compare(policy, engine, batch, engine_log_probs) -> dict:
    """``rollout.vllm.lora_sync=adapter``: ``policy`` a LoRA engine, ``engine`` serving its base with LoRA (built
    after the policy, nothing pushed yet). The first push (base once, then the adapter), an update whose adapter
    the engine has not seen yet (stale), the adapter push after it (equal again, and moved), and what each push
    sent: ``first_bytes``, ``adapter_bytes`` (the second push) against the adapter's and the merged model's bytes."""
    from engine.rollout import sync_weights

    out = {"first_bytes": sync_weights(policy, engine), "base_pushed_first": not engine.needs_base_weights}
    big_update(policy, batch)  # B leaves zero: from here on the adapter changes the policy's log-probs
    sync_weights(policy, engine)
    _update_then_push(policy, engine, batch, engine_log_probs, out)
    out["adapter_bytes"] = out.pop("pushed_bytes")
    sizes = lambda weights: sum(t.numel() * t.element_size() for _, t in weights)  # noqa: E731
    out["adapter_own_bytes"] = sizes(policy.iter_adapter_weights())
    out["merged_bytes"] = sizes(policy.iter_full_weights())
    out["base_bytes"] = sizes(policy.iter_full_weights(base_only=True))
    out["lora_tensors"] = sum(1 for _ in policy.iter_adapter_weights())
    return out


def assert_adapter_pushed(out: dict) -> None:
    """What every adapter push-and-compare must show."""
    assert out["base_pushed_first"] and out["first_bytes"] == out["base_bytes"] + out["adapter_own_bytes"], out
    assert out["before_gap"] < 1e-4, out
    assert out["stale_gap"] > 0.05, out  # the update moved the adapter; the engine has not seen it yet
    assert out["after_gap"] < 1e-4 and out["moved"] > 0.05, out  # pushed: equal again, and not the old ones
    assert out["adapter_bytes"] == out["adapter_own_bytes"] < out["merged_bytes"], out  # the adapter alone


def perturb(policy, fraction: float, seed: int) -> None:
    """An update that moves ``fraction`` of the policy's elements (each rank its own shard), the rest left alone
    bit for bit: what a low-precision step does to most weights, on the fp32 model the tests serve."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in policy.module.parameters():
            local = param.to_local() if hasattr(param, "to_local") else param
            moved = torch.rand(local.shape, generator=generator) < fraction
            local.add_(moved * torch.randn(local.shape, generator=generator) * 0.05)


def delta_push_and_compare(policy, engine, batch, engine_log_probs, drop_copy, steps: int = 3) -> dict:
    """``rollout.vllm.weight_sync=delta``: ``engine`` built with it, nothing pushed yet. The first push (whole), then
    ``steps`` times: an update moving 5% of the elements, its delta push (bytes, the engine's log-probs, their gap
    to the trainer's), then the same weights pushed whole (``drop_copy()`` forgets the sender's copy) and the
    engine's log-probs again: equal to the delta-pushed ones bit for bit where the engine's weights were."""
    import torch

    from engine.rollout import sync_weights

    mask = batch.response_mask.float()
    out = {"first_bytes": sync_weights(policy, engine),
           "model_bytes": sum(t.numel() * t.element_size() for _, t in policy.iter_full_weights()), "steps": []}
    before = engine_log_probs(batch)
    for step in range(steps):
        perturb(policy, 0.05, seed=100 + step + 10 * policy.rank)
        sent = sync_weights(policy, engine)
        changed = engine.push_stats.changed_frac
        after_delta = engine_log_probs(batch)
        trainer = trainer_log_probs(policy, batch)
        drop_copy()
        whole = sync_weights(policy, engine)
        after_whole = engine_log_probs(batch)
        out["steps"].append({"sent": sent, "changed": changed, "whole": whole,
                             "gap": largest_gap(after_delta, trainer, mask),
                             "moved": largest_gap(after_delta, before, mask),
                             "bit_equal_to_whole": bool(torch.equal(after_delta, after_whole))})
        before = after_delta
    return out


def assert_delta_pushed(out: dict, sender: bool = True) -> None:
    """What every delta push-and-compare must show (``sender``: this rank put the bytes on the wire)."""
    assert out["first_bytes"] == (out["model_bytes"] if sender else 0), out  # the first push whole
    for step in out["steps"]:
        assert step["bit_equal_to_whole"], out  # the delta left the engine where a whole push does
        assert step["gap"] < 1e-4 and step["moved"] > 1e-3, out  # the new weights, not the old
        if sender:
            assert 0 < step["sent"] < out["model_bytes"] / 2 and step["whole"] == out["model_bytes"], out
            assert 0.01 < step["changed"] < 0.2, out
