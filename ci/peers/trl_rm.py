"""TRL's RewardTrainer (Bradley-Terry, a sequence-classification head with one label on the causal LM directory)
on the work ``ci/peers/preference_compare.py`` gives it: one process, the same model directory, pairs and pairs per
optimizer step as ``accel-rm``. The options and the record are ``trl_dpo.py``'s."""

from __future__ import annotations

from trl_dpo import parse_args, settings, train_and_record


def main() -> None:
    args = parse_args()

    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer
    from trl import RewardConfig, RewardTrainer

    tokenizer = AutoTokenizer.from_pretrained(args.model_dir)
    torch.manual_seed(0)  # the new head's weights
    model = AutoModelForSequenceClassification.from_pretrained(args.model_dir, num_labels=1, dtype=torch.float32)
    model.config.pad_token_id = tokenizer.pad_token_id
    config = RewardConfig(**settings(args))
    train_and_record(lambda data, callbacks: RewardTrainer(model=model, args=config, train_dataset=data,
                                                           processing_class=tokenizer, callbacks=callbacks), args)


if __name__ == "__main__":
    main()
