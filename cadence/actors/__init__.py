"""The four actors: dispatcher, rollout worker, trainer, weight publisher, one actor a file, each the
loop around its state (the groups a worker makes: `cadence.rollout`; the loss the trainer steps:
`cadence.training.steps`)."""
