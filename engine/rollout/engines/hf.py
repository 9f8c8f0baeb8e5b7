"""``hf``: Hugging Face ``generate`` on the policy's own sharded model (the reference engine).

Every row keeps decoding until the longest response of the call ends. The model's ``generation_config.json``
(repetition penalties, ``min_p``, ``top_k``, greedy decoding...) would change what ``generate`` samples from,
while the trainer's log-probs assume ``base.sampling_scores``: it is set aside for the call and only the
``SamplingConfig`` applies. With the whole model gathered for the call (``generate_gather="once"``) ranks decode
independently; with ``"per_layer"`` every forward is a collective and ``synced_gpus`` keeps them in step.
"""

from __future__ import annotations

import contextlib

import torch

from .base import Responses, RolloutEngine, SamplingConfig


def left_padded(prompts: list[list[int]], n: int, pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each prompt ``n`` times in a row, left-padded: ``(input_ids, attention_mask)``, both ``[len * n, P]``."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts) * n, width), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for index, prompt in enumerate(prompts):
        rows = slice(index * n, (index + 1) * n)
        ids[rows, width - len(prompt):] = torch.tensor(prompt, dtype=torch.long)
        mask[rows, width - len(prompt):] = 1
    return ids, mask


def mask_through_first_eos(response_ids: torch.Tensor, eos_ids) -> torch.Tensor:
    """1 for each response token up to and including the first EOS (all of them when there is none)."""
    is_eos = torch.isin(response_ids, torch.tensor(list(eos_ids), device=response_ids.device)).long()
    return ((is_eos.cumsum(dim=1) - is_eos) == 0).long()


@contextlib.contextmanager
def model_generation_defaults_ignored(module):
    """Within the block, every HF model inside ``module`` has a blank ``GenerationConfig``."""
    from transformers import GenerationConfig

    saved = [(sub, sub.generation_config) for sub in module.modules()
             if isinstance(getattr(sub, "generation_config", None), GenerationConfig)]
    try:
        for sub, _ in saved:
            sub.generation_config = GenerationConfig()
        yield
    finally:
        for sub, original in saved:
            sub.generation_config = original


def hf_sampling_options(sampling: SamplingConfig) -> dict:
    """``generate`` options whose logits processors are exactly ``base.sampling_scores``."""
    if sampling.greedy:
        return {"do_sample": False, "num_beams": 1, "repetition_penalty": 1.0}
    return {"do_sample": True, "num_beams": 1, "temperature": sampling.temperature, "top_p": sampling.top_p,
            "top_k": sampling.top_k, "repetition_penalty": 1.0}


class PolicyDecoding(RolloutEngine):
    """The base of the engines that decode with the policy's own (sharded) parameters: nothing to send them."""

    receives_weights = False

    def left_padded_batch(self, prompts: list[list[int]], sampling: SamplingConfig):
        """``(policy, pad_id, input_ids, attention_mask, device)``: every prompt ``sampling.n`` times."""
        policy, pad_id = self.context.policy, self.context.tokenizer.pad_token_id
        input_ids, attention_mask = left_padded(prompts, sampling.n, pad_id)
        return policy, pad_id, input_ids, attention_mask, policy.backend.device()


class HFRolloutEngine(PolicyDecoding):
    cheap_log_probs = False  # generate(output_scores=True) keeps every decoding step's full scores

    def generate(self, prompts: list[list[int]], sampling: SamplingConfig) -> Responses:
        policy, pad_id, input_ids, attention_mask, device = self.left_padded_batch(prompts, sampling)
        want_scores = sampling.log_probs and not sampling.greedy
        with policy.eval_mode(), policy.generation_model() as model, model_generation_defaults_ignored(model):
            output = model.generate(
                input_ids=input_ids.to(device), attention_mask=attention_mask.to(device),
                max_new_tokens=sampling.max_new_tokens, pad_token_id=pad_id,
                eos_token_id=list(sampling.eos_token_ids), synced_gpus=policy.generation_is_collective,
                output_scores=want_scores, return_dict_in_generate=True, **hf_sampling_options(sampling))
        response = output.sequences[:, input_ids.size(1):]
        log_probs = None
        if want_scores:  # the processed scores: temperature, top-k and top-p applied
            scores = torch.stack(output.scores, dim=1).float()
            log_probs = torch.log_softmax(scores, -1).gather(-1, response.unsqueeze(-1)).squeeze(-1).cpu()
        # Every row is in the batch for every decoding step of the call.
        return Responses(token_ids=response.cpu(), mask=mask_through_first_eos(response, sampling.eos_token_ids).cpu(),
                         tokens_computed=response.numel(), log_probs=log_probs)
