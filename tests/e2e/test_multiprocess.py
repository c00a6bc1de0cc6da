"""main.py as 2 processes x 4 CPU devices equals 1 process x 8, through preemption and kill -9.

Real processes joined by jax.distributed on 127.0.0.1 (gloo collectives), launched as a user
would launch a multi-host job. The reference is the same command as one process of 8 devices: the
global batches depend only on the global device count, so losses, parameters, dev figures and
translations must agree up to the float rounding of cross-process sums. Final states are read with
orbax directly, not with the code under test.
"""

from __future__ import annotations

import ast
import json
import pathlib
import re
import shutil
import signal

import numpy as np
import orbax.checkpoint as ocp
import pytest

from flaxformer_nmt import api, modes

import cluster  # tests/cluster.py (pytest puts tests/ on the path)
import helpers

# Several-process jobs take both cores: the tests that start them share one xdist worker, so two
# such jobs never run at once (waiting in gloo's collectives while another job has the cores
# slows both several-fold); the other worker runs the rest meanwhile.
pytestmark = pytest.mark.xdist_group("several_processes")

TOTAL = 24
TIMEOUT_S = 300

TINY = [
  "--config=configs/demo.py",
  "--config.data.demo_train_size=2000",
  "--config.data.demo_dev_size=16",
  "--config.data.demo_test_size=16",
  "--config.data.vocab_size=120",
  "--config.data.vocab_sample_size=2000",
  "--config.data.max_len=32",
  "--config.data.tokens_per_batch=512",  # 16 rows: 2 per device
  "--config.model.num_layers=1",
  "--config.model.d_model=32",
  "--config.model.d_ff=64",
  "--config.model.num_heads=2",
  "--config.model.max_len=64",
  "--config.model.dropout_rate=0.1",  # on: dropout keys must follow the device, not the process
  "--config.optim.warmup_steps=10",
  f"--config.num_train_steps={TOTAL}",
  "--config.log_every_steps=1",
  "--config.eval_every_steps=12",  # dev loss and dev BLEU at steps 12 and 24
  "--config.checkpoint_every_steps=4",
  "--config.keep_checkpoints=10",
  "--config.eval.dev_bleu_sentences=8",
  "--config.decode.beam_size=2",
  "--config.decode.max_len_offset=5",
  "--config.optim.ema_decay=0.9",  # the parameter average resumes exactly too
  "--config.best_metric=dev_bleu",  # best/ is written by both processes together
]


def _losses(workdir: pathlib.Path) -> dict[int, float]:
  """Per-step training loss (train_metrics.jsonl); a step run again after a kill: its last value."""
  return {r["step"]: r["loss"] for r in helpers.read_metrics(workdir, "train")}


def _read_checkpoint(workdir: pathlib.Path, step: int) -> tuple[dict, dict]:
  with ocp.CheckpointManager(workdir / "checkpoints", item_names=("state", "data")) as manager:
    restored = manager.restore(
      step, args=ocp.args.Composite(state=ocp.args.PyTreeRestore(), data=ocp.args.JsonRestore())
    )
  return restored["state"], restored["data"]


def _flat(tree, prefix=""):
  if isinstance(tree, dict):
    for k, v in tree.items():
      yield from _flat(v, f"{prefix}/{k}")
  else:
    yield prefix, np.asarray(tree)


@pytest.fixture
def base(tmp_path, shared_compilation_cache) -> pathlib.Path:
  """A test's own folder; its launches share the session's compilation cache."""
  (tmp_path / "jax_cache").symlink_to(shared_compilation_cache)
  return tmp_path


@pytest.fixture(scope="session")
def reference(tmp_path_factory, shared_compilation_cache) -> pathlib.Path:
  """The uninterrupted single-process run (8 devices) every comparison is made against, run
  once per session (read-only: a test that writes into it copies it first)."""

  def run(workdir: pathlib.Path) -> dict:
    job = cluster.launch(
      [f"--workdir={workdir}", *TINY],
      processes=1,
      devices=8,
      log_prefix=workdir.parent / "multiprocess_reference",
      cache_dir=shared_compilation_cache,
    )
    assert job.wait(TIMEOUT_S) == [0], job.log()[-4000:]
    return {}

  return helpers.shared_once(tmp_path_factory, "multiprocess_reference", run)[1]


