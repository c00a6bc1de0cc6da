"""LoRA fine-tuning (config.optim.lora_rank, training/lora.py) from the shared trained demo.

What issue 62 asks of it: only the adapters train (checked leaf by leaf), the frozen weights hold
no optimizer state, a run's saved parameters are the merged model that every other mode reads,
averaging LoRA checkpoints averages their merged kernels (the mean of B.A, not of A and B),
CTranslate2's export translates as the merged model, and stopping and resuming is bitwise the
uninterrupted run (killed with SIGKILL: tests/e2e/test_resume.py).
"""

from __future__ import annotations

import shutil

import jax
import numpy as np
import pytest
from flax import traverse_util

from flaxformer_nmt import api, errors, modes
from flaxformer_nmt.checkpoints import averaging, reader
from flaxformer_nmt.data import demo
from flaxformer_nmt.data import pipeline as data_lib
from flaxformer_nmt.data.tokenizer import Tokenizer
from flaxformer_nmt.decoding.session import Session
from flaxformer_nmt.run.components import Components
from flaxformer_nmt.run.folder import Workdir
from flaxformer_nmt.runtime import parallel
from flaxformer_nmt.training import init_from, lora
from flaxformer_nmt.training import loop as train
from flaxformer_nmt.training.state import TrainSetup
from flaxformer_nmt.training.trainer import Trainer

import helpers

_RANK, _ALPHA, _TARGETS = 4, 8.0, "q,v,ffn_in"


def _lora_config(source, **overrides):
  """helpers.fine_tune_config with rank-4 adapters on q, v and the FFN's first matrix, at a rate
  of 0.0088 from the first step (no warmup): adapters start at B = 0 and must move in 6 steps."""
  fields = dict(optim__lora_rank=_RANK, optim__lora_alpha=_ALPHA, optim__lora_targets=_TARGETS)
  config = helpers.fine_tune_config(source, **{**fields, **overrides})
  config.optim.lr_scale, config.optim.warmup_steps = 0.1, 1
  return config


def _flat(tree):
  return traverse_util.flatten_dict(jax.device_get(tree))


def test_only_the_adapters_train_and_the_saved_params_are_the_merged_model(trained_demo, tmp_path):
  _, trained = trained_demo
  source, work = tmp_path / "source", tmp_path / "lora"
  shutil.copytree(trained, source)
  config = _lora_config(source, num_train_steps=3, checkpoint_every_steps=3)
  run = Workdir(str(work))
  src = init_from.check(config, run)
  work.mkdir()
  components = Components(config, Tokenizer(src.vocabulary))
  init_from.adopt_vocabulary(config, run, src)
  data = data_lib.make_data(config, run, 8, 0, 1, tokenizer=components.tokenizer)
  wanted, _ = helpers.load_params(config, source, "latest")
  wanted = _flat(wanted)
  s = _ALPHA / _RANK
  with Trainer(TrainSetup(components), data, run, None, src) as trainer:
    start = parallel.local_replica(trainer.p_state)
    # Step 0 is the source model bit for bit (B = 0), W0 its targeted kernels.
    helpers.assert_trees_equal(start.params, traverse_util.unflatten_dict(wanted))
    base = _flat(start.lora.base)
    targeted = sorted(base)
    assert len(targeted) == 2 * 3 + 2 * (2 * 2 + 1)  # 2 layers: q, v, wi; decoders: 2 attentions
    assert {p[-1] for p in targeted} == {"query", "value", "kernel"}
    for path in targeted:
      assert base[path].tobytes() == wanted[path].tobytes()
    # Adam's moments exist for the adapters only: two per adapter scalar, nothing for W0.
    moments = sum(x.size for x in jax.tree.leaves(start.opt_state) if np.ndim(x) > 0)
    assert moments == 2 * lora.count(start.lora.adapters)
    assert lora.count(start.lora.adapters) < 0.1 * lora.count(start.params)
    for _ in range(3):
      trainer.train_step()
    trainer.flush()
    end = parallel.local_replica(trainer.p_state)
    trainer.save(force=True, check_clock=False)
    trainer.checkpoints.wait_until_finished()
  params, adapters = _flat(end.params), _flat(end.lora.adapters)
  helpers.assert_trees_equal(end.lora.base, start.lora.base)
  for path, value in params.items():
    if path in base:  # merged: W0 + s * A @ B, and moved
      merged = base[path] + s * adapters[path + ("a",)] @ adapters[path + ("b",)]
      np.testing.assert_allclose(value, merged, atol=1e-6)
      assert not np.array_equal(value, wanted[path]), path
    else:  # frozen, bit for bit
      assert value.tobytes() == wanted[path].tobytes(), path
  for path, value in _flat(start.lora.adapters).items():
    assert not np.array_equal(value, adapters[path]), path  # every A and B moved
  # What eval, translate, export and init_from read is the merged model.
  saved, description = helpers.load_params(config, work, "latest")
  assert description.startswith("step3")
  helpers.assert_trees_equal(saved, end.params)
  # CTranslate2's export is the merged model too: greedy, line for line our output.
  import ctranslate2  # pylint: disable=g-import-not-at-top  # the [test] extra has it
  import sentencepiece as spm  # pylint: disable=g-import-not-at-top

  out = tmp_path / "ct2"
  modes.export(config, str(work), "latest", "ctranslate2", str(out), "float32")
  sources = [s for s, _ in demo.make_demo_split("test", 12, 0)]
  ours = Session(components, end.params).translate_with(sources, 1)
  sp = spm.SentencePieceProcessor(model_file=str(out / "spm.model"))
  translator = ctranslate2.Translator(str(out), device="cpu")
  for line, want in zip(sources, ours, strict=True):
    pieces = sp.encode(line, out_type=str)
    cap = len(pieces) + 1 + config.decode.max_len_offset  # our output cap
    (result,) = translator.translate_batch([pieces], beam_size=1, max_decoding_length=cap)
    assert sp.decode(result.hypotheses[0]).strip() == want  # ours strips (data/tokenizer.py)
  assert len(set(ours)) > 1
  # ...and not the source's: 3 steps moved the output, so unmerged kernels would show.
  source_params = traverse_util.unflatten_dict(wanted)
  assert Session(components, source_params).translate_with(sources, 1) != ours


