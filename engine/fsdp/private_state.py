"""The one place that touches FSDP's private state, so a torch upgrade breaks (at most) this module.

Everything else in ``engine/`` changes FSDP2 through its public methods (``set_requires_gradient_sync``,
``set_reshard_after_backward``, ``set_is_last_backward``, ``reshard``, ``reset_iter_state``). What remains here
has no public API in the torch versions we test: reading back a setting (torch has setters but no getters), the
recovery after a failed micro-batch on a torch without ``reset_iter_state``, freeing gradients FSDP2 keeps on its
unsharded parameters, and the root's lazy initialisation. FSDP1 has no public API for its flat parameters at all:
their handles (offload moves, byte counts, loading, units kept gathered through ``generate``) are here too. Each
use says which torch versions it was tested on; ``tests/unit/test_torch_range.py`` and the engine tests run on every
torch of the tested range (``docs/hardware.md``).
"""

from __future__ import annotations

import contextlib
from typing import Callable

import torch
import torch.nn as nn
from torch.distributed.fsdp import FSDPModule


def fsdp2_units(module: nn.Module) -> list[FSDPModule]:
    """Every FSDP2 unit in ``module`` (the root first), in ``modules()`` order."""
    return [sub for sub in module.modules() if isinstance(sub, FSDPModule)]


def _param_groups(unit: FSDPModule) -> list:
    # Private: FSDPState._fsdp_param_groups (a list), tested on torch 2.10.0 and 2.13.0. Older torch (2.6) had
    # a single _fsdp_param_group; kept as a fallback so a clear error comes from the version check, not here.
    state = unit._get_fsdp_state()
    groups = getattr(state, "_fsdp_param_groups", None)
    if groups is None:
        group = getattr(state, "_fsdp_param_group", None)
        groups = [group] if group is not None else []
    return list(groups)


def requires_gradient_sync(unit: FSDPModule) -> bool:
    """Whether ``unit`` reduces gradients in its next backward (the getter to ``set_requires_gradient_sync``)."""
    # Private: FSDPParamGroup.reduce_grads, tested on torch 2.10.0 and 2.13.0.
    return all(group.reduce_grads for group in _param_groups(unit))


def reshard_after_backward(unit: FSDPModule) -> bool:
    """Whether ``unit`` reshards after backward (the getter to ``set_reshard_after_backward``)."""
    # Private: FSDPParamGroup.reshard_after_backward, tested on torch 2.10.0 and 2.13.0.
    return all(group.reshard_after_backward for group in _param_groups(unit))


def is_last_backward(root: FSDPModule) -> bool:
    """Whether the next backward is the last of the iteration (the getter to ``set_is_last_backward``)."""
    # Private: FSDPState._state_ctx.is_last_backward, tested on torch 2.10.0 and 2.13.0.
    return root._get_fsdp_state()._state_ctx.is_last_backward


def lazy_init(root: FSDPModule) -> None:
    """Initialise FSDP2 from the root, as its first forward would (idempotent).

    Needed before a forward that starts below the root, which would otherwise make a layer claim to be the root.
    """
    # Private: FSDPState._lazy_init, tested on torch 2.10.0 and 2.13.0.
    root._get_fsdp_state()._lazy_init()


def reset_after_failure(root: FSDPModule) -> None:
    """After a forward or backward raised: reshard every unit, forget the iteration and its partial gradients.

    Newer torch has the public ``reset_iter_state`` for this (present in 2.13.0, absent in 2.10.0 and 2.12.0); on
    a torch without it every unit's per-iteration state is reset by hand. Every unit is then resharded with the public
    ``reshard``, and the gradients FSDP2 accumulated on its unsharded parameters while sync was off are freed:
    ``reset_iter_state`` leaves them in place (seen on 2.13.0), and they would be added to the next mini-batch.
    """
    units = fsdp2_units(root)
    state = root._get_fsdp_state()
    initialised = state._state_ctx.all_states  # Private; empty until the first forward. Tested on 2.10.0, 2.13.0.
    if initialised and hasattr(root, "reset_iter_state"):  # public; tested on 2.13.0
        root.reset_iter_state()
    elif initialised:
        _reset_iter_state_by_hand(units)
    for unit in units:
        unit.reshard()  # public; a no-op for a unit that is already sharded
        _free_unsharded_gradients(unit)


