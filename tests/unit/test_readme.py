"""The README and docs/*.md, read without running anything: every command they show is parsed
and belongs to a chain (tests/readme.py) that tests/e2e/test_readme.py runs (`-m readme`)."""

from __future__ import annotations

import re

import helpers
import readme

REPO = helpers.REPO


def _chains_the_e2e_tests_run() -> set[str]:
  """The chains tests/e2e/test_readme*.py name in `run_chain("x", ...)`, `in_chain("x")` or a
  `parametrize("chain", [...])` list; "install" is every chain's `pip install` (dry-run there)."""
  text = "".join(p.read_text() for p in (REPO / "tests" / "e2e").glob("test_readme*.py"))
  named = set(re.findall(r'(?:run_chain|in_chain)\(\s*"([\w-]+)"', text))
  for listed in re.findall(r'parametrize\(\s*"chain",\s*\[([^\]]*)\]', text):
    named |= set(re.findall(r'"([\w-]+)"', listed))
  if "readme.commands()" in text and '"pip install"' in text:
    named.add("install")
  return named


def test_every_readme_command_belongs_to_a_chain_that_runs_it():
  commands = readme.commands()
  assert len(commands) >= 40
  orphans = [c.text for c in commands if c.chain not in readme.CHAINS]
  assert not orphans, f"README commands no test runs: {orphans}"
  for chain in readme.CHAINS:
    assert readme.in_chain(chain), f"chain {chain} has no README command"
  unrun = set(readme.CHAINS) - _chains_the_e2e_tests_run()
  assert not unrun, f"chains no test in tests/e2e/test_readme*.py runs: {sorted(unrun)}"


def test_every_ci_chain_command_is_in_ci_run_or_the_compatibility_script():
  """The "ci" chain's commands (test commands, `python tools/...` checks, as docs show them) are
  the ones .ci/run runs verbatim, itself or through tools/compat.sh; tests/e2e/test_readme.py
  checks the same against the quick start's command as .ci/run extracts it. Read here too, so a
  page naming a tools/ script in a `python tools/...` span fails in seconds, not in CI's README leg.
  The quick start's test command is .ci/run's by construction (.ci/run reads it from the README)."""
  ci = (REPO / ".ci" / "run").read_text()
  compat = (REPO / "tools" / "compat.sh").read_text()
  commands = readme.in_chain("ci")
  (quick_start,) = [c.text for c in commands if c.text.startswith("pip install")]
  for command in commands:
    text = command.text.replace(' -m "not slow"', "")  # leaves out tests of what CI runs whole
    assert any(text in t for t in (ci, compat, quick_start)), (
      f"{command.page}: .ci/run does not run {command.text}"
    )
