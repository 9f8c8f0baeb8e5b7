"""GRPO post-training on the shared FSDP engine."""
