"""servers package."""
