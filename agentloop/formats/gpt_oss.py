"""Placeholder: the gpt_oss chat format is registered here."""
