"""cadence: periodic-asynchronous on-policy RL for language models."""

__version__ = "0.1.0"
