"""Tests of functions and modules in-process: no process started, no training loop run (conftest.py
enforces both). `python -m pytest -q -n 2 tests/unit` while editing."""
