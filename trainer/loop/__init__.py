"""The RL loop: the sync and async trainers, run assembly, checkpoints, and the driver's side of
weight sync."""
