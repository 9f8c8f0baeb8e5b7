"""engine/rollout/engines and rollout.py, in process: the sampling distribution against transformers' own
processors, the trainer's truncated log-probs, the hf-continuous decode loop against ``generate``, the registry's
errors, and the checks that name an engine breaking the interface's contract."""

import sys

import pytest
import torch

import accel_backends
from engine.rl.logprobs import response_log_probs, token_log_probs
from engine.rollout.engines import (
    Responses,
    RolloutContext,
    RolloutEngine,
    RolloutEngineError,
    SamplingConfig,
    check_engine,
    create_rollout_engine,
    engine_names,
    hf_continuous,
    sampling_scores,
)
from engine.rollout.engines.hf import left_padded, mask_through_first_eos, model_generation_defaults_ignored
from engine.rollout.single_turn import check_responses, rollout, sync_weights

VOCAB = 64


def tiny_model(eos=None, eos_bias=0.0):
    """A random 2-layer Qwen2; ``eos`` made likely (as the fixture model does) so that rows end at different steps."""
    from engine.tiny_model import tiny_qwen2

    model = tiny_qwen2(seed=3, vocab_size=VOCAB, hidden_size=32, max_positions=64).eval()
    if eos is not None:
        with torch.no_grad():
            model.model.embed_tokens.weight[:, 0] = 1.0
            model.lm_head.weight[eos, 0] = eos_bias
    return model


@pytest.mark.parametrize(("top_k", "top_p"), [(0, 1.0), (5, 1.0), (0, 0.7), (12, 0.8), (1, 0.5)])
def test_sampling_scores_are_transformers_processors(top_k, top_p):
    from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    logits = torch.randn(6, 50, generator=torch.Generator().manual_seed(0))
    logits[0, :10] = logits[0, 10]  # ties at the top-k boundary are kept by both
    want = TemperatureLogitsWarper(0.7)(None, logits.clone())
    if top_k:
        want = TopKLogitsWarper(top_k)(None, want)
    if top_p < 1:
        want = TopPLogitsWarper(top_p)(None, want)
    got = sampling_scores(logits, 0.7, top_k, top_p)
    assert torch.equal(torch.isinf(got), torch.isinf(want)) and torch.allclose(got, want)
    if top_k or top_p < 1:
        assert torch.isinf(got).any()  # the case really truncates
    dropped = torch.isinf(got).float().argmax(dim=-1)
    kept = sampling_scores(logits, 0.7, top_k, top_p, keep=dropped)
    assert not torch.isinf(kept.gather(-1, dropped.unsqueeze(-1))).any()


def test_trainer_log_probs_and_entropy_follow_the_truncation():
    logits = torch.randn(3, 7, 40, dtype=torch.float64, generator=torch.Generator().manual_seed(1),
                         requires_grad=True)
    scores = sampling_scores(logits, 0.8, 10, 0.9).reshape(21, 40)
    targets = torch.distributions.Categorical(logits=scores).sample().reshape(3, 7)
    want = torch.log_softmax(scores, -1).reshape(3, 7, 40).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    got, entropy = token_log_probs(logits, targets, 0.8, with_entropy=True, top_k=10, top_p=0.9)
    assert torch.allclose(got, want.float(), atol=1e-5)
    probs = torch.softmax(scores, -1)
    truncated_entropy = -(probs * torch.log_softmax(scores, -1).nan_to_num(neginf=0.0)).sum(-1).reshape(3, 7)
    assert torch.allclose(entropy, truncated_entropy.float(), atol=1e-5) and torch.isfinite(entropy).all()
    (grad,) = torch.autograd.grad(got.sum(), logits)
    assert torch.isfinite(grad).all() and grad.abs().sum() > 0


def _eos_model_and_prompts():
    model = tiny_model(eos=7, eos_bias=2.0)
    prompts = [[5, 9, 11], [13, 17, 19, 23, 29], [31]]  # different lengths: left padding
    ids, mask = left_padded(prompts, 3, pad_id=0)
    return model, ids, mask


def _greedy(model, ids, mask, eos, steps=12):
    with torch.no_grad(), model_generation_defaults_ignored(model):
        return model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=steps, do_sample=False,
                              eos_token_id=[eos], pad_token_id=0)[:, ids.size(1):]


