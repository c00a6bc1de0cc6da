"""Tests of commands, processes, training runs, notebooks and the README's commands: what a user
runs, end to end. Trained workdirs are built once per test run (tests/e2e/conftest.py)."""
