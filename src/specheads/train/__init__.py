"""Training: data, losses, the hidden-state cache, the training loop, and the tiny-target builder."""
