"""Rank-0 loading on 2 real ranks: rank 1 builds on the meta device, receives rank 0's weights, trains the same."""

import pytest
from distributed import run_ranks

pytestmark = pytest.mark.slow


def _tied_qwen2():
    import torch
    from tiny import qwen2_config
    from transformers import Qwen2ForCausalLM

    config = qwen2_config()
    config.tie_word_embeddings = True
    torch.manual_seed(4321)
    return Qwen2ForCausalLM(config)


class RecordingFactory:
    """A model factory that records the device ``torch.empty`` lands on when it runs (meta or real)."""

    def __init__(self, build):
        self.build, self.devices = build, []

    def __call__(self):
        import torch

        self.devices.append(torch.empty(1).device.type)
        return self.build()


def _train(engine, rank):
    from engine_checks import full_params
    from tiny import make_micro_batches, token_loss

    losses = []
    for step in range(2):
        with engine.train_mode():
            losses.append(engine.forward_backward_batch(make_micro_batches(rank * 10 + step, 2), token_loss)["loss"])
            engine.optimizer_step()
    return losses, full_params(engine)


def _loading(rank, model_dir):
    import torch
    from engine_checks import assert_bitwise_equal
    from tiny import tiny_qwen2

    from engine import EngineConfig, FSDPEngine

    report = {}
    cases = {"fsdp2_path": (2, 0), "fsdp2_lora_factory": (2, 4), "fsdp1_tied_factory": (1, 0),
             "fsdp1_lora_path": (1, 4)}
    for name, (version, lora) in cases.items():
        build = _tied_qwen2 if "tied" in name else tiny_qwen2
        factory = RecordingFactory(build)
        config = dict(fsdp_version=version, lora_rank=lora, lr=1e-3)
        source = model_dir if "path" in name else factory
        engine = FSDPEngine(source, EngineConfig(**config))
        # Today's way: every rank builds the model in full (same source, same seeds).
        reference = FSDPEngine(model_dir if "path" in name else build, EngineConfig(**config, load_on_rank0=False))
        if "tied" in name:
            inner = engine.module.module
            report[name + ":tied"] = inner.lm_head.weight is inner.model.embed_tokens.weight
        got, want = _train(engine, rank), _train(reference, rank)
        assert got[0] == want[0], (name, got[0], want[0])
        assert set(got[1]) == set(want[1])
        assert_bitwise_equal(got[1], want[1])
        rotary = [b for n, b in engine.module.named_buffers() if n.endswith("inv_freq")]
        assert rotary and all(torch.isfinite(b).all() for b in rotary)
        report[name] = {"loaded_on_rank0": engine.loaded_on_rank0, "factory_devices": factory.devices}
    # A factory that refuses the meta device (from_pretrained does) is built in full, with a warning saying so.
    import warnings

    from transformers import AutoModelForCausalLM

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        engine = FSDPEngine(lambda: AutoModelForCausalLM.from_pretrained(model_dir), EngineConfig(lr=1e-3))
    report["pretrained_factory_warned"] = any("cannot run on the meta device" in str(w.message) for w in caught)
    losses, _ = _train(engine, rank)
    report["pretrained_factory_losses"] = losses
    report["path_losses"] = _train(FSDPEngine(model_dir, EngineConfig(lr=1e-3)), rank)[0]
    report.update(_checks_fail(rank, model_dir))
    return report


