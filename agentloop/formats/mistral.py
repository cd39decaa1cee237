"""Placeholder: the mistral chat format is registered here."""
