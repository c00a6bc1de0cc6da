"""Training: the per-device steps, the optimizer and its schedule (with EMA), the initial state, the
loop and its moving parts (best checkpoint, early stopping, fine-tuning source, preemption, the
workdir lock, metrics)."""