def test_greedy_decode_equals_generate_as_rows_leave_the_batch():
    model = tiny_model()
    ids, mask = left_padded([[5, 9, 11], [13, 17, 19, 23, 29], [31], [2, 3]], 1, pad_id=0)  # left padding
    # The EOS: the token of the greedy continuations that ends them at the most different steps.
    free_run = SamplingConfig(n=1, max_new_tokens=12, eos_token_ids=(VOCAB,), temperature=0.0)  # nothing ends
    with torch.no_grad():
        probe = hf_continuous.decode(model, ids, mask, free_run, pad_id=0).token_ids

    def lengths(eos):
        return tuple(mask_through_first_eos(probe, [eos]).sum(dim=1).tolist())

    eos = max(set(probe.flatten().tolist()), key=lambda token: len(set(lengths(token))))
    assert len(set(lengths(eos))) >= 3, "rows should end at different steps for this check to mean anything"
    reference = _greedy(model, ids, mask, eos)
    want = mask_through_first_eos(reference, [eos])
    sampling = SamplingConfig(n=1, max_new_tokens=12, eos_token_ids=(eos,), temperature=0.0)
    with torch.no_grad():
        got = hf_continuous.decode(model, ids, mask, sampling, pad_id=0)
    assert torch.equal(got.mask[:, :want.size(1)], want) and int(got.mask.sum()) == int(want.sum())
    assert torch.equal(got.token_ids[:, :reference.size(1)] * want, reference * want)


def test_sampled_tokens_computed_and_produced_and_on_policy(monkeypatch):
    from transformers import DynamicCache

    model, ids, mask = _eos_model_and_prompts()
    sampling = SamplingConfig(n=3, max_new_tokens=16, eos_token_ids=(7, 8), temperature=0.9, top_k=20, top_p=0.95,
                              log_probs=True)
    with torch.no_grad():
        torch.manual_seed(0)
        batched = hf_continuous.decode(model, ids, mask, sampling, pad_id=0)
        monkeypatch.setattr(hf_continuous, "LEAVE_AT", 0.0)  # every finished row leaves at once
        torch.manual_seed(0)
        eager = hf_continuous.decode(model, ids, mask, sampling, pad_id=0)
        monkeypatch.setattr(hf_continuous, "_kv_cache", lambda model, capacity: DynamicCache(config=model.config))
        torch.manual_seed(0)
        concatenating = hf_continuous.decode(model, ids, mask, sampling, pad_id=0)  # transformers' own cache
    assert torch.equal(concatenating.token_ids, eager.token_ids) and torch.equal(concatenating.log_probs,
                                                                                 eager.log_probs)
    produced = int(eager.mask.sum())
    assert eager.tokens_computed == produced
    assert torch.equal(batched.token_ids * batched.mask, eager.token_ids * eager.mask)  # the same draws
    assert produced <= batched.tokens_computed <= produced / (1 - hf_continuous.LEAVE_AT)
    width = int(eager.mask.sum(dim=1).max())
    full = torch.cat([ids, eager.token_ids[:, :width]], dim=1)
    with torch.no_grad():
        recomputed = response_log_probs(model, full, torch.cat([mask, eager.mask[:, :width]], dim=1), ids.size(1),
                                        0.9, top_k=20, top_p=0.95)
    on = eager.mask[:, :width].bool()
    assert (recomputed - eager.log_probs[:, :width])[on].abs().max() < 1e-5


# -- the registry ------------------------------------------------------------------------------------------------

def test_unknown_engine_lists_the_registered_names():
    assert {"hf", "hf-continuous"} <= set(engine_names())
    (problem,) = check_engine("hf-continous")
    assert "unknown rollout.engine 'hf-continous' (did you mean hf-continuous?)" in problem
    assert "registered engines are hf, hf-continuous" in problem


