"""The scratch folder `tests/e2e/test_readme.py` runs the README's commands in: laid out like a
clone, with the stand-ins that test's docstring lists (main.py, the `flaxformer-nmt` command and
benchmark scripts with small overrides appended, `srun` and `gcloud` starting 2 local processes,
sacreBLEU's wmt14 from a local cache, Multi30k served from 127.0.0.1).
"""

from __future__ import annotations

import json
import os
import pathlib
import random
import socket
import subprocess
import sys

import helpers
import jax_caches
import readme
from cluster import free_port

REPO = helpers.REPO
_TIMEOUT = 600  # seconds for one README command
# Two virtual devices, as two cores; the launchers give each process 4, the loop sets its own.
_XLA_FLAGS = "--xla_force_host_platform_device_count=2"

_MAIN_SHIM = """\
# README test stand-in for main.py and the flaxformer-nmt command: the real main.py (or, for
# WMT14's TFDS configs, the mock-WMT14 one), with the chain's overrides for the config's kind
# appended; absolute workdirs moved into the scratch folder.
import json, os, runpy, sys
repo, root = os.environ["README_TEST_REPO"], os.environ["README_TEST_ROOT"]
overrides = json.loads(os.environ["README_TEST_OVERRIDES"])
args = [f"--workdir={root}{a[10:]}" if a.startswith("--workdir=/") else a for a in sys.argv[1:]]
config = next((a[9:] for a in args if a.startswith("--config=")), "")
kinds = ("wmt14", "demo", "multi30k_multilingual", "multi30k")
kind = next((k for k in kinds if k in config), "files")
script = "tests/mock_wmt14_main.py" if kind == "wmt14" and ":files" not in config else "main.py"
sys.argv = [os.path.join(repo, script)] + args + overrides.get(kind, [])
runpy.run_path(sys.argv[0], run_name="__main__")
"""

_BENCHMARK_SHIM = """\
# README test stand-in for a benchmark script: the real one with small overrides appended.
import json, os, runpy, sys
name = os.path.splitext(os.path.basename(__file__))[0]
path = os.path.join(os.environ["README_TEST_REPO"], "benchmarks", name + ".py")
overrides = json.loads(os.environ["README_TEST_OVERRIDES"]).get(name, [])
# Records go to the scratch checkout's benchmarks/results, never over the committed ones.
records = os.path.join(os.environ["README_TEST_HOME"], "flaxformer_nmt", "benchmarks", "results")
sys.argv = [path] + sys.argv[1:] + overrides + ["--results_dir=" + records]
sys.path.insert(0, os.path.dirname(path))  # the real script's sibling modules, not their shims
runpy.run_path(path, run_name="__main__")
"""

# Stand-ins for the cluster launchers: 2 processes x 4 CPU devices on 127.0.0.1.
_SRUN = """\
#!/usr/bin/env python3
# README test stand-in for SLURM's srun: 2 tasks on this machine, with SLURM's variables.
import os, subprocess, sys
job = int(os.environ["README_TEST_SLURM_PORT"]) - 61440  # JAX's SLURM port: 61440 + job id % 4096
base = dict(os.environ, SLURM_JOB_ID=str(job), SLURM_STEP_NODELIST="127.0.0.1", SLURM_NTASKS="2",
            SLURM_STEP_NUM_NODES="1", JAX_PLATFORMS="cpu",
            XLA_FLAGS="--xla_force_host_platform_device_count=4")
procs = [subprocess.Popen(sys.argv[1:], env=dict(base, SLURM_PROCID=str(i), SLURM_LOCALID=str(i)))
         for i in range(2)]
sys.exit(max(p.wait() for p in procs))
"""

_GCLOUD = """\
#!/usr/bin/env python3
# README test stand-in for `gcloud compute tpus tpu-vm ssh POD --worker=all --command=CMD`: CMD on
# 2 local "workers" in the home folder; JAX's coordinator variables stand in for TPU metadata.
import os, subprocess, sys
args = sys.argv[1:]
assert args[:4] == ["compute", "tpus", "tpu-vm", "ssh"] and "--worker=all" in args, args
command = next(a[10:] for a in args if a.startswith("--command="))
base = dict(os.environ, JAX_COORDINATOR_ADDRESS="127.0.0.1:" + os.environ["README_TEST_PORT"],
            JAX_NUM_PROCESSES="2", JAX_PLATFORMS="cpu",
            XLA_FLAGS="--xla_force_host_platform_device_count=4")
procs = [subprocess.Popen(["bash", "-c", command], cwd=os.environ["README_TEST_HOME"],
                          env=dict(base, JAX_PROCESS_ID=str(i))) for i in range(2)]
sys.exit(max(p.wait() for p in procs))
"""


