"""Pure tensor functions of GRPO: advantages, log-probs, losses. No state, no I/O."""
