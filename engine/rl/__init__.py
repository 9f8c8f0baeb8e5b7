"""The RL layer: what the recipes share above the training frame (``docs/architecture.md``). ``offline/``: what the
trainers on fixed data sets (SFT, DPO, reward models) share."""
