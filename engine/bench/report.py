"""The tables ``accel-bench`` prints: one per scenario, medians with their range, ratios and counts."""

from __future__ import annotations

from .scaling import print_scaling


def _ms(row: dict) -> str:
    return f"{row['median_ms']:.4g} ms [{row['min_ms']:.3g}-{row['max_ms']:.3g}]"


def _mib(num_bytes) -> str:
    return "n/a" if num_bytes is None else f"{num_bytes / 2**20:.1f}"


def print_mode_switch(s: dict) -> None:
    print("\n== mode switch (train_mode enter+exit) ==")
    for key in (k for k in s if k.startswith("layers_")):
        row = s[key]
        calls = row["fast_path_calls"]
        print(f"{row['layers']:3d} layers: fast path {_ms(row['fast_path'])}, pre-fix {_ms(row['legacy'])}: "
              f"{row['legacy_over_fast']:,.0f}x cheaper; gc.collect {calls['gc_collect']}, "
              f"empty_cache {calls['empty_cache']} calls in {calls['switches']} fast switches")
    print(f"{'offload':18} {'round trip':>30} {'moves/enter':>12} {'MiB/round trip':>15} {'GB/s':>7}")
    for name, row in s["offload"].items():
        print(f"{name:18} {_ms(row):>30} {row['moves_per_enter']:12d} {_mib(row['bytes_per_round_trip']):>15} "
              f"{row['bandwidth_gb_s']:7.2f}")
    onload = s["optimizer_onload"]
    print(f"{'optimizer onload':18} {'train step':>30} {'moves/step':>11} {'peak MiB':>9}  residency in fwd/bwd")
    for name in ("mode", "step"):
        row = onload[name]
        print(f"{name:18} {_ms(row):>30} {row['moves_per_step']:11d} {_mib(row['peak_memory_bytes']):>9}  "
              f"{row['residency_during_forward_backward']}")
    print(f"step / mode step time: {onload['step_over_mode_time']:.2f}")


def print_grad_accum(s: dict) -> None:
    print("\n== gradient accumulation (one optimizer step; collectives counted over the whole step) ==")
    for version in (k for k in s if k.startswith("fsdp")):
        print(f"{version.upper()}, {s[version]['sharded_units']} sharded units")
        print(f"  {'mb':>3} {'grad sync':20} {'step':>30} {'vs every':>9} {'all-gather':>11} {'red-scatter':>12}"
              f" {'MiB comm':>9} {'peak MiB':>9}")
        for count, rows in s[version]["micro_batches"].items():
            for mode, row in rows.items():
                c = row["collectives"]
                print(f"  {count:>3} {mode:20} {_ms(row):>30} {row['time_vs_every_micro_batch']:9.2f} "
                      f"{c['all_gather']:11d} {c['reduce_scatter']:12d} {_mib(c['bytes']):>9} "
                      f"{_mib(row['peak_memory_bytes']):>9}")
    decision = s["decision"]
    print(f"grad_sync='auto' chose {decision['grad_sync_mode']!r}; plan: {decision['grad_sync_plan']}")


def print_overhead(s: dict) -> None:
    print(f"\n== engine overhead ({s['micro_batches']} micro-batches, FSDP2, deferred sync) ==")
    print(f"engine {_ms(s['engine'])}, hand-written FSDP2 loop {_ms(s['hand_written'])}: "
          f"engine / hand-written = {s['engine_over_hand_written']:.3f}")


def print_rollout(s: dict) -> None:
    print(f"\n== rollout (generate, {s['batch']} sequences per rank, {s['sharded_units']} sharded units) ==")
    for key in (k for k in s if k.startswith("new_tokens_")):
        row = s[key]
        print(f"{row['new_tokens']:4d} new tokens: {_ms(row)}, {row['tokens_per_s_per_rank']:.0f} tokens/s per rank,"
              f" {row['all_gathers_per_call']} all-gathers per call ({row['all_gathers_per_new_token']:.2f} per token)")
    engines = s.get("engines")
    if engines:
        print(f"rollout engines on {engines['model']}: {engines['prompts_per_rank']} prompts x {engines['n']} per "
              f"rank, up to {engines['max_new_tokens']} new tokens, FSDP{engines['fsdp_version']}")
        for name in ("hf", "hf-continuous", "vllm"):
            row = engines.get(name)
            if row is None:
                continue
            print(f"  {name:14} {_ms(row):>32}, tokens per call: {row['tokens_produced_per_call']:.0f} produced, "
                  f"{row['tokens_computed_per_call']:.0f} computed ({row['computed_over_produced']:.2f}x), "
                  f"{row.get('response_tokens_per_s', 0):.0f} response tokens/s")
        print(f"  hf-continuous / hf: {engines['continuous_over_hf']:.2f}")
        if "vllm_over_continuous_per_token" in engines:
            print(f"  vllm / hf-continuous, time per response token: {engines['vllm_over_continuous_per_token']:.2f}; "
                  f"weight push {_ms(engines['vllm_weight_sync'])}")
        for name, counts in engines["collectives_per_call"].items():
            print(f"  collectives per call, {name}: {counts['all_gather']} all-gathers, {counts['all_reduce']} "
                  f"all-reduces")