def _reset_iter_state_by_hand(units: list[FSDPModule]) -> None:
    # What reset_iter_state does in torch 2.13, for a torch without it; tested on 2.10.0 and 2.12.0. Waits on
    # collectives still in flight (none on the CPU), then returns every state and parameter group to IDLE so that the
    # public reshard() really reshards (in FORWARD state a unit without reshard-after-forward, the root, ignores
    # it). Private: FSDPState._training_state, _modules_to_run_forward, _comm_ctx.{all_gather_state,
    # reduce_scatter_state, post_forward_order}, _state_ctx.{iter_forward_root, post_backward_final_callback_queued};
    # FSDPParamGroup._training_state, _post_forward_indices, _all_gather_result, _post_reduce_event,
    # _all_reduce_state, _reshard_after_forward_event, _partial_reduce_output.
    from torch.distributed.fsdp._fully_shard._fsdp_common import TrainingState

    root_state = units[0]._get_fsdp_state()
    for unit in units:
        state = unit._get_fsdp_state()
        state._training_state = TrainingState.IDLE
        state._modules_to_run_forward.clear()
        for group in _param_groups(unit):
            stream = group.device_handle.current_stream()
            for name in ("_post_reduce_event", "_reshard_after_forward_event"):
                if getattr(group, name, None) is not None:
                    stream.wait_event(getattr(group, name))
                    setattr(group, name, None)
            all_gather = group._all_gather_result
            if all_gather is not None and all_gather.all_gather_work is not None:
                all_gather.all_gather_work.wait()
            group._all_gather_result = None
            group._all_reduce_state = None
            group._partial_reduce_output = None
            group._post_forward_indices.clear()
            group._training_state = TrainingState.IDLE
    comm_ctx = root_state._comm_ctx
    # One reduce_scatter_state on torch 2.10.0, a list reduce_scatter_states on 2.12.0.
    in_flight = [comm_ctx.all_gather_state, getattr(comm_ctx, "reduce_scatter_state", None),
                 *getattr(comm_ctx, "reduce_scatter_states", ())]
    for pending in in_flight:
        if pending is not None and pending.event is not None:
            root_state._device_handle.current_stream().wait_event(pending.event)
    comm_ctx.all_gather_state = None
    if hasattr(comm_ctx, "reduce_scatter_state"):
        comm_ctx.reduce_scatter_state = None
    if hasattr(comm_ctx, "reduce_scatter_states"):
        comm_ctx.reduce_scatter_states.clear()
    comm_ctx.post_forward_order.clear()
    root_state._state_ctx.iter_forward_root = None
    root_state._state_ctx.post_backward_final_callback_queued = False


def _free_unsharded_gradients(unit: FSDPModule) -> None:
    # Gradients accumulated with sync off live on the unsharded parameters, not on param.grad. Private:
    # FSDPParam.unsharded_accumulated_grad and FSDPParam._unsharded_param, tested on torch 2.10.0 and 2.13.0.
    for group in _param_groups(unit):
        for fsdp_param in group.fsdp_params:
            fsdp_param.unsharded_accumulated_grad = None
            unsharded = getattr(fsdp_param, "_unsharded_param", None)
            if unsharded is not None:
                unsharded.grad = None


def fsdp1_requires_gradient_sync(module: nn.Module) -> bool:
    """Whether every FSDP1 unit reduces gradients in its next backward (``no_sync`` has no getter)."""
    from torch.distributed.fsdp import FullyShardedDataParallel

    # Private: FullyShardedDataParallel._sync_gradients, tested on torch 2.10.0 and 2.13.0.
    return all(m._sync_gradients for m in module.modules() if isinstance(m, FullyShardedDataParallel))


def fsdp1_local_pieces(unit: nn.Module) -> list[tuple[str, int, int]]:
    """(name within the unit, start, end) of each slice of a flattened parameter that this rank's FSDP1 shard of
    ``unit`` holds: its shard of parameter ``name`` is ``param.reshape(-1)[start:end]``.

    Lets rank-0 loading send each rank exactly its slices instead of gathering whole units.
    """
    # Private: FullyShardedDataParallel._handle and FlatParamHandle.shard_metadata() (end is inclusive there),
    # tested on torch 2.10.0 and 2.13.0.
    handle = unit._handle
    if handle is None:  # a unit without parameters of its own
        return []
    meta = handle.shard_metadata()
    return [(name, start, end + 1) for name, (start, end) in zip(meta.param_names, meta.param_offsets, strict=True)]


