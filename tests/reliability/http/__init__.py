"""HTTP reliability tests sharing one agentloop-serve; a package, so that the server stops
when they end."""