def print_grpo(s: dict) -> None:
    print(f"\n== GRPO step ({s['preset']}, {s['world_size']} rank(s), {s['sequences_per_rank']} sequences per rank) ==")
    print(f"step {_ms(s['step'])}, {s['response_tokens_per_s_per_rank']:.0f} response tokens/s per rank")
    perf = s.get("perf", {})
    if "perf/mfu" in perf:
        print(f"MFU of the update {perf['perf/mfu']:.1%} (FLOPs from the model's geometry over the backend's peak)")
    for name, row in s["parts"].items():
        calls = s["calls_per_step"].get(name, "")
        mfu = perf.get(f"perf/mfu/{name}")
        tflops = perf.get(f"perf/tflops/{name}")
        figures = "" if tflops is None else f"  {tflops * 1e3:.1f} GFLOP/s"
        figures += "" if mfu is None else f", MFU {mfu:.1%}"
        print(f"  {name:15} {_ms(row):>30} {s['share_of_step'][name]:6.1%}  calls {calls}{figures}")
    profile = s.get("profile")
    if profile:
        print(f"  torch.profiler, one step: {profile['self_cpu_ms']:.0f} ms CPU time, of which inside FSDP's hooks "
              f"{profile['fsdp_hooks_cpu_ms']:.0f} ms ({profile['fsdp_share']:.0%}); top ops by self time:")
        for row in profile["top_ops"][:10]:
            print(f"    {row['name'][:56]:56} {row['self_cpu_ms']:9.1f} ms, {row['calls']} calls")


def print_distill(s: dict) -> None:
    tokens = s["response_tokens_per_step_per_rank"]
    print(f"\n== on-policy distillation step against a GRPO step ({s['world_size']} rank(s); response tokens per step "
          f"per rank: distill {tokens['distill']:.0f}, grpo {tokens['grpo']:.0f}) ==")
    for name, row in s["ms_per_response_token"].items():
        parts = ", ".join(f"{part} {summary['median_ms']:.0f} ms" for part, summary in s["parts"][name].items()
                          if summary["median_ms"] > 0)
        print(f"  {name:8} {_ms(row):>30} per token   {parts}")
    print(f"distill / grpo time per response token {s['distill_over_grpo_per_token']:.2f} (the teacher's forward is "
          "the difference)")


def print_packing(s: dict) -> None:
    limit = (f"budget {s['micro_batch_tokens']} tokens" if s["micro_batch_tokens"]
             else f"{s['micro_batch_size']} sequences")
    print(f"\n== packing (one update of {s['sequences']} sequences, {s['tokens']} tokens, longest "
          f"{s['longest_sequence']}; {s['world_size']} rank(s); micro-batches of {limit}) ==")
    print(f"  {'variant':8} {'update':>30} {'micro-batches':>14} {'pad tokens':>11} {'activations MiB':>16}")
    for name, row in s["update"].items():
        print(f"  {name:8} {_ms(row):>30} {s['micro_batches_per_rank'][name]:14d} "
              f"{s['pad_tokens_per_update'][name]:11d} {s['activation_mib'][name]:16.1f}")
    print("  (activations: bytes autograd keeps for backward, largest micro-batch; the peak memory a budget bounds)")
    print(f"packed / padded update time {s['packed_over_padded']:.2f}, packed / as before packing "
          f"{s['packed_over_rollout']:.2f}; token imbalance (max / mean over ranks) {s['token_imbalance']:.3f}")
    _print_budgets(s["peak_by_budget"])


def _print_budgets(rows: dict) -> None:
    """One line per token budget: micro-batches, activations (and the peak where the scenario measured it)."""
    for budget, row in rows.items():
        if "skipped" in row:
            print(f"  budget {budget:>6}: skipped, {row['skipped']}")
            continue
        peak = f", peak {_mib(row['peak_memory_bytes'])} MiB" if "peak_memory_bytes" in row else ""
        print(f"  budget {budget:>6}: {row['micro_batches_per_rank']:3d} micro-batches per rank, activations "
              f"{row['activation_mib']:.1f} MiB at most per micro-batch{peak}")


