"""Placeholder: the glm chat format is registered here."""