def test_averaging_lora_checkpoints_averages_the_merged_kernels(trained_demo, tmp_path):
  """The mean of W0 + s * A_i @ B_i over checkpoints, from each checkpoint's own adapters; the
  mean of the A's times the mean of the B's is another (wrong) model, and is far from it."""
  _, trained = trained_demo
  work = tmp_path / "lora"
  config = _lora_config(trained, num_train_steps=6, checkpoint_every_steps=2)
  assert train.train_and_evaluate(config, Workdir(str(work)))["step"] == 6
  run = Workdir(str(work))
  components = Components.load(config, run)
  steps = [2, 4, 6]
  mean = _flat(averaging.average(run.checkpoints, steps, components.abstract_params, ("params",)))
  template = TrainSetup(components).abstract_state()
  states = [
    reader.CheckpointDir(run.checkpoints).read(step, reader.state_dict(template))[0]
    for step in steps
  ]
  s = _ALPHA / _RANK
  a_mean = b_mean = None
  for path in _flat(states[0]["lora"]["base"]):
    w0 = _flat(states[0]["lora"]["base"])[path].astype(np.float64)
    pairs = [
      (_flat(st["lora"]["adapters"])[path + ("a",)], _flat(st["lora"]["adapters"])[path + ("b",)])
      for st in states
    ]
    products = np.mean([a.astype(np.float64) @ b for a, b in pairs], axis=0)
    # float32 rounding of each merged kernel and of the mean: a few 1e-8.
    np.testing.assert_allclose(mean[path], w0 + s * products, rtol=0, atol=1e-7)
    a_mean = np.mean([a for a, _ in pairs], axis=0)
    b_mean = np.mean([b for _, b in pairs], axis=0)
    assert np.abs(mean[path] - (w0 + s * a_mean @ b_mean)).max() > 1e-5
  assert a_mean is not None and b_mean is not None
  # An average has no rank-r factors: --format=peft refuses it ("auto" resolves to it now),
  # before anything is written.
  modes.average(None, str(work), 3)
  out = tmp_path / "adapters"
  for which in ("auto", "averaged"):
    with pytest.raises(errors.ConfigError, match="averaged parameters, merged"):
      modes.export(None, str(work), which, "peft", str(out), "float32")
  assert not out.exists()


def test_a_stopped_and_resumed_lora_run_is_the_uninterrupted_run_bitwise(trained_demo, tmp_path):
  _, trained = trained_demo
  whole, split = Workdir(str(tmp_path / "whole")), Workdir(str(tmp_path / "split"))
  config = _lora_config(trained, num_train_steps=6, checkpoint_every_steps=3)
  assert train.train_and_evaluate(config, whole)["step"] == 6
  first = _lora_config(trained, num_train_steps=3, checkpoint_every_steps=3)
  assert train.train_and_evaluate(first, split)["step"] == 3
  assert train.train_and_evaluate(config, split)["step"] == 6
  components = Components.load(config, whole)
  template = reader.state_dict(TrainSetup(components).abstract_state())
  a = reader.CheckpointDir(whole.checkpoints).read(6, template)[0]
  b = reader.CheckpointDir(split.checkpoints).read(6, template)[0]
  assert set(a) >= {"params", "opt_state", "lora"}
  helpers.assert_trees_equal(a, b)
  # Translate from the command line and through the API (what the server loads too) on the LoRA
  # run: its merged parameters, the same lines.
  session = api.load(str(whole.path), checkpoint="latest", overrides={"decode.beam_size": 1})
  helpers.assert_trees_equal(jax.device_get(session.params), a["params"])
  lines = [s for s, _ in demo.make_demo_split("test", 6, 0)]
  (tmp_path / "in.txt").write_text("\n".join(lines) + "\n")
  proc = helpers.run_main(
    f"--workdir={whole.path}",
    "--mode=translate",
    "--checkpoint=latest",
    "--config.decode.beam_size=1",
    f"--input={tmp_path / 'in.txt'}",
    "--output=-",
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert proc.stdout.splitlines()[: len(lines)] == session.translate(lines)
