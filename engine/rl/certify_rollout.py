"""The rollout side of the report card: ``accel-backends certify NAME --rollout ENGINE``.

The trainer's card says whether what the trainer reduces, keeps and pushes is exact; the field's silent bugs now
live on the other side, in the rollout engine's RL lifecycle (outputs that change after a sleep and wake, memory not
given back, a prefix cache that serves the old weights' keys and values after a push). Each property here runs one
engine (``hf``, ``hf-continuous``, ``vllm`` colocated, ``vllm-server``) against an FSDP policy on the backend, on a
tiny model directory written for the card, and says "not applicable" where the engine keeps no such state (``hf``
decodes with the policy's own parameters: it has nothing to sleep, nothing to push, no version to serve).

The engine and the policy are built once per card process (``_setup``) and closed when the card's job ends. The
properties reach the card through this module's ``register_certify_properties`` (the project's
``accel_backends.conformance`` entry point ``rollout``; in a checkout that is not installed,
``ACCEL_BACKENDS_PLUGINS=engine.conformance,engine.rl.certify_rollout``).
"""

from __future__ import annotations

import dataclasses
import tempfile

import torch

from accel_backends import DeviceBackend, hookimpl
from accel_backends.testing import card_context
from accel_backends.testing.card_context import current_precision
from accel_backends.testing.certify import Measurement, Property
from accel_backends.testing.rules import RuleSkipped

# The engine's log-probs of its own samples against the trainer's, on the same tokens: float32 compute through
# other kernels (vLLM's CPU build: about 1e-5) and, in bf16, 8 bits of mantissa.
GAP_BOUND, BF16_GAP_BOUND = 1e-3, 1e-1
CYCLES = 3  # sleep / wake cycles
PROMPTS = ["how many apples does Tom have", "the capital of Peru is", "two plus two makes", "Maria sold her bike"]


@dataclasses.dataclass
class Setup:
    """What every rollout property of one card process shares."""

    policy: object
    engine: object
    tokenizer: object
    eos: tuple[int, ...]


_setups: dict[str, Setup] = {}


def _setup(backend: DeviceBackend) -> Setup:
    name = card_context.current_rollout_engine()
    if name is None:
        raise RuleSkipped("not a rollout card (accel-backends certify NAME --rollout ENGINE)")
    if name not in _setups:
        _setups[name] = _build(backend, name)
        card_context.at_card_end(lambda: _setups.pop(name).engine.close())
    return _setups[name]


def _build(backend: DeviceBackend, name: str) -> Setup:
    from transformers import AutoTokenizer

    from .. import EngineConfig, FSDPEngine
    from ..demo_model import make_tiny_model
    from ..rollout import eos_token_ids, sync_weights
    from ..rollout.engines import RolloutContext, create_rollout_engine
    from ..rollout.engines.vllm_settings import VLLMConfig
    from .schema import RolloutConfig

    # hidden 128 / 4 heads: vLLM's CPU attention has kernels for head sizes of 32 and up; no EOS boost, so greedy
    # responses have their full length.
    directory = make_tiny_model(tempfile.mkdtemp(prefix="accel-rollout-card-"), hidden_size=128, layers=2,
                                eos_bias=0.0)
    tokenizer = AutoTokenizer.from_pretrained(directory, padding_side="left")
    policy = FSDPEngine(str(directory), EngineConfig(fsdp_version=2, lr=0.05, max_grad_norm=1e9,
                                                     mixed_precision=current_precision()), backend=backend)
    registered = "vllm" if name == "vllm-server" else name
    config = RolloutConfig(engine=registered, vllm=VLLMConfig(mode="server" if name == "vllm-server" else "colocated"))
    engine = create_rollout_engine(registered, RolloutContext(policy, tokenizer, str(directory), config, 96))
    sync_weights(policy, engine)  # the start's push: an engine with its own copy begins with the policy's weights
    return Setup(policy, engine, tokenizer, tuple(eos_token_ids(policy.module, tokenizer)))


def _sampling(setup: Setup, greedy: bool, tokens: int = 12):
    from ..rollout.engines import SamplingConfig

    return SamplingConfig(n=1, max_new_tokens=tokens, eos_token_ids=setup.eos, temperature=0.0 if greedy else 1.0,
                          log_probs=not greedy)


