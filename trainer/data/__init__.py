"""Dataset rows and the resumable prompt sampler."""