def test_two_processes_train_like_one_through_sigterm_and_kill(base, reference):
  workdir = base / "two"
  args = [f"--workdir={workdir}", *TINY]
  launch = lambda: cluster.launch(
    args, processes=2, devices=4, log_prefix=base / "two", cache_dir=base / "jax_cache"
  )

  # 1. SIGTERM to every process mid-run: they agree on a step, save it and exit cleanly.
  job = launch()
  job.wait_for(f"step 6/{TOTAL}", TIMEOUT_S)
  job.signal(signal.SIGTERM)
  assert job.wait(TIMEOUT_S) == [0, 0], job.log()[-4000:]
  stopped = [int(s) for s in re.findall(r"Stopped by .* after step (\d+)", job.log())]
  assert len(stopped) == 1 and 6 <= stopped[0] < TOTAL, job.log()[-3000:]
  assert (workdir / "checkpoints" / str(stopped[0])).is_dir()
  assert json.loads((workdir / "train_result.json").read_text())["preempted"] is True

  # 2. Resume, then kill -9 both processes after a few more steps.
  job = launch()
  job.wait_for(f"Resumed from step {stopped[0]}", TIMEOUT_S)
  job.wait_for(f"step {stopped[0] + 5}/{TOTAL}", TIMEOUT_S)
  job.kill()

  # 3. Resume again and finish.
  job = launch()
  assert job.wait(TIMEOUT_S) == [0, 0], job.log()[-4000:]

  # Same losses at every step, same final parameters, Adam moments and input positions.
  want, got = _losses(reference), _losses(workdir)
  assert sorted(got) == sorted(want) == list(range(1, TOTAL + 1))
  np.testing.assert_allclose([got[s] for s in want], list(want.values()), atol=2e-4)
  (state_1, data_1), (state_2, data_2) = (_read_checkpoint(w, TOTAL) for w in (reference, workdir))
  assert data_1["streams"] == data_2["streams"] and len(data_1["streams"]) == 8
  flat_1, flat_2 = dict(_flat(state_1)), dict(_flat(state_2))
  assert flat_1.keys() == flat_2.keys()
  assert any(name.startswith("/opt_state/1/ema/") for name in flat_1)  # the EMA is compared
  for name, value in flat_1.items():
    np.testing.assert_allclose(flat_2[name], value, rtol=1e-4, atol=1e-5, err_msg=name)
  # Dev loss and dev BLEU at both evaluations, and the test BLEU of the final report.
  # Dev figures by step (a step run again after the kill is evaluated again: its last record).
  dev_1, dev_2 = (
    {r["step"]: r for r in helpers.read_metrics(w, "dev")} for w in (reference, workdir)
  )
  assert sorted(dev_2) == [12, 24] == sorted(dev_1)
  for d1, d2 in ((dev_1[s], dev_2[s]) for s in (12, 24)):
    for prefix in ("", "ema_"):
      np.testing.assert_allclose(d2[f"{prefix}dev_loss"], d1[f"{prefix}dev_loss"], rtol=1e-5)
      assert d2[f"{prefix}dev_bleu"] == pytest.approx(d1[f"{prefix}dev_bleu"], abs=1e-6)
  # The best evaluation's parameters, written once by the two processes, as by the one.
  best_1, best_2 = (json.loads((w / "best_result.json").read_text()) for w in (reference, workdir))
  assert best_2["best_step"] == best_1["best_step"] and best_2["best_parameters"]
  assert [p.name for p in (workdir / "best").iterdir() if p.name.isdigit()] == [
    str(best_1["best_step"])
  ]
  result_1, result_2 = (
    json.loads((w / "train_result.json").read_text()) for w in (reference, workdir)
  )
  for key in ("test_sacrebleu_greedy", "test_sacrebleu_beam2", "test_tokenized_bleu_beam2"):
    assert result_2[key] == pytest.approx(result_1[key], abs=1e-6), key
  # One log, one set of results: process 1 reports only warnings.
  assert not re.search(r"^I\d{4} ", job.log(1), re.M), job.log(1)[:2000]
  assert len(list(workdir.glob("events.out.tfevents.*"))) == 3  # one per launch, process 0 only