def _sample(setup: Setup, prompts: list[str], greedy: bool, seed: int = 7):
    from ..rollout import rollout

    torch.manual_seed(seed)
    with setup.policy.eval_mode():
        return rollout(setup.engine, setup.tokenizer, prompts, _sampling(setup, greedy))


def _on_device(setup: Setup, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Tensors of a rollout batch on the policy's device: a rollout engine hands its batch back on the host (the card
    found this on its first GPU, where the trainer's forward refused host indices)."""
    device = setup.policy.backend.device()
    return tuple(tensor.to(device) for tensor in tensors)


def _trainer_log_probs(setup: Setup, batch) -> torch.Tensor:
    from .logprobs import response_log_probs

    with setup.policy.eval_mode(), torch.no_grad():
        return response_log_probs(setup.policy.module, *_on_device(setup, batch.input_ids, batch.attention_mask),
                                  batch.prompt_length, 1.0).float().cpu()


def _largest_difference(a: torch.Tensor, b: torch.Tensor, batch) -> float:
    """The largest |a - b| over ``batch``'s response tokens."""
    return float(((a - b).abs() * batch.response_mask.float()).max())


def _gap(setup: Setup, batch) -> float:
    """The engine's log-probs of its samples against the trainer's on the same tokens."""
    return _largest_difference(batch.sampling_log_probs, _trainer_log_probs(setup, batch), batch)


def _gap_bound() -> float:
    return BF16_GAP_BOUND if current_precision() == "bf16" else GAP_BOUND


def _update(setup: Setup, batch) -> None:
    """One step at a large learning rate that raises the log-probs of ``batch``'s responses: the weights move far
    enough that an engine serving the old ones cannot pass."""
    from .logprobs import response_log_probs

    input_ids, attention_mask, mask = _on_device(setup, batch.input_ids, batch.attention_mask,
                                                 batch.response_mask.float())

    def step(module, _):
        log_probs = response_log_probs(module, input_ids, attention_mask, batch.prompt_length, 1.0)
        return -(log_probs * mask).sum() / mask.sum()

    with setup.policy.train_mode():
        setup.policy.forward_backward_batch([None], step)
        setup.policy.optimizer_step()


def _push(setup: Setup) -> int:
    from ..rollout import sync_weights

    setup.engine.release_memory()  # as the step does before every update: the push wakes it
    return sync_weights(setup.policy, setup.engine)


def _own_state(setup: Setup, what: str) -> None:
    if not setup.engine.receives_weights:
        raise RuleSkipped(f"rollout engine '{setup.engine.name}' decodes with the policy's own parameters: it has "
                          f"no {what} of its own")


def check_sleep_wake(backend: DeviceBackend, nproc: int) -> Measurement:
    """Greedy outputs before and after sleep / wake cycles (``release_memory`` then a push of the same weights)."""
    setup = _setup(backend)
    _own_state(setup, "copy to sleep and wake")
    before = _sample(setup, PROMPTS, greedy=True).input_ids
    differing = 0
    for _ in range(CYCLES):
        _push(setup)
        differing += int(not torch.equal(_sample(setup, PROMPTS, greedy=True).input_ids, before))
    slept = "slept" if setup.engine.sleeps else "no sleep mode here: release_memory keeps the memory"
    return Measurement(float(differing), "cycles changing an output", differing == 0,
                       f"{CYCLES} cycles of release_memory and a push of the same weights, {len(PROMPTS)} greedy "
                       f"prompts ({slept})")


def check_memory_release(backend: DeviceBackend, nproc: int) -> Measurement:
    """The device memory the engine gives back when it sleeps (the backend's free-memory figure)."""
    setup = _setup(backend)
    _own_state(setup, "memory")
    if not setup.engine.sleeps:
        raise RuleSkipped(f"rollout engine '{setup.engine.name}' has no sleep mode on this device: it keeps its "
                          "memory during updates")
    free_before = backend.memory_stats().free
    if free_before is None:
        raise RuleSkipped(f"backend '{backend.name}' reports no free device memory")
    setup.engine.release_memory()
    freed = backend.memory_stats().free - free_before
    _push(setup)  # awake again, with the policy's weights
    return Measurement(freed / 2**30, "GiB given back", freed > 0, "free device memory after release_memory "
                       "less before")


def check_prefix_cache(backend: DeviceBackend, nproc: int) -> Measurement:
    """The same prompts before and after an update and its push: the log-probs of what the engine samples then must
    be the new weights' (an engine that kept the prompts' cached keys and values would serve the old ones)."""
    setup = _setup(backend)
    warm = _sample(setup, PROMPTS, greedy=False)  # fills any prefix cache with these prompts
    old = _trainer_log_probs(setup, warm)
    _update(setup, warm)
    moved = _largest_difference(_trainer_log_probs(setup, warm), old, warm)
    _push(setup)
    gap, bound = _gap(setup, _sample(setup, PROMPTS, greedy=False, seed=8)), _gap_bound()
    holds = gap <= bound < moved
    return Measurement(gap, "max |log-prob gap| after the push", holds,
                       f"the update moved the prompts' log-probs by up to {moved:.3g}" if holds or moved > bound
                       else f"the update moved the log-probs only {moved:.3g}: the check cannot tell")


def check_weight_version(backend: DeviceBackend, nproc: int) -> Measurement:
    """Each request's weight version after a push: the version pushed, for every token of every response."""
    setup = _setup(backend)
    _own_state(setup, "weight version")
    sample = getattr(setup.engine, "sample", None)
    if sample is None:
        raise RuleSkipped(f"rollout engine '{setup.engine.name}' samples in this process after each push: no "
                          "request can see another version")
    prompt_ids = setup.tokenizer(PROMPTS, add_special_tokens=False)["input_ids"]
    wrong, versions = 0, []
    for _ in range(2):
        _push(setup)
        expected = setup.engine.weight_version
        _, spans = sample(prompt_ids, _sampling(setup, greedy=True), 0)
        wrong += sum(span["version"] != expected for row in spans for span in row or [{"version": None}])
        versions.append(expected)
    holds = wrong == 0 and versions[0] != versions[1]
    return Measurement(float(wrong), "spans of another version", holds,
                       f"versions {versions[0]} then {versions[1]}, {len(PROMPTS)} requests each")


def check_logprob_gap(backend: DeviceBackend, nproc: int) -> Measurement:
    """After a push, the engine's log-probs of its own samples against the trainer's on the same tokens."""
    setup = _setup(backend)
    _push(setup)
    gap = _gap(setup, _sample(setup, [p + " again" for p in PROMPTS], greedy=False, seed=9))
    return Measurement(gap, "max |log-prob gap|", gap <= _gap_bound(),
                       f"{len(PROMPTS)} sampled responses, temperature 1")


def rollout_properties() -> tuple[Property, ...]:
    """The rollout card's properties, for every registered rollout engine (a plugin's too) and ``vllm-server``."""
    from ..rollout.engines.registry import engine_names

    engines = (*engine_names(), "vllm-server")
    return tuple(dataclasses.replace(p, engines=engines) for p in PROPERTIES)


def _rollout_property(name: str, summary: str, bound: str, check, bf16_bound: str | None = None) -> Property:
    return Property(name, summary, bound, check, bf16_bound=bf16_bound, kind="rollout")


PROPERTIES = (
    _rollout_property("sleep-wake", f"greedy outputs equal before and after {CYCLES} sleep / wake cycles",
                      "equal", check_sleep_wake),
    _rollout_property("memory-release", "device memory given back while the engine sleeps", "> 0 GiB",
                      check_memory_release),
    _rollout_property("prefix-cache", "after a weight push the same prompts' log-probs follow the new weights (no "
                      "stale prefix cache)", f"<= {GAP_BOUND:g}", check_prefix_cache,
                      bf16_bound=f"<= {BF16_GAP_BOUND:g}"),
    _rollout_property("weight-version", "each request carries the weight version it was sampled with", "the pushed "
                      "version", check_weight_version),
    _rollout_property("rollout-logprob-gap", "the engine's log-probs of its samples after a push against the "
                      "trainer's", f"<= {GAP_BOUND:g}", check_logprob_gap, bf16_bound=f"<= {BF16_GAP_BOUND:g}"),
)


@hookimpl
def register_certify_properties(register):
    for prop in rollout_properties():
        register(prop)
