"""agentloop package."""