# float16 with a loss scale that doubles and halves within 12 steps (as test_resume.py's).
FLOAT16 = [
  "--config.model.dtype=float16",
  "--config.optim.loss_scale_init=1048576",
  "--config.optim.loss_scale_period=3",
  "--config.num_train_steps=12",
  "--config.best_metric=",  # this test compares training; best/ is the first test's
]


def test_two_processes_train_like_one_in_float16(base):
  """2 x 4 devices against 1 x 8 in float16: every process skips the same steps (the skip is
  decided on the summed gradient, which every device holds), so the loss scale, its counts and
  the skipped steps agree exactly, and losses and parameters within the rounding of
  cross-process sums."""
  runs = {}
  for processes, devices in ((1, 8), (2, 4)):
    workdir = base / f"f16_{processes}x{devices}"
    job = cluster.launch(
      [f"--workdir={workdir}", *TINY, *FLOAT16],
      processes=processes,
      devices=devices,
      log_prefix=workdir.parent / workdir.name,
      cache_dir=base / "jax_cache",
    )
    assert job.wait(TIMEOUT_S) == [0] * processes, job.log()[-4000:]
    runs[processes] = workdir
  (one, two) = (helpers.read_metrics(runs[p], "train") for p in (1, 2))
  assert [r["step"] for r in one] == [r["step"] for r in two] == list(range(1, 13))
  scales = [r["loss_scale"] for r in one]
  assert [r["loss_scale"] for r in two] == scales
  pairs = list(zip(scales, scales[1:], strict=False))
  assert any(b > a for a, b in pairs) and any(b < a for a, b in pairs)  # it doubled and halved
  assert [r["skipped_steps_total"] for r in two] == [r["skipped_steps_total"] for r in one]
  # float16 rounds the small differences of the cross-process sums 8x coarser than float32.
  np.testing.assert_allclose([r["loss"] for r in two], [r["loss"] for r in one], atol=1e-3)
  (state_1, data_1), (state_2, data_2) = (_read_checkpoint(runs[p], 12) for p in (1, 2))
  assert data_1["streams"] == data_2["streams"]
  flat_1, flat_2 = dict(_flat(state_1)), dict(_flat(state_2))
  assert flat_1.keys() == flat_2.keys() and "/loss_scale/scale" in flat_1
  for name in ("/loss_scale/scale", "/loss_scale/good_steps", "/loss_scale/skipped_steps"):
    assert flat_1[name] == flat_2[name], name
  # Measured: the parameters within 0.5% of each leaf's norm, Adam's first moments within 1.2%
  # (float16 activations turn the last-bit differences of float32 sums into whole float16 steps);
  # a process that skipped another step, or unscaled differently, is off by the leaf's own size.
  for name, value in flat_1.items():
    if value.dtype.kind == "f":
      gap = np.linalg.norm(flat_2[name] - value) / max(np.linalg.norm(value), 1e-12)
      assert gap < (0.02 if name.startswith("/params/") else 0.05), (name, gap)
    else:
      np.testing.assert_array_equal(flat_2[name], value, err_msg=name)


def _tiny_overrides() -> dict:
  """TINY's overrides as the API takes them."""
  overrides = {}
  for flag in TINY[1:]:
    name, value = flag[len("--config.") :].split("=", 1)
    try:
      overrides[name] = ast.literal_eval(value)
    except ValueError:  # a bare string (dev_bleu), as the flag passes it
      overrides[name] = value
  return overrides


def _in_process_config():
  """TINY as a config, loaded as the API loads it (for runs in this 8-device test process)."""
  return api.load_config("demo", _tiny_overrides())


