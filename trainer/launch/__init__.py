"""Start-up of the commands that roll out: rollout servers, the AgentLoopManager, and Ray set up so
worker logs reach the driver."""
