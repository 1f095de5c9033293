"""Reward functions: typed, registered by name, combined by weight (see base.py)."""