def print_sft(s: dict) -> None:
    print(f"\n== sft (one step of {s['sequences']} sequences, {s['tokens']} tokens, {s['world_size']} rank(s); "
          f"packed path {'on' if s['packed_path'] else 'off'}) ==")
    print(f"  {'variant':26} {'step':>30} {'micro-batches':>14} {'supervised tok/s':>17} {'pad tokens':>11} "
          f"{'MFU':>6}")
    for name, row in s["variants"].items():
        mfu = "-" if row.get("mfu") is None else f"{row['mfu']:.1%}"
        print(f"  {name:26} {_ms(row):>30} {row['micro_batches_per_rank']:14d} "
              f"{row['supervised_tokens_per_s']:17.0f} {row['pad_tokens_this_rank']:11.0f} {mfu:>6}")
    print(f"deferred / every-micro-batch sync step time {s['deferred_over_every_micro_batch']:.2f}; packed / padded "
          f"{s['packed_over_padded']:.2f}")
    _print_budgets(s["peak_by_budget"])


def print_sequence_parallel(s: dict) -> None:
    if "skipped" in s:
        print(f"\n== sequence parallelism: skipped, {s['skipped']} ==")
        return
    model = s["model"]
    print(f"\n== sequence parallelism (one sequence's forward+backward, {s['world_size']} ranks; hidden "
          f"{model['hidden']}, {model['layers']} layers, {model['heads']} heads / {model['kv_heads']} KV) ==")
    print(f"  {'tokens':>7} {'sp':>3} {'fwd+bwd':>30} {'exchange':>12} {'share':>6} {'MiB sent':>9} "
          f"{'activations MiB':>16} {'peak MiB':>9}  (per rank)")
    for tokens, per in s["tokens"].items():
        for name in ("sp1", "sp2"):
            row = per[name]
            print(f"  {tokens:>7} {name[2:]:>3} {_ms(row):>30} {row['exchange']['median_ms']:9.1f} ms "
                  f"{row['exchange_share']:6.1%} {row['exchange_mib']:9.1f} {row['activation_mib']:16.1f} "
                  f"{_mib(None if row['peak_above_start_mib'] is None else row['peak_above_start_mib'] * 2**20):>9}")
        r = per["sp2_over_sp1"]
        peak = "n/a" if r["peak"] is None else f"{r['peak']:.2f}"
        print(f"  {tokens:>7} sp2 / sp1: time {r['time']:.2f}, activations {r['activations']:.2f}, peak {peak}")


def print_vllm_alone(result: dict) -> None:
    work = result["work"]
    print(f"\nvLLM alone ({work['prompts']} prompts x {work['n']} responses of up to {work['max_tokens']} tokens, "
          f"{work['rounds']} timed calls per variant, each variant a fresh process alone on the machine):")
    for label, row in result["variants"].items():
        if "skipped" in row:
            print(f"  {label}: skipped ({row['skipped']})")
            continue
        spread = row["tokens_per_s_all"]
        print(f"  {label}: {row['tokens_per_s']:.0f} response tokens/s [{min(spread):.0f}-{max(spread):.0f}]")


def print_rollout_against_vllm_alone(result: dict) -> None:
    """The grpo scenario's rollout phase (with rollout.engine=vllm) as a share of vLLM alone's speed."""
    grpo, alone = result["scenarios"].get("grpo"), result["scenarios"].get("vllm_alone")
    if not grpo or not alone or "rollout.engine=vllm" not in grpo["overrides"]:
        return
    seconds = grpo["parts"]["rollout"]["median_ms"] / 1e3
    in_loop = grpo["response_tokens_per_step_per_rank"] / seconds
    print(f"\nrollout phase in the GRPO step (rollout.engine=vllm, {result['world_size']} rank(s)): {in_loop:.0f} "
          f"response tokens/s per rank; against vLLM alone:")
    for label, row in alone["variants"].items():
        if "tokens_per_s" in row:
            print(f"  {label}: {in_loop / row['tokens_per_s']:.2f}")


