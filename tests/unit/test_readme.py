"""The README and docs/*.md, read without running anything: every command they show is parsed
and belongs to a chain (tests/readme.py) that tests/e2e/test_readme.py runs (`-m readme`)."""

from __future__ import annotations

import helpers
import readme

REPO = helpers.REPO


def test_every_readme_command_belongs_to_a_chain_that_runs_it():
  commands = readme.commands()
  assert len(commands) >= 40
  orphans = [c.text for c in commands if c.chain not in readme.CHAINS]
  assert not orphans, f"README commands no test runs: {orphans}"
  for chain in readme.CHAINS:
    assert readme.in_chain(chain), f"chain {chain} has no README command"
