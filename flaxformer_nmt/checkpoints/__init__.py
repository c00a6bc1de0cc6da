"""Checkpoints in orbax's format: the reader (retries, what counts as damage), the checkpointer
(save, exact resume, one-step writes), loading inference parameters and averaging them.

Everything here takes folders, not workdirs: `run.folder.Workdir` says which folder holds what."""