def fake_sacrebleu_wmt14(cache: pathlib.Path, lines: int) -> list[tuple[str, str]]:
  """sacreBLEU's wmt14 (the filtered newstest2014) as its download would leave it: the tarball
  present (so nothing is fetched) and its SGML files extracted, with demo sentences."""
  from sacrebleu.dataset import DATASETS  # pylint: disable=g-import-not-at-top

  from flaxformer_nmt.data import demo  # pylint: disable=g-import-not-at-top

  dataset = DATASETS["wmt14"]
  raw = cache / "wmt14" / "raw"
  (raw / "test").mkdir(parents=True)
  (raw / dataset._get_tarball_filename(dataset.data[0])).write_bytes(b"stand-in")  # pylint: disable=protected-access
  pairs = demo.make_demo_split("test", lines, 0)
  src_file, ref_file = dataset.langpairs["en-de"]
  for name, column, lang in ((src_file, 0, "en"), (ref_file, 1, "de")):
    segs = "".join(f'<seg id="{i + 1}">{p[column]}</seg>\n' for i, p in enumerate(pairs))
    doc = (
      '<srcset setid="newstest2014" srclang="any">\n<doc docid="d1" origlang="en">\n'
      f"{segs}</doc>\n</srcset>\n"
    )
    (raw / name).write_text(doc if lang == "en" else doc.replace("srcset", "refset"), "utf-8")
  return pairs


def _free_port_in(low: int, high: int) -> int:
  """A free port in [low, high): JAX derives a SLURM job's coordinator port from its id, in the
  top 4,096 ports, so the srun stand-in picks the job id from a free one."""
  for port in random.sample(range(low, high), 200):
    with socket.socket() as s:
      try:
        s.bind(("127.0.0.1", port))
      except OSError:
        continue
      return port
  raise AssertionError(f"no free port in [{low}, {high})")


def _compile_cache(root: pathlib.Path) -> dict[str, str]:
  """The JAX compilation cache of the chains' stack (two devices; tests/jax_caches.py), kept
  between test runs, or the session's own empty one under FLAXFORMER_NMT_TEST_CACHE=cold."""
  session = root.parent.parent if os.environ.get("PYTEST_XDIST_WORKER") else root.parent
  return jax_caches.environment(_XLA_FLAGS, session)


class Sandbox:
  """A scratch folder laid out like a user's checkout, with the stand-ins of the module doc."""

  def __init__(self, root: pathlib.Path, overrides: dict[str, list[str]]) -> None:
    self.root = root
    self.repo = root / "flaxformer_nmt"  # the clone (gcloud's command does `cd flaxformer_nmt`)
    self.repo.mkdir()
    (self.repo / "configs").symlink_to(REPO / "configs")
    (self.repo / "main.py").write_text(_MAIN_SHIM)
    bench = self.repo / "benchmarks"
    bench.mkdir()
    for path in (REPO / "benchmarks").iterdir():
      if path.suffix == ".py":
        (bench / path.name).write_text(_BENCHMARK_SHIM)
      elif path.is_file():
        (bench / path.name).symlink_to(path)
    bin_dir = root / "bin"
    bin_dir.mkdir()
    command = f"#!{sys.executable}\n{_MAIN_SHIM}"
    for name, text in (("srun", _SRUN), ("gcloud", _GCLOUD), ("flaxformer-nmt", command)):
      (bin_dir / name).write_text(text)
      (bin_dir / name).chmod(0o755)
    self.env = dict(
      os.environ,
      PATH=f"{bin_dir}:{pathlib.Path(sys.executable).parent}:{os.environ['PATH']}",
      README_TEST_REPO=str(REPO),
      README_TEST_ROOT=str(root / "abs"),
      README_TEST_HOME=str(root),
      README_TEST_OVERRIDES=json.dumps(overrides),
      README_TEST_PORT=str(free_port()),
      README_TEST_SLURM_PORT=str(_free_port_in(61440, 65536)),
      XLA_FLAGS=_XLA_FLAGS,
      MOCK_WMT14_SIZES="3000,32,48",
      # One compilation cache for the session's chains: the commands of a chain compile the same
      # steps again and again (training, then eval, translate, attention ... each a new process).
      **_compile_cache(root),
      SACREBLEU=str(root / "sacrebleu"),
      PYTHONPATH=str(REPO),
    )

  def run(self, command: readme.Command) -> subprocess.CompletedProcess:
    if command.kind == "python":
      argv = [sys.executable, "-c", command.text]
    else:
      argv = ["bash", "-c", f"set -euo pipefail\n{command.text}"]
    proc = subprocess.run(
      argv,
      cwd=self.repo,
      env=self.env,
      capture_output=True,
      text=True,
      timeout=_TIMEOUT,
    )
    assert proc.returncode == 0, (
      f"README command failed ({proc.returncode}):\n{command.text}\n{proc.stderr[-4000:]}"
    )
    return proc


def run_chain(
  chain: str,
  tmp_path: pathlib.Path,
  overrides: dict[str, list[str]],
  first: list[readme.Command] = (),
  **env: str,
):
  """Runs the chain's commands in README order (after `first`), its `--mode=prepare` commands
  first, each distinct command once, in one sandbox; yields (command, process, sandbox) to
  check."""
  box = Sandbox(tmp_path, overrides)
  box.env.update(env)
  chain_commands = [*first, *readme.in_chain(chain)]
  chain_commands.sort(key=lambda c: "--mode=prepare" not in c.text)  # stable: otherwise in order
  ran: set[str] = set()
  for command in map(readme.as_installed, chain_commands):  # installed already: .ci/run
    if command.text.startswith("pip install"):
      continue  # the install chain's
    if command.text in ran and command.text.startswith("python benchmarks/"):
      # A benchmark written on two pages (the README's results table and the page that explains
      # the figure): the same script, sandbox and overrides, so a second run checks nothing new.
      # Other commands run again: a repeated eval after a fine-tune sees a changed run.
      continue
    ran.add(command.text)
    yield command, box.run(command), box