def print_async_rollout(s: dict) -> None:
    print(f"\n== GRPO ahead of the trainer: 1 trainer + 1 vLLM server at max_staleness k, colocated on 2 ranks "
          f"({s['steps']} steps per run, {s['warmup']} warm-up, {s['threads']} thread(s) each, cores {s['cores']}) ==")
    if "case" in s:
        print(f"case {s['case']}: {s['prompts']} prompts x 8 responses of up to {s['max_new_tokens']} tokens")
    for binding, row in s["bindings"].items():
        borrowing = f", borrowing {row['borrow_threads']} thread(s) while it idles" if row.get("borrow_threads") else ""
        if "auto" in row:
            print(f"{binding}: the defaults only; borrow_threads {row['auto']['why']}")
        else:
            print(f"{binding}: server on cores {row['server_cores'] or 'any'}, trainer on "
                  f"{row['trainer_cores'] or 'any'}{borrowing}")
        print(f"  {'variant':18} {'tokens/s':>9} {'step s':>7} {'sampling s':>10} {'training s':>10} "
              f"{'wait s':>7} {'overlap':>8} {'step/slower':>11} {'stale max':>9}")
        for name, runs in row["runs"].items():
            for run in runs:
                print(f"  {name:18} {run['tokens_per_s']:9.1f} {run['step_s']:7.2f} {run['sampling_s']:10.2f} "
                      f"{run['training_s']:10.2f} {run['trainer_wait_s']:7.2f} {run['overlap']:8.2f} "
                      f"{run['step_over_slower_side']:11.2f} {run['staleness_max']:9.0f}")
        ratios = {key: value for key, value in row.items() if key.startswith("k") and value is not None}
        print("  " + ", ".join(f"{key.replace('_over_', ' / ')} {value:.2f}" for key, value in ratios.items()))


def print_ppo(s: dict) -> None:
    print(f"\n== PPO step against a GRPO step of the same work ({s['world_size']} rank(s); {' '.join(s['work'])}) ==")
    for name, row in s["step"].items():
        print(f"  {name:5} step {_ms(row)}")
    print(f"ppo / grpo step time {s['ppo_over_grpo']:.2f} (per round, median)")


def print_lora_sync(result: dict) -> None:
    work = result["work"]
    print(f"\n== LoRA with vLLM (rank {work['rank']}): rollout.vllm.lora_sync merged against adapter, a colocated "
          f"engine each, {work['prompts']} prompts x {work['n']} x {work['max_tokens']} tokens per round ==")
    for geometry, row in result["geometries"].items():
        for mode in ("merged", "adapter"):
            m = row[mode]
            print(f"  {geometry} {mode:8} ({m['parameters'] / 1e6:.1f}M parameters): first push "
                  f"{m['first_push_s'] * 1e3:.0f} ms / {m['first_push_bytes'] / 2**20:.1f} MiB; per update "
                  f"{m['push_s'] * 1e3:.1f} ms / {m['push_bytes'] / 2**20:.2f} MiB; decode "
                  f"{m['decode_tokens_per_s']:.0f} tokens/s")
        r = row["ratios"]
        decode = r["adapter_over_merged_decode_tokens_per_s"]
        print(f"  {geometry} adapter / merged: push time {r['adapter_over_merged_push_s']:.3f}, bytes "
              f"{r['adapter_over_merged_bytes']:.4f}, decode tokens/s {decode:.2f}")


def print_weight_sync(result: dict) -> None:
    g = result["geometry"]
    print(f"\n== Weight sync over the wire (hidden {g['hidden_size']} x {g['layers']} layers): "
          "rollout.vllm.weight_sync full against delta, and the LoRA adapter alone; medians per update ==")
    for name, case in result["cases"].items():
        m = case["median"]
        if "adapter_bytes" in m:
            print(f"  {name:14} adapter {m['adapter_bytes'] / 2**20:7.2f} MiB {m['adapter_push_s'] * 1e3:7.1f} ms")
            continue
        changed = ", ".join(f"{row['changed_frac']:.4f}" for row in case["steps"])
        print(f"  {name:14} full {m['full_bytes'] / 2**20:7.2f} MiB {m['full_push_s'] * 1e3:7.1f} ms; delta "
              f"{m['delta_bytes'] / 2**20:7.2f} MiB {m['delta_push_s'] * 1e3:7.1f} ms; changed per step {changed}; "
              f"bit-equal {case['bit_equal']}")


PRINTERS = {"async_rollout": print_async_rollout, "lora_sync": print_lora_sync, "weight_sync": print_weight_sync,
            "mode_switch": print_mode_switch, "grad_accum": print_grad_accum, "overhead": print_overhead,
            "rollout": print_rollout, "grpo": print_grpo, "packing": print_packing, "sft": print_sft,
            "sequence_parallel": print_sequence_parallel, "vllm_alone": print_vllm_alone, "distill": print_distill,
            "ppo": print_ppo, "scaling": print_scaling}


def print_result(result: dict) -> None:
    print(f"accel-bench: backend {result['backend']}, {result['world_size']} rank(s); medians [min-max] of "
          f"interleaved samples, ratios per round (median); compare ratios, not absolute times, on a shared machine")
    for name, scenario in result["scenarios"].items():
        PRINTERS[name](scenario)
    print_rollout_against_vllm_alone(result)