def test_eval_translate_average_under_two_processes_match_one(base, reference, tmp_path):
  """Decoding spread over 2 processes gives what 1 process of 8 devices gives: the eval against
  the reference run's own final test decoding, the translations (the best, and sampled n-best
  lists) against ones made in this process (8 devices); the average is written once. The four
  modes run one after another in one 2-process job (tests/modes_main.py), as main.py runs each."""
  lines = ["I have three hundred and forty-five apples.", "", "twelve", "the year 1984"]
  reference = pathlib.Path(shutil.copytree(reference, tmp_path / "reference"))  # it writes here
  source = tmp_path / "in.txt"
  source.write_text("\n".join(lines) + "\n", encoding="utf-8")
  # Terms for --constraints, and pairs for --mode=score.
  terms = tmp_path / "terms.txt"
  terms.write_text("drei\tvierzig\n\n\nneun\n", encoding="utf-8")
  pairs = [(s, t) for s, t in zip(lines, ["drei Äpfel", "", "zwölf", "das Jahr"], strict=True) if s]
  source_nonblank, references = tmp_path / "s.txt", tmp_path / "r.txt"
  source_nonblank.write_text("".join(s + "\n" for s, _ in pairs), encoding="utf-8")
  references.write_text("".join(t + "\n" for _, t in pairs), encoding="utf-8")
  trained = json.loads((reference / "train_result.json").read_text())
  searches = ("greedy-len5", "beam2-shrinking-a0.6-len5")  # TINY's max_len_offset=5
  names = [
    next((reference / "eval").glob(f"test_demo.test16.*_step{TOTAL}_{search}.hyp.txt")).name
    for search in searches
  ]
  want_hyps = [(reference / "eval" / name).read_text() for name in names]
  sample = {"decode.method": "sample", "decode.seed": 3}
  spec = {
    "workdir": str(reference),
    "overrides": _tiny_overrides(),
    "steps": [
      {"mode": "eval", "checkpoint": "latest"},
      {"mode": "translate", "input": str(source), "output": str(tmp_path / "out2")}
      | {"checkpoint": "latest"},
      {"mode": "translate", "input": str(source), "output": str(tmp_path / "s2")}
      | {"checkpoint": "latest", "nbest": 2, "overrides": sample},
      {"mode": "translate", "input": str(source), "output": str(tmp_path / "c2")}
      | {"checkpoint": "latest", "constraints": str(terms)},
      {"mode": "score", "input": str(source_nonblank), "reference": str(references)}
      | {"output": str(tmp_path / "sc2"), "checkpoint": "latest"},
      {"mode": "average", "num_checkpoints": 2, "checkpoint": "latest"},
    ],
  }
  (tmp_path / "spec.json").write_text(json.dumps(spec))
  job = cluster.launch(
    [str(tmp_path / "spec.json")],
    processes=2,
    devices=4,
    log_prefix=tmp_path / "p2",
    cache_dir=base / "jax_cache",
    script="tests/modes_main.py",
  )
  assert job.wait(TIMEOUT_S) == [0, 0], job.log()[-4000:]

  evaluation = json.loads((reference / "eval_result.json").read_text())
  assert [(reference / "eval" / name).read_text() for name in names] == want_hyps
  for key in ("test_sacrebleu_greedy", "test_sacrebleu_beam2", "test_tokenized_bleu_beam2"):
    assert evaluation[key] == pytest.approx(trained[key], abs=1e-6), key
  assert evaluation["test_sentences"] == trained["test_sentences"] == 16

  translations = (tmp_path / "out2").read_text().splitlines()
  one_process, _, _ = modes.translate_hypotheses(
    _in_process_config(), str(reference), "latest", lines
  )
  assert translations == [h[0].text for h in one_process]
  assert len(translations) == 4 and translations[1] == "" and all(translations[i] for i in (0, 2))

  # Sampled n-best lists: the same samples from 2 processes x 4 devices as from 1 x 8.
  config = _in_process_config()
  config.decode.method, config.decode.seed = "sample", 3
  outputs = modes.Outputs(nbest=2)
  sampled, _, _ = modes.translate_hypotheses(config, str(reference), "latest", lines, outputs)
  assert (tmp_path / "s2").read_text().splitlines() == modes.translation_lines(sampled, outputs)

  # Constrained translations and scores: as 1 process of 8 devices gives them.
  constrained, stats, _ = modes.translate_hypotheses(
    _in_process_config(),
    str(reference),
    "latest",
    lines,
    modes.Outputs(constraints=str(terms)),
    [["drei", "vierzig"], [], [], ["neun"]],
  )
  assert (tmp_path / "c2").read_text().splitlines() == [h[0].text for h in constrained]
  assert stats["constraints"]["term_rate"] == 1.0
  scores, _, _ = modes.score_pairs(
    _in_process_config(), str(reference), "latest", *map(list, zip(*pairs, strict=True))
  )
  rows = [r.split("\t") for r in (tmp_path / "sc2").read_text().splitlines()]
  assert [float(r[1]) for r in rows] == pytest.approx([s.log_prob for s in scores], abs=1e-5)
  assert [int(r[2]) for r in rows] == [s.tokens for s in scores]

  # Averaging under 2 processes: the mean of the last 2 checkpoints, written once.
  pointer = json.loads((reference / "averaged" / "latest.json").read_text())
  assert pointer["name"] == f"params_2_steps_{TOTAL - 4}_to_{TOTAL}"
  folder = reference / "averaged" / pointer["name"]
  with ocp.CheckpointManager(folder, item_names=("state", "data")) as manager:
    averaged = manager.restore(
      TOTAL, args=ocp.args.Composite(state=ocp.args.PyTreeRestore(), data=ocp.args.JsonRestore())
    )
  assert averaged["data"]["averaged_steps"] == [TOTAL - 4, TOTAL]
  last, before = (
    dict(_flat(_read_checkpoint(reference, s)[0]["params"])) for s in (TOTAL, TOTAL - 4)
  )
  for name, value in dict(_flat(averaged["state"]["params"])).items():
    np.testing.assert_allclose(value, (last[name] + before[name]) / 2, rtol=1e-6, err_msg=name)


