"""Multi-turn SFT on the RL workers: the loop and conversations as token trajectories."""
