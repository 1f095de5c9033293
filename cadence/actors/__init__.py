"""The four actors: dispatcher, rollout worker, trainer, weight publisher, one actor a file; and
`episodes.py`, which joins the multi-turn episode runner (`cadence.tasks.environments`) to the
built-in engine."""
