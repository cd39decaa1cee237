"""Placeholder: the llama3 chat format is registered here."""