def fsdp1_handles(module: nn.Module, include_root: bool = True) -> list:
    """The flat-parameter handle of every FSDP1 unit in ``module`` that has parameters of its own."""
    from torch.distributed.fsdp import FullyShardedDataParallel

    # Private: FullyShardedDataParallel._handle, tested on torch 2.10.0 and 2.13.0.
    return [unit._handle for unit in FullyShardedDataParallel.fsdp_modules(module)
            if unit._handle is not None and (include_root or unit is not module)]


def fsdp1_flat_params(module: nn.Module) -> list[torch.Tensor]:
    """This rank's shard of every FSDP1 flat parameter in ``module`` (what it holds in memory)."""
    return [handle.flat_param for handle in fsdp1_handles(module)]


def fsdp1_move_shards(module: nn.Module, apply: Callable[[torch.Tensor], torch.Tensor]) -> None:
    """Replace each FSDP1 flat parameter's shard and gradient by ``apply(tensor)`` (an offload move), keeping the
    original parameters (views into the flat parameter under ``use_orig_params``) pointed at the moved storage."""
    # Private: FlatParameter._local_shard, FlatParamHandle._use_sharded_views / _use_sharded_grad_views, tested on
    # torch 2.10.0 and 2.13.0.
    for handle in fsdp1_handles(module):
        flat = handle.flat_param
        flat.data = apply(flat.data)
        flat._local_shard = flat.data
        if flat.grad is not None:
            flat.grad = apply(flat.grad)
        handle._use_sharded_views()
        if flat.grad is not None:
            handle._use_sharded_grad_views()


def fsdp1_drop_flat_gradients(module: nn.Module) -> None:
    """Free the flat gradient FSDP1 keeps behind the per-parameter gradient views."""
    for flat in fsdp1_flat_params(module):
        flat.grad = None


@contextlib.contextmanager
def fsdp1_units_kept_gathered(module: nn.Module):
    """Keep every FSDP1 unit below the root gathered after its forward while inside, then reshard those still
    gathered: a unit already gathered is not gathered again, so repeated forwards (``generate``) gather once.

    FSDP1 frees a unit's gathered parameters after its forward unless the unit's strategy keeps them
    (SHARD_GRAD_OP): full-shard units are switched to that strategy for the duration.
    """
    from torch.distributed.fsdp._flat_param import HandleShardingStrategy

    # Private: FlatParamHandle._sharding_strategy, needs_unshard, reshard, post_reshard, tested on torch 2.10.0 and
    # 2.13.0.
    handles = fsdp1_handles(module, include_root=False)
    saved = [handle._sharding_strategy for handle in handles]
    for handle in handles:
        if handle._sharding_strategy == HandleShardingStrategy.FULL_SHARD:
            handle._sharding_strategy = HandleShardingStrategy.SHARD_GRAD_OP
    try:
        yield
    finally:
        for handle, strategy in zip(handles, saved, strict=True):
            handle._sharding_strategy = strategy
            if handle.uses_sharded_strategy and not handle.needs_unshard():  # still gathered: free it
                handle.reshard(True)
                handle.post_reshard()


@contextlib.contextmanager
def fsdp2_forward_hooks_detached(units: list[FSDPModule]):
    """Within the block, forwards of ``units`` run without FSDP2's forward hooks (put back, in their order, after).

    For a decode loop on parameters gathered once for the whole call (``generate_gather="once"``): every unit is
    unsharded already, so the hooks have nothing to do, yet they run for every unit at every decoded token (state
    checks, input casts, stream waits): a fixed cost per token that does not shrink with more ranks. What they
    would still do there is cast floating-point inputs to the parameters' dtype; a decode loop feeds token ids.
    """
    # Private: FSDPState._pre_forward_hook_handle / _post_forward_hook_handle (RemovableHandle, present when a state
    # manages one module), the same in torch 2.10 to 2.13 (tests/test_engine_decode_hooks.py, both CI legs); where
    # absent the hooks stay (slower, still right).
    saved = []
    for unit in units:
        state = unit._get_fsdp_state()
        for name, hooks in (("_pre_forward_hook_handle", unit._forward_pre_hooks),
                            ("_post_forward_hook_handle", unit._forward_hooks)):
            handle = getattr(state, name, None)
            if handle is not None and handle.id in hooks:
                saved.append((hooks, list(hooks.items())))
                del hooks[handle.id]
    try:
        yield
    finally:
        for hooks, items in reversed(saved):
            kept = {key for key, _ in items}
            added = [(key, hook) for key, hook in hooks.items() if key not in kept]  # registered meanwhile: after
            hooks.clear()
            hooks.update(items + added)
