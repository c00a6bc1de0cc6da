"""The run: one command's view of a run folder, made once (paths, saved config, data identity)."""