def test_fine_tuning_under_two_processes_matches_one(base, reference, tmp_path):
  """config.init_from in a 2-process job: every process starts from the source's parameters (two
  steps later the whole state equals a 1-process, 8-device fine-tune's), and the source's
  vocabulary is copied and recorded once."""
  fine = [
    f"--config.init_from={reference}",
    "--config.num_train_steps=2",
    "--config.eval_every_steps=1000",
    "--config.optim.schedule=constant",
    "--config.optim.lr_scale=0.1",
  ]
  tiny = [f for f in TINY if not f.startswith(("--config.num_train_steps", "--config.eval_every"))]
  states = []
  for processes, devices in ((1, 8), (2, 4)):
    workdir = tmp_path / f"fine{processes}"
    job = cluster.launch(
      [f"--workdir={workdir}", *tiny, *fine],
      processes=processes,
      devices=devices,
      log_prefix=tmp_path / f"fine{processes}",
      cache_dir=base / "jax_cache",
    )
    assert job.wait(TIMEOUT_S) == [0] * processes, job.log()[-4000:]
    assert f"Starting from step{TOTAL} params" in job.log(), job.log()[-3000:]
    record = json.loads((workdir / "init_from.json").read_text())
    assert record["source_workdir"] == str(reference)
    assert (workdir / "spm.model").read_bytes() == (reference / "spm.model").read_bytes()
    states.append(_read_checkpoint(workdir, 2))
  (state_1, data_1), (state_2, data_2) = states
  assert int(state_1["step"]) == int(state_2["step"]) == 2
  assert data_1["streams"] == data_2["streams"]
  flat_1, flat_2 = dict(_flat(state_1)), dict(_flat(state_2))
  assert flat_1.keys() == flat_2.keys()
  for name, value in flat_1.items():
    np.testing.assert_allclose(flat_2[name], value, rtol=1e-4, atol=1e-5, err_msg=name)
  # Two small steps from the source: close to its parameters, not to a fresh initialisation.
  source = dict(_flat(_read_checkpoint(reference, TOTAL)[0]["params"]))
  moved = max(np.max(np.abs(flat_1[f"/params{k}"] - v)) for k, v in source.items())
  assert moved < 0.05, moved
