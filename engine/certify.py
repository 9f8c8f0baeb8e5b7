"""The engine's properties for ``accel-backends certify NAME``: what on-policy RL needs a device to get right, each
measured on a tiny model whose dims the world size does not divide (``tiny_model.UNEVEN``), in the card's precision
(float32, or bf16 mixed precision: ``accel-backends certify --precision bf16``, with the bf16 bounds below).

Every check runs in every rank of the card's job (``accel_backends/testing/certify.py``) and returns a
``Measurement``: its figure, and whether it is within the property's bound. ``register_certify_properties`` hands
them to the card (``engine/conformance.py`` carries it through the ``accel_backends.conformance`` entry point). The
weight push goes to a model copy of our own in the same process (``weight_push.ModelCopy``); a wire to a separate
rollout engine is another ``WeightTarget`` (``weight_push.py``).
"""

from __future__ import annotations

import math
import tempfile

import torch
import torch.distributed as dist

from accel_backends import DeviceBackend, hookimpl
from accel_backends.testing import raw_bytes
from accel_backends.testing.card_context import current_precision
from accel_backends.testing.certify import Measurement, Property

from .certify_reads import check_host_reads
from .tiny_model import UNEVEN, tiny_qwen2

VOCAB = UNEVEN["vocab_size"]
WEIGHT_GAP_BOUND = 1e-4  # float32 log-probs of one model computed twice apart (trainer's sharded vs a copy)
GRADIENT_BOUND = 1e-4  # relative error of float32 gradients against a float64 reference
# bf16 keeps 8 bits of mantissa (relative rounding 2**-9, about 2e-3 per operation): a step's gradients land about
# 5e-3 from float64's (the CPU: 5.4e-3) and log-probs of bf16 compute about 2e-3 from float32's: 4x room or more.
BF16_GRADIENT_BOUND = 2e-2
BF16_WEIGHT_GAP_BOUND = 5e-2


def _bound(fp32: float, bf16: float) -> float:
    return bf16 if current_precision() == "bf16" else fp32


# torch 2.13 renamed reduce_scatter_tensor (deprecated there); torch 2.10 has only the old name.
reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def uneven_model():
    return tiny_qwen2(seed=0, max_positions=32, layers=2, **UNEVEN)


def _engine(backend: DeviceBackend, **options):
    from . import EngineConfig, FSDPEngine

    config = {"fsdp_version": 2, "mixed_precision": current_precision(), "lr": 1e-2, "max_grad_norm": 1.0,
              **options}
    return FSDPEngine(uneven_model, EngineConfig(**config), backend=backend)


def _micro_batches(rank: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(100 + rank)
    return [torch.randint(0, VOCAB, (2, 9), generator=generator), torch.randint(0, VOCAB, (1, 13), generator=generator)]


def token_loss(module, ids: torch.Tensor):
    """Mean next-token cross-entropy; weight = number of target tokens (an int: a count)."""
    device = next(module.parameters()).device
    ids = ids.to(device)
    logits = module(input_ids=ids).logits[:, :-1].float()
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), ids[:, 1:].reshape(-1))
    return loss, ids[:, 1:].numel()


