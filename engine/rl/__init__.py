"""The RL layer (``docs/architecture.md``): what every RL algorithm stands on, between the rollout layer and the
trainers. The RL step and the one RL recipe (``step``: ``RLTrainer``, blind to the algorithm; ``algorithm``: the
``Algorithm`` hooks an algorithm writes; ``registration``: what the recipe reads of an algorithm's class;
``recipe``: ``RLRecipe``, bound to a registered algorithm; ``cli``: the built-in algorithms' commands; ``parts``,
``update``, ``micro_batch``, ``frozen``, ``trained``), the loss as per-token terms (``terms``), the formulas
(``advantages``, ``losses``, ``gae``; ``formulas`` names them together), the shared config sections and their checks
(``schema``, ``checks``, ``engine_settings``, ``sizes``), prompt data and its formats (``prompts``, ``prompt_types``,
``tokenizer``, ``model``), rewards and scoring (``rewards``, ``scoring``; model-served rewards: ``reward_model``,
``scorers``, ``judge``), a frozen model served by vLLM (``server_logprobs``), the step's global batch (``batches``,
``groups``), log-probs of a policy or of any frozen model (``logprobs``), rollout correction, validation, sampling
ahead (``ahead``) and the step's metrics row (``step_metrics``). ``algorithms/``: the built-in algorithms (GRPO,
PPO with its critic, distillation with its teacher), one package each. ``offline/``: what the trainers on fixed data
sets (SFT, DPO, reward models) share. It uses the engine's public API, ``engine/rollout`` and ``engine/train``; never
a recipe. ``docs/adding-a-trainer.md`` shows an algorithm written on it."""
