"""The four actors: dispatcher, rollout worker, trainer, weight publisher. One actor a file."""