def _full(tensor: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return (tensor.full_tensor() if isinstance(tensor, DTensor) else tensor).detach().to("cpu", torch.float64)


def _grads(engine) -> dict[str, torch.Tensor]:
    return {name: _full(p.grad) for name, p in engine.module.named_parameters() if p.grad is not None}


def relative_error(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> float:
    """``|got - want| / |want|`` over every tensor together (global norms)."""
    diff = math.fsum(float((got[k].double() - want[k].double()).pow(2).sum()) for k in want)
    norm = math.fsum(float(want[k].double().pow(2).sum()) for k in want)
    return math.sqrt(diff / norm) if norm else math.sqrt(diff)


def _one_pass(backend: DeviceBackend, micro_batches, step_fn=token_loss, **options) -> dict[str, torch.Tensor]:
    engine = _engine(backend, **options)
    with engine.train_mode():
        engine.forward_backward_batch(micro_batches, step_fn)
    return _grads(engine)


# -- the properties -------------------------------------------------------------------------------------------


def check_reductions(backend: DeviceBackend, nproc: int) -> Measurement:
    """The dtypes the engine reduces are declared, and reduce exactly; the engine's sums and maxima match float64's."""
    from .runtime import max_over_ranks, sum_over_ranks

    declared = backend.collective_reduce_dtypes
    used = (torch.int64, torch.float32)  # counts, fingerprints, maxima; figures, gradients (FSDP's reduce dtype)
    missing = [str(d) for d in used if declared is not None and d not in declared]
    if missing:
        return Measurement(None, "", False, f"the engine reduces {', '.join(missing)}, which the backend does "
                           "not declare in collective_reduce_dtypes")
    rank, world = dist.get_rank(), dist.get_world_size()
    wrong = []
    for device in dict.fromkeys([backend.metrics_device(), backend.device()]):
        for dtype, base in ((torch.int64, 2**40), (torch.float32, 0.5)):  # int64 beyond float64's exact integers
            for op, want in ((dist.ReduceOp.SUM, base * world * (world + 1) // 2 if dtype == torch.int64 else
                              base * world * (world + 1) / 2), (dist.ReduceOp.MAX, base * world),
                             (dist.ReduceOp.MIN, base)):
                tensor = torch.full((1031,), base * (rank + 1), dtype=dtype, device=device)
                dist.all_reduce(tensor, op=op)
                if not bool((tensor == want).all()):
                    wrong.append(f"{op} of {dtype} on {device}")
        scattered = torch.empty(7, dtype=torch.float32, device=device)
        reduce_scatter(scattered, torch.full((7 * world,), rank + 1.0, device=device))
        if not bool((scattered == world * (world + 1) / 2).all()):
            wrong.append(f"reduce-scatter of float32 on {device}")
    figures = {"tokens": 2**24 + 1 + rank, "loss_sum": 0.1 * (rank + 1) + 1e3, "kl": 1e-9 * (rank + 1)}
    everyone: list = [None] * world
    dist.all_gather_object(everyone, figures)
    summed = sum_over_ranks(figures, backend.metrics_device())
    worst = max(abs(summed[k] - math.fsum(f[k] for f in everyone)) / abs(math.fsum(f[k] for f in everyone))
                for k in figures)
    if summed["tokens"] != sum(f["tokens"] for f in everyone):
        wrong.append("a token count above 2**24 summed inexactly")
    largest = max_over_ranks({"kl": figures["kl"]}, backend.metrics_device())
    if largest["kl"] != max(f["kl"] for f in everyone):
        wrong.append("the maximum of a float64 inexact")
    detail = "; ".join(wrong) or (f"int64 and float32 all-reduce (sum, max, min) and reduce-scatter exact; the "
                                  f"engine's sums {worst:.1e} from float64's, counts above 2**24 exact")
    return Measurement(worst, "relative error", not wrong and worst <= 1e-12, detail)


def check_offload(backend: DeviceBackend, nproc: int) -> Measurement:
    """A trained engine's parameters and optimizer state moved to the host and back, on shards padded on the last
    rank: bitwise on the host and back on the device."""

    return _offload_round_trip(_trained(backend))


def check_offload_as_rank1(backend: DeviceBackend, nproc: int) -> Measurement:
    """The offload round trip as rank 1 of 2 on a fake group (one device): rank 1's shards, padded, and an
    optimizer state made by a local step on them (a fake group's collectives move nothing, so the engine's own
    step, which reduces figures over ranks, is not taken; each rank builds its own weights for the same reason)."""
    from .fsdp.offload import local

    engine = _engine(backend, load_on_rank0=False)
    generator = torch.Generator().manual_seed(11)
    for p in engine.module.parameters():
        p.grad = torch.zeros_like(p)
        local(p.grad).copy_(torch.randn(local(p).shape, generator=generator))
    engine.optimizer.step()
    return _offload_round_trip(engine)


def _offload_round_trip(engine) -> Measurement:
    from .fsdp.offload import local

    rank, world = dist.get_rank(), dist.get_world_size()
    short = sum(1 for p in engine.module.parameters() if local(p).shape[0] < -(-p.shape[0] // world))
    before = _state(engine)
    engine.to("cpu")
    on_host = _state(engine)
    engine.to("device")
    after = _state(engine)
    differ = [k for k in before if not (_same(on_host[k], before[k]) and _same(after[k], before[k]))]
    detail = (f"{len(before)} tensors ({short} shards shorter than their padded size on rank {rank}) bitwise on "
              "the host and back" if not differ else f"{len(differ)} of {len(before)} differ, e.g. {differ[:3]}")
    return Measurement(float(len(differ)), "tensors differing", not differ, detail)


def _state(engine) -> dict[str, torch.Tensor]:
    return {**_local_params(engine), **_local_optimizer(engine)}


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(raw_bytes(a), raw_bytes(b))


def check_gradients(backend: DeviceBackend, nproc: int) -> Measurement:
    """A 2-rank (``nproc``) FSDP2 step's gradients against one process in float64 on the CPU."""
    rank, world = dist.get_rank(), dist.get_world_size()
    got = _one_pass(backend, _micro_batches(rank), grad_sync="deferred")
    reference = uneven_model().double()
    batches = [b for r in range(world) for b in _micro_batches(r)]
    total = sum(b[:, 1:].numel() for b in batches)
    for ids in batches:
        loss, count = token_loss(reference, ids)
        (loss * (count / total)).backward()
    want = {n: p.grad for n, p in reference.named_parameters() if p.grad is not None}
    error = relative_error(got, want)
    return Measurement(error, "relative error", error <= _bound(GRADIENT_BOUND, BF16_GRADIENT_BOUND),
                       f"{world} ranks, FSDP2 in {current_precision()} against float64 on the CPU")


def _sequences(rank: int):
    from .packing import SequenceBatch

    generator = torch.Generator().manual_seed(300 + rank)
    prompts = [torch.randint(0, VOCAB, (n,), generator=generator) for n in (3, 5, 2)]
    responses = [torch.randint(0, VOCAB, (n,), generator=generator) for n in (6, 2, 9)]
    return SequenceBatch.from_parts(prompts, responses)


def layout_loss(module, layout):
    device = next(module.parameters()).device
    layout = layout.to(device)
    out = module(**layout.inputs, logits_to_keep=layout.logits_to_keep, use_cache=False)
    logits = layout.select(out.logits.float())
    return torch.nn.functional.cross_entropy(logits, layout.targets), len(layout.targets)


def check_packing(backend: DeviceBackend, nproc: int) -> Measurement:
    """The same sequences packed in one row (positions restarting, no mask) and padded: the same gradients."""
    from .packing import build_layout

    batch = _sequences(dist.get_rank())
    grads = {}
    for packed in (True, False):
        layouts = [build_layout(batch, [0, 1], packed), build_layout(batch, [2], packed)]
        grads[packed] = _one_pass(backend, layouts, layout_loss)
    error = relative_error(grads[True], grads[False])
    return Measurement(error, "relative difference", error <= _bound(GRADIENT_BOUND, BF16_GRADIENT_BOUND),
                       f"attention {backend.attention_implementation(packed=True)!r} packed, padded with a mask")


def check_grad_sync(backend: DeviceBackend, nproc: int) -> Measurement:
    """Gradients synced once after the last micro-batch equal those synced after every micro-batch."""
    micro = _micro_batches(dist.get_rank())
    deferred = _one_pass(backend, micro, grad_sync="deferred")
    every = _one_pass(backend, micro, grad_sync="every_micro_batch")
    error = relative_error(deferred, every)
    return Measurement(error, "relative difference", error <= _bound(GRADIENT_BOUND, BF16_GRADIENT_BOUND),
                       "2 micro-batches per rank")


def check_checkpoint(backend: DeviceBackend, nproc: int) -> Measurement:
    """A trained engine saved and loaded into a fresh one: parameters and optimizer state bitwise."""
    rank = dist.get_rank()
    trained, fresh = _engine(backend), _engine(backend)
    with trained.train_mode():
        trained.forward_backward_batch(_micro_batches(rank), token_loss)
        trained.optimizer_step()
    where = [tempfile.mkdtemp(prefix="accel-certify-") if rank == 0 else None]
    dist.broadcast_object_list(where, src=0)
    path = f"{where[0]}/checkpoint"
    try:
        trained.save_checkpoint(path)
        fresh.load_checkpoint(path)
    finally:
        dist.barrier()
        if rank == 0:
            import shutil

            shutil.rmtree(where[0], ignore_errors=True)
    want, got = _state(trained), _state(fresh)
    differ = [k for k in want if k not in got or not _same(got[k], want[k])]
    return Measurement(float(len(differ)), "tensors differing", not differ,
                       f"{len(want)} tensors of parameters and optimizer state" if not differ else
                       f"{len(differ)} differ, e.g. {differ[:3]}")


def _local_params(engine) -> dict[str, torch.Tensor]:
    from .fsdp.offload import local

    return {f"param:{n}": local(p).detach().cpu().clone() for n, p in engine.module.named_parameters()}


def _local_optimizer(engine) -> dict[str, torch.Tensor]:
    from .fsdp.offload import local

    return {f"optimizer:{i}:{k}": local(v).detach().cpu().clone()
            for i, values in enumerate(engine.optimizer.state.values()) for k, v in values.items()
            if torch.is_tensor(v)}


def check_same_seed(backend: DeviceBackend, nproc: int) -> Measurement:
    """The same seed and data give the same step twice: gradients and updated weights bitwise."""
    rank = dist.get_rank()
    runs = []
    for _ in range(2):
        engine = _engine(backend, seed=7)
        with engine.train_mode():
            metrics = engine.forward_backward_batch(_micro_batches(rank), token_loss)
            grads = _grads(engine)
            engine.optimizer_step()
        runs.append((metrics["loss"], grads, _local_params(engine)))
    (loss_a, grads_a, params_a), (loss_b, grads_b, params_b) = runs
    worst = max(float((grads_a[k] - grads_b[k]).abs().max()) for k in grads_a)
    same = loss_a == loss_b and worst == 0.0 and all(_same(params_a[k], params_b[k]) for k in params_a)
    return Measurement(worst, "max |gradient difference|", same, "loss, gradients and stepped weights bitwise"
                       if same else f"losses {loss_a!r} and {loss_b!r}")


def check_weight_push(backend: DeviceBackend, nproc: int) -> Measurement:
    """The trained weights pushed to a rollout copy and read back: bitwise."""
    from .weight_push import ModelCopy, push

    engine = _trained(backend)
    target = ModelCopy(uneven_model, backend.device())
    pushed = push(engine, target)
    back = dict(target.weights())
    differ = [n for n, t in pushed.items() if not torch.equal(back[n].cpu(), t)]
    return Measurement(float(len(differ)), "tensors differing", not differ,
                       f"{len(pushed)} tensors through FSDPEngine.iter_full_weights() into {target.describe()}")


def check_logprob_gap(backend: DeviceBackend, nproc: int) -> Measurement:
    """The rollout copy's log-probs of the sampled tokens against the trainer's, on the same tokens."""
    from .weight_push import ModelCopy, push, token_log_probs

    engine = _trained(backend)
    target = ModelCopy(uneven_model, backend.device())
    push(engine, target)
    ids = _micro_batches(dist.get_rank())[0]
    with engine.eval_mode(), torch.no_grad():
        trainer = token_log_probs(engine.module, ids)
    rollout = target.log_probs(ids)
    gap = float((trainer - rollout).abs().max())
    return Measurement(gap, "max |log-prob gap|", gap <= _bound(WEIGHT_GAP_BOUND, BF16_WEIGHT_GAP_BOUND),
                       f"{ids.numel() - ids.size(0)} tokens, trainer (sharded) against {target.describe()}")


def _trained(backend: DeviceBackend):
    engine = _engine(backend)
    with engine.train_mode():
        engine.forward_backward_batch(_micro_batches(dist.get_rank()), token_loss)
        engine.optimizer_step()
    return engine


PROPERTIES = (
    Property("reductions", "counts, figures and gradients reduce over ranks exactly, in dtypes the device declares",
             "exact; sums <= 1e-12 of float64's", check_reductions),
    Property("offload", "parameters and optimizer state offloaded and back on shards the world size does not divide",
             "bitwise", check_offload, fake_rank_check=check_offload_as_rank1),
    Property("gradients", "a multi-rank FSDP2 step's gradients against one process in float64 on the CPU",
             f"<= {GRADIENT_BOUND:g}", check_gradients, bf16_bound=f"<= {BF16_GRADIENT_BOUND:g}"),
    Property("packing", "packed micro-batches (no pad computed) against padded ones", f"<= {GRADIENT_BOUND:g}",
             check_packing, bf16_bound=f"<= {BF16_GRADIENT_BOUND:g}"),
    Property("grad-sync", "gradient sync deferred to the last micro-batch against sync after every one",
             f"<= {GRADIENT_BOUND:g}", check_grad_sync, bf16_bound=f"<= {BF16_GRADIENT_BOUND:g}"),
    Property("checkpoint", "a checkpoint saved and loaded: parameters and optimizer state", "bitwise",
             check_checkpoint),
    Property("weight-push", "the trainer's weights pushed to the rollout engine and read back", "bitwise",
             check_weight_push),
    Property("logprob-gap", "the rollout engine's log-probs against the trainer's on the same tokens",
             f"<= {WEIGHT_GAP_BOUND:g}", check_logprob_gap, bf16_bound=f"<= {BF16_WEIGHT_GAP_BOUND:g}"),
    Property("same-seed", "the same seed and data give the same step twice", "bitwise", check_same_seed),
    Property("host-reads", "an update's reads of device values by the host, with 2 or 4 micro-batches and layers",
             "the same count", check_host_reads),
)


@hookimpl
def register_certify_properties(register):
    for prop in PROPERTIES:
        register(prop)