def _checks_fail(rank, model_dir):
    """Both weight checks can fail: a shard that is not rank 0's weights, and ranks that built different models."""
    import torch
    from tiny import tiny_qwen2
    from transformers import AutoModelForCausalLM

    from engine import EngineConfig, FSDPEngine
    from engine.fsdp import rank0_loading as loading

    outcome = {}
    engine = FSDPEngine(model_dir, EngineConfig(fsdp_version=1, lr=1e-3))
    expected = None
    if rank == 0:
        expected = loading.fingerprint(AutoModelForCausalLM.from_pretrained(model_dir).named_parameters())
    device = engine.backend.metrics_device()
    loading.check_received(engine.module, 1, expected, device)  # what rank 0 sent: passes
    if rank == 1:
        with torch.no_grad():
            next(p for p in engine.module.parameters() if p.numel())[0] += 1.0  # one element missed
    try:
        loading.check_received(engine.module, 1, expected, device)
    except RuntimeError as error:
        outcome["missed_element"] = str(error)
    # A layout rank 1 cannot load into stops every rank with the reason (none waits for rank 0's sends).
    real_pieces = loading._fsdp2_pieces
    if rank == 1:
        loading._fsdp2_pieces = lambda module: ([], "a layout this test made up")
    try:
        FSDPEngine(model_dir, EngineConfig(lr=1e-3))
    except RuntimeError as error:
        outcome["layout_problem"] = str(error)
    finally:
        loading._fsdp2_pieces = real_pieces
    model = tiny_qwen2()
    if rank == 1:
        with torch.no_grad():
            next(model.parameters())[0, 0] += 1.0
    try:
        FSDPEngine(model, EngineConfig(lr=1e-3))
    except ValueError as error:
        outcome["different_weights"] = str(error)
    return outcome


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    """Both ranks' reports of the one 2-rank spawn; each test below checks one property of them."""
    from tiny import tiny_qwen2

    model_dir = tmp_path_factory.mktemp("loading") / "model"
    tiny_qwen2().save_pretrained(model_dir)
    return run_ranks(_loading, str(model_dir), env={"ACCEL_BACKEND": "strict"})  # a device's rules


def test_every_engine_kind_loads_on_rank0(reports):
    for report in reports:
        for name in ("fsdp2_path", "fsdp2_lora_factory", "fsdp1_tied_factory", "fsdp1_lora_path"):
            assert report[name]["loaded_on_rank0"] is True
        assert report["fsdp1_tied_factory:tied"] is True


def test_the_factory_runs_for_real_on_rank0_and_on_the_meta_device_elsewhere(reports):
    # The factory ran once per rank: for real on rank 0, on the meta device elsewhere.
    for rank, report in enumerate(reports):
        want = ["cpu"] if rank == 0 else ["meta"]
        assert report["fsdp2_lora_factory"]["factory_devices"] == want
        assert report["fsdp1_tied_factory"]["factory_devices"] == want


def test_a_factory_refusing_the_meta_device_is_built_in_full_with_a_warning_and_trains_the_same(reports):
    for rank, report in enumerate(reports):
        assert report["pretrained_factory_warned"] is (rank == 1)
        assert report["pretrained_factory_losses"] == report["path_losses"]


def test_rank0_loading_failures_are_explained(reports):
    for report in reports:
        assert "rank-0 loading failed" in report["missed_element"]
        assert "ranks built different model weights" in report["different_weights"]
        assert "a layout this test made up" in report["layout_problem"]


def _three_ranks(rank, model_dir):
    from engine_checks import assert_bitwise_equal

    from engine import EngineConfig, FSDPEngine

    losses = {}
    for version in (1, 2):
        engine = FSDPEngine(model_dir, EngineConfig(fsdp_version=version, lr=1e-3))
        reference = FSDPEngine(model_dir, EngineConfig(fsdp_version=version, lr=1e-3, load_on_rank0=False))
        got, want = _train(engine, rank), _train(reference, rank)
        assert got[0] == want[0], (version, got[0], want[0])
        assert_bitwise_equal(got[1], want[1])
        losses[version] = (engine.loaded_on_rank0, got[0])
    return losses


def test_rank0_loading_on_three_ranks(tmp_path):
    """Shards of uneven sizes (64 rows over 3 ranks: 22, 22, 20) and rank 0 sending to two ranks."""
    from tiny import tiny_qwen2

    tiny_qwen2().save_pretrained(tmp_path / "model")
    reports = run_ranks(_three_ranks, str(tmp_path / "model"), world_size=3)
    assert all(report[version][0] is True for report in reports for version in (1, 2))
