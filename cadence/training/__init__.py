"""The trainer's model side: the learner (losses, gradients, optimizer), data-parallel ranks and their
collectives, FSDP2 sharding, resume checkpoints, and the timed stand-ins the pipeline bench uses."""
