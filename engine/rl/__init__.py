"""The RL layer (``docs/architecture.md``): what every RL recipe stands on, between the rollout layer and the
recipes. Prompt data and its formats (``prompts``, ``prompt_types``, ``tokenizer``, ``model``), rewards and scoring
(``rewards``, ``scoring``), the step's global batch (``batches``, ``groups``, ``sizes``), log-probs of a policy or of
any frozen model (``logprobs``), the formulas (``algorithms``: advantages, policy losses, aggregations, KL),
rollout correction (``rollout_correction``), validation (``validation``) and sampling ahead (``ahead``).
``offline/``: what the trainers on fixed data sets (SFT, DPO, reward models) share. It uses the engine's public API,
``engine/rollout`` and ``engine/train``; never a recipe."""
