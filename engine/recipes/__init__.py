"""The trainers, each a ``Recipe`` of the training frame (``engine/train``), registered through the
``register_recipes`` hook. A recipe imports the frame, the rollout layer and the engine; never another recipe."""
