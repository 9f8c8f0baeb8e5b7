"""The RL layer (``docs/architecture.md``): what every RL recipe stands on, between the rollout layer and the
recipes. The RL step and its recipe base (``step``: ``RLTrainer``, blind to the algorithm; ``algorithm``: the
``Algorithm`` hooks a recipe writes; ``recipe``: ``RLRecipe``; ``parts``, ``update``, ``frozen``), the loss as
per-token terms (``terms``), the formulas (``advantages``, ``losses``, ``gae``; ``algorithms`` names them together),
the shared config sections and their checks (``schema``, ``checks``, ``engine_settings``, ``sizes``), prompt data and
its formats (``prompts``, ``prompt_types``, ``tokenizer``, ``model``), rewards and scoring (``rewards``,
``scoring``; model-served rewards: ``reward_model``, ``scorers``, ``judge``), PPO's critic (``critic``), a
distillation teacher (``teacher``, ``server_logprobs``), the step's global batch (``batches``, ``groups``),
log-probs of a policy or of any frozen model (``logprobs``), rollout correction, validation, sampling ahead
(``ahead``) and the step's metrics row (``step_metrics``). ``offline/``: what the trainers on fixed data sets (SFT,
DPO, reward models) share. It uses the engine's public API, ``engine/rollout`` and ``engine/train``; never a
recipe. ``docs/adding-a-trainer.md`` shows a recipe written on it."""