def _plugin(tmp_path, monkeypatch, name, source):
    (tmp_path / f"{name}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("ACCEL_BACKENDS_PLUGINS", name)
    accel_backends.reset_registry()


def test_a_plugin_that_raises_on_import_is_named_before_training(tmp_path, monkeypatch):
    _plugin(tmp_path, monkeypatch, "broken_rollout_plugin", "raise ImportError('libvllm.so: cannot open')\n")
    from engine.rl.algorithms.grpo.config import build_config, check

    config = build_config("cpu-demo", None, [])  # the demo's config: valid but for the engine
    config.rollout.engine = "sglang"
    with pytest.warns(accel_backends.PluginLoadWarning, match="broken_rollout_plugin"):
        problems = check(config, world_size=2)
    (problem,) = [p for p in problems if "rollout.engine" in p]
    assert "unknown rollout.engine 'sglang'" in problem and "registered engines are hf, hf-continuous" in problem
    assert "'broken_rollout_plugin' (from ACCEL_BACKENDS_PLUGINS) failed to load: ImportError: libvllm.so" in problem


def test_an_engine_that_fails_to_import_when_chosen_is_named_with_its_plugin(tmp_path, monkeypatch):
    (tmp_path / "sglang_engine_impl.py").write_text("import not_installed_inference_library\n")
    _plugin(tmp_path, monkeypatch, "lazy_rollout_plugin", (
        "import accel_backends\n"
        "from engine.rollout.engines import hookspecs\n\n"
        "@accel_backends.hookimpl\n"
        "def register_rollout_engines(register):\n"
        "    register('sglang', 'sglang_engine_impl:Engine')\n"))
    assert "sglang" in engine_names()  # registering imported nothing
    assert "sglang_engine_impl" not in sys.modules
    (problem,) = check_engine("sglang")
    assert problem.startswith("rollout.engine 'sglang' (from plugin 'lazy_rollout_plugin') "
                              "'sglang_engine_impl:Engine': cannot import module 'sglang_engine_impl' "
                              "(ModuleNotFoundError: No module named 'not_installed_inference_library'); install "
                              "what it needs, or choose another engine (hf, hf-continuous")


def test_a_name_registered_twice_names_both_plugins(tmp_path, monkeypatch):
    _plugin(tmp_path, monkeypatch, "clashing_rollout_plugin", (
        "import accel_backends\n"
        "from engine.rollout.engines import hookspecs, RolloutEngine\n\n"
        "@accel_backends.hookimpl\n"
        "def register_rollout_engines(register):\n"
        "    register('hf', RolloutEngine)\n"))
    with pytest.raises(RolloutEngineError, match="'hf' is registered twice: by plugin 'builtin.rollout_engines' and "
                                                 "by plugin 'clashing_rollout_plugin'"):
        engine_names()


# -- the contract, checked on what an engine returns ------------------------------------------------------------

class Scripted(RolloutEngine):
    """Returns what the test put in ``reply``: a stand-in for a third-party engine that may break the contract."""

    reply = None

    def generate(self, prompts, sampling):
        return self.reply


@pytest.fixture
def scripted(monkeypatch):
    class Plugin:
        @accel_backends.hookimpl
        def register_rollout_engines(self, register):
            register("scripted", Scripted)

    from engine.rollout.engines import hookspecs  # noqa: F401

    accel_backends.register_plugin(Plugin(), name="scripted-plugin")
    return create_rollout_engine("scripted", RolloutContext(policy=None, tokenizer=None, model=None))


def _char_tokenizer():
    from engine.rl.tokenizer import build_char_tokenizer

    return build_char_tokenizer("abcdef ")


def test_rollout_lays_out_what_a_well_behaved_engine_returned(scripted):
    tokenizer = _char_tokenizer()
    eos = tokenizer.eos_token_id
    a, b, c = tokenizer.convert_tokens_to_ids(["a", "b", "c"])
    sampling = SamplingConfig(n=2, max_new_tokens=3, eos_token_ids=(eos,))
    scripted.reply = Responses(token_ids=torch.tensor([[a, eos, 99, 99], [b, c, a, 99], [eos, 99, 99, 99],
                                                       [c, c, eos, 99]]),
                               mask=torch.tensor([[1, 1, 0, 0], [1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 1, 0]]),
                               tokens_computed=12)
    batch = rollout(scripted, tokenizer, ["ab", "c"], sampling)
    assert batch.prompt_length == 2 and batch.response_ids.size(1) == 3  # trimmed to the longest response
    assert batch.responses == ["a", "bca", "", "cc"]
    assert batch.clipped.tolist() == [False, True, False, False] and batch.tokens_computed == 12
    assert batch.input_ids[2].tolist() == [tokenizer.pad_token_id, c, eos, 0, 0]  # prompt left-, response right-padded
    assert batch.attention_mask[2].tolist() == [0, 1, 1, 0, 0]


@pytest.mark.parametrize(("ids", "mask", "message"), [
    ([[1, 2]] * 3, [[1, 1]] * 3, r"returned 3 responses for 2 prompts x rollout.n=1: it must return 2"),
    ([[1, 1, 1, 1]] * 2, [[1, 1, 1, 1]] * 2, r"returned a response of 4 tokens, longer than rollout.max_new_tokens=3"),
    ([[9, 1, 1]] * 2, [[1, 1, 0]] * 2, r"returned a response that goes on after an EOS id: .* \[9\]"),
    ([[1, 1, 1]] * 2, [[0, 1, 1]] * 2, r"returned a mask that is not 1 for each response's first tokens"),
])
def test_a_broken_engine_is_named(ids, mask, message):
    sampling = SamplingConfig(n=1, max_new_tokens=3, eos_token_ids=(9,))
    reply = Responses(token_ids=torch.tensor(ids), mask=torch.tensor(mask), tokens_computed=0)
    with pytest.raises(RolloutEngineError, match=r"^rollout engine 'vllm' " + message):
        check_responses("vllm", reply, prompts=2, sampling=sampling)


def test_weight_sync_refuses_an_engine_that_stops_early():
    drawn = []

    class Policy:
        def iter_full_weights(self):
            for index in range(4):
                drawn.append(index)
                yield f"w{index}", torch.zeros(1)

    class TakesTwo(RolloutEngine):
        name = "lazy"

        def load_weights(self, weights):
            next(weights)
            next(weights)

    with pytest.raises(RolloutEngineError, match="'lazy' took 2 of 4 weight tensors"):
        sync_weights(Policy(), TakesTwo(None))
    assert drawn == [0, 1, 2, 3]  # every tensor was still drawn: each draw is a collective on every rank

    class OwnWeights(RolloutEngine):
        receives_weights = False  # decodes with the policy's own parameters: nothing to send

    drawn.clear()
    sync_weights(Policy(), OwnWeights(None))
    assert drawn == []


def test_the_docs_plugin_example_is_under_60_lines_samples_and_takes_the_weights():
    import re
    from types import SimpleNamespace

    from conftest import REPO

    blocks = re.findall(r"```python\n(.*?)```", (REPO / "docs" / "grpo.md").read_text(), flags=re.S)
    (source,) = [block for block in blocks if "class CopyEngine" in block]
    assert len(source.splitlines()) < 60
    namespace = {"__name__": "doc_example"}
    exec(compile(source, "docs/grpo.md (CopyEngine)", "exec"), namespace)
    registered = {}
    namespace["register_rollout_engines"](lambda name, engine: registered.update({name: engine}))
    context = RolloutContext(policy=None, tokenizer=SimpleNamespace(pad_token_id=0), model=tiny_model)
    engine = registered["copy"](context)
    sampling = SamplingConfig(n=2, max_new_tokens=6, eos_token_ids=(7,), temperature=0.8, top_k=10)
    responses = engine.generate([[5, 9], [13, 17, 19]], sampling)
    check_responses("copy", responses, prompts=2, sampling=sampling)
    trained = tiny_model(eos=7, eos_bias=1.5)  # different weights, the same names
    engine.load_weights((name, param.detach()) for name, param in trained.named_parameters())
    assert all(torch.equal(mine, theirs) for mine, theirs in zip(engine.model.parameters(), trained.parameters(),
                                                                   strict=True))


def test_training_rollouts_ask_for_log_probs_where_the_engine_gives_them_cheaply():
    from engine.rollout.engines.hf import HFRolloutEngine
    from engine.rollout.engines.hf_continuous import ContinuousRolloutEngine

    assert RolloutEngine.cheap_log_probs and ContinuousRolloutEngine.cheap_log_probs  # plugins, vllm: asked
    assert not HFRolloutEngine.cheap_log_probs  # generate() would keep every step's full scores


def test_plugins_written_against_the_old_module_path_get_the_same_modules():
    import engine.rollout.engines as moved
    from engine.grpo.rollout_engines import RolloutEngine as old_base_class
    from engine.grpo.rollout_engines import hookspecs as old_hookspecs
    from engine.grpo.rollout_engines.hf import left_padded as old_left_padded

    assert old_base_class is moved.RolloutEngine and old_hookspecs is moved.hookspecs
    assert old_left_padded is moved.left_padded
