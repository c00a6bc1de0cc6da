"""--mode=import: a pretrained transformers model made into a run, beside training (the other
stage that makes runs), through the same door (run/command.py open_new_run) and rollback
(run/making.py new_run)."""
