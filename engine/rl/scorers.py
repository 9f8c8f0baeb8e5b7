"""The scorers behind ``reward_model.*`` (``reward_model.py``): what every model-served reward keeps (its figures)
and the sequence-classification model scoring responses in the trainer's processes."""

from __future__ import annotations

import contextlib
import time

import torch

from ..runtime import max_over_ranks
from .prompt_types import Sample

STYLE = "model"  # rewards.py calls such a reward's ``score(samples, responses, completions)``
STAT_KEYS = ("reward_model_score_sum", "reward_model_scored", "reward_model_failures", "reward_model_seconds")


class ModelReward:
    """A model-served reward: ``score`` returns one number per response and adds to the figures ``take_stats``
    hands back (and clears)."""

    __name__ = "reward_model"  # the metric reward/reward_model
    last_failure = ""  # why the latest failed response failed (a judge's cause), for the run's stop line

    def __init__(self) -> None:
        self.stats = dict.fromkeys(STAT_KEYS, 0.0)

    @property
    def where(self) -> str:
        """What a stop line names: the model's directory or the judge's endpoint."""
        return str(self.section.path)

    def score(self, samples: list[Sample], responses: list[str], completions: list | None = None) -> list[float]:
        began = time.perf_counter()
        scores, failed = self._score(samples, responses, completions)
        self.stats["reward_model_seconds"] += time.perf_counter() - began
        self.stats["reward_model_failures"] += float(sum(failed))
        scored = [value for value, bad in zip(scores, failed, strict=True) if not bad]
        self.stats["reward_model_score_sum"] += float(sum(scored))
        self.stats["reward_model_scored"] += float(len(scored))
        return scores

    def _score(self, samples, responses, completions) -> tuple[list[float], list[bool]]:
        """(one score per response, whether each failed: a failed one scores 0)"""
        raise NotImplementedError

    def take_stats(self) -> dict[str, float]:
        stats, self.stats = self.stats, dict.fromkeys(STAT_KEYS, 0.0)
        return stats


def prompt_text(sample: Sample) -> str:
    """The prompt as a judge or a text reward model reads it: the row's text, messages as ``role: content`` lines."""
    raw = sample.raw_prompt
    if isinstance(raw, str):
        return raw
    if isinstance(raw, list):
        return "\n".join(f"{m.get('role', '')}: {m.get('content') or ''}" for m in raw)
    return sample.prompt


def weight_bytes(path: str) -> int:
    """The size of a model directory's weight files (safetensors or PyTorch bins), as stored."""
    from pathlib import Path

    return sum(f.stat().st_size for pattern in ("*.safetensors", "*.bin") for f in Path(path).glob(pattern))


def shards_across_ranks(section, world_size: int) -> bool:
    """Whether ``reward_model.path`` is sharded across the trainer's ranks (``reward_model.sharding``): ``auto``
    shards a model whose weight files exceed ``reward_model.replicate_max_gib`` and replicates a smaller one, whose
    full copy on each rank costs less than a sharded forward's gathers. One process has nothing to shard over."""
    if world_size < 2 or section.sharding == "replicated":
        return False
    return section.sharding == "sharded" or weight_bytes(section.path) > section.replicate_max_gib * 2 ** 30


def classifier_builder(path: str):
    """A zero-argument builder of ``path``'s sequence-classification model (fp32; on the meta device, as the ranks
    that receive their shards from rank 0 build it, the structure alone), whose last position is its score."""
    def build():
        from transformers import AutoConfig, AutoModelForSequenceClassification

        if torch.get_default_device().type == "meta":
            model = AutoModelForSequenceClassification.from_config(AutoConfig.from_pretrained(path),
                                                                   dtype=torch.float32)
        else:
            model = AutoModelForSequenceClassification.from_pretrained(path, dtype=torch.float32)
        if model.config.num_labels != 1:
            raise ValueError(f"reward_model.path {path} has {model.config.num_labels} labels: a reward model has "
                             "one (num_labels=1), as accel-rm exports it")
        # Rows are left-padded, so each one's last token is the last position: an id no token has makes the model
        # read it there (with the tokenizer's pad id it would skip an EOS that is also the pad token).
        model.config.pad_token_id = -1
        return model

    return build


class ClassifierReward(ModelReward):
    """``reward_model.path``: an ``AutoModelForSequenceClassification`` (one label) scoring this rank's responses in
    batches of ``batch_size`` at each sequence's last token (its EOS for text, as accel-rm reads a pair); a full
    copy in each trainer process, or with ``engine`` (an ``EngineConfig`` with ``frozen=True``) one frozen engine
    sharded across them, every rank then running as many forwards (``shards_across_ranks``)."""

    def __init__(self, section, backend, engine=None) -> None:  # RewardModelConfig
        super().__init__()
        from transformers import AutoTokenizer
        from transformers.utils import logging

        logging.disable_progress_bar()
        self.section, self.backend, self.device = section, backend, backend.device()
        self.tokenizer = AutoTokenizer.from_pretrained(section.path)
        build = classifier_builder(section.path)
        self.engine = None
        if engine is not None:
            from .. import FSDPEngine

            self.engine = FSDPEngine(build, engine, backend)
            self.model = self.engine.module
        else:
            self.model = build().to(self.device).eval().requires_grad_(False)

    def text(self, sample: Sample, response: str, completion) -> list[int]:
        """Token ids of the prompt with its response as accel-rm trained on them: a conversation rendered by the
        reward model's chat template with the response as the assistant's turn (a multi-turn rollout: its turns),
        text as the prompt's tokens, the response's and the EOS."""
        tok = self.tokenizer
        if isinstance(sample.raw_prompt, list) and getattr(tok, "chat_template", None):
            turns = completion if isinstance(completion, list) else [{"role": "assistant", "content": response}]
            text = tok.apply_chat_template(list(sample.raw_prompt) + list(turns), tokenize=False)
            ids = list(tok(text, add_special_tokens=False)["input_ids"])
        else:
            ids = [*tok(prompt_text(sample), add_special_tokens=False)["input_ids"],
                   *tok(response, add_special_tokens=False)["input_ids"]]
            if tok.eos_token_id is not None and (not ids or ids[-1] != tok.eos_token_id):
                ids.append(tok.eos_token_id)
        return ids[-self.section.max_length:]  # the end, where the score is read, is kept

    def _score(self, samples, responses, completions):
        rows = [self.text(s, r, completions[i] if completions else None)
                for i, (s, r) in enumerate(zip(samples, responses, strict=True))]
        size = self.section.batch_size
        forwards = -(-len(rows) // size)
        if self.engine is not None:  # a sharded forward is a collective: every rank runs the most any rank needs
            forwards = int(max_over_ranks({"forwards": forwards}, self.backend.metrics_device())["forwards"])
        scores: list[float] = []
        with torch.no_grad(), self.engine.eval_mode() if self.engine is not None else contextlib.nullcontext():
            for start in range(0, forwards * size, size):
                chunk = rows[start:start + size]
                logits = self.forward(chunk or [[self.pad_id]])  # a filler: this rank has no rows left
                if chunk:
                    scores += logits[:, 0].float().cpu().tolist()
        return scores, [False] * len(scores)

    @property
    def pad_id(self) -> int:
        return self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0  # masked out anyway

    def forward(self, chunk: list[list[int]]) -> torch.Tensor:
        """The logits ``[rows, 1]`` of token-id rows, left-padded so that each row ends at the last position."""
        width = max(len(ids) for ids in chunk)
        ids = torch.full((len(chunk), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(chunk), width), dtype=torch.long)
        for row, tokens in enumerate(chunk):
            ids[row, width - len(tokens):] = torch.tensor(tokens, dtype=torch.long)
            mask[row, width - len(tokens):] = 1
        positions = (mask.cumsum(dim=1) - 1).clamp(min=0)  # as if unpadded
        return self.model(input_ids=ids.to(self.device), attention_mask=mask.to(self.device),
                          position_ids=positions.to(self.device)).logits
