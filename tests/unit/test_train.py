"""Training set-up in process, without the training loop: bad config values refused before any
work, the inference modes reading no corpus, the learning rate logged for skipped updates.
tests/e2e/test_train.py trains."""

import functools
import json
import re

import jax
import jax.numpy as jnp
import model_params
import numpy as np
import pytest

from flaxformer_nmt import api, errors, modes
from flaxformer_nmt.config import builders as config_lib
from flaxformer_nmt.model import losses
from flaxformer_nmt.model.transformer import Transformer, TransformerConfig
from flaxformer_nmt.run.components import Components
from flaxformer_nmt.run.folder import Workdir
from flaxformer_nmt.training import optim, steps

import helpers


@pytest.mark.parametrize(
  "field,value,message",
  [
    ("num_train_steps", 0, "config.num_train_steps must be >= 1"),
    ("label_smoothing", 1.0, "config.label_smoothing must be in [0, 1)"),
  ],
)
def test_bad_config_values_fail_before_any_work(tmp_path, field, value, message):
  c = config_lib.base_config("tiny")
  c[field] = value
  with pytest.raises(errors.ConfigError, match=re.escape(message)):
    modes.train(c, str(tmp_path / "w"))  # the entry of the command and of the API
  assert not (tmp_path / "w").exists()  # nothing was created


def test_average_and_translate_read_no_corpus(saved_run, tmp_path):
  """Modes that need only the vocabulary and a checkpoint work with the corpus gone: the run
  says it trained on files in a folder that no longer exists."""
  _, workdir = saved_run
  saved = json.loads((workdir / "config.json").read_text())
  saved["data"].update(source="files", dir=str(tmp_path / "gone"))
  (workdir / "config.json").write_text(json.dumps(saved, indent=2))
  overrides = {**helpers.saved_run_overrides(), "data.source": "files"}
  c = api.load_config("demo", {**overrides, "data.dir": str(tmp_path / "gone")})
  components = Components.load(c, Workdir(str(workdir)))
  assert components.tokenizer.vocab_size == c.data.vocab_size
  modes.average(None, str(workdir), 2)
  assert json.loads((workdir / "average_result.json").read_text())["steps"] == [8, 12]
  (tmp_path / "in.txt").write_text("three hundred and five\n\ntwelve\n")
  modes.translate(None, str(workdir), "auto", str(tmp_path / "in.txt"), str(tmp_path / "out.txt"))
  out = (tmp_path / "out.txt").read_text().split("\n")
  assert len(out) == 4 and out[1] == "" and out[3] == ""
  assert [out[0], out[2]] == api.translate(c, str(workdir), ["three hundred and five", "twelve"])


def test_skipped_updates_log_the_learning_rate_actually_applied(monkeypatch):
  """With skip_nonfinite, a skipped update leaves Adam's count (and so the schedule) behind the
  step counter; the logged rate is the one the next update applies, schedule(count)."""
  poison = 63  # a target id that makes the loss NaN: the "bad batch"
  real_loss = losses.label_smoothed_cross_entropy

  def loss_with_poison(logits, targets, weights, smoothing):
    loss_sum, nll_sum, tokens = real_loss(logits, targets, weights, smoothing)
    return jnp.where(jnp.any(targets == poison), jnp.nan, loss_sum), nll_sum, tokens

  monkeypatch.setattr(losses, "label_smoothed_cross_entropy", loss_with_poison)
  c = helpers.narrow(config_lib.base_config("tiny"))
  cfg = TransformerConfig.from_config(c.model, 64)
  c.optim.warmup_steps = 4
  tx, schedule = optim.make_optimizer(c.optim, cfg.d_model)
  state = steps.create_train_state(model_params.random_params(cfg), tx, jax.random.PRNGKey(1))
  step = jax.pmap(
    functools.partial(
      steps.train_step, model=Transformer(cfg), tx=tx, schedule=schedule, label_smoothing=0.1,
      axis_name="batch", skip_nonfinite=True,
    ),
    axis_name="batch",
    devices=jax.local_devices()[:1],
  )  # fmt: skip
  good = {k: np.full((1, 2, 8), 5, np.int32) for k in ("inputs", "targets")}
  bad = dict(good, targets=np.full_like(good["targets"], poison))
  p_state = jax.tree.map(lambda x: np.asarray(x)[None], state)  # [1 device, ...]
  rates = []
  for batch in (bad, good, good):
    p_state, metrics = step(p_state, batch)
    rates.append((float(metrics["nonfinite"][0]), float(metrics["learning_rate"][0])))
  assert [r[0] for r in rates] == [1.0, 0.0, 0.0] and int(p_state.step[0]) == 3
  # Updates applied before each step: 0, 0 (the first was skipped), 1.
  expected = [float(schedule(n)) for n in (0, 0, 1)]
  np.testing.assert_allclose([r[1] for r in rates], expected, rtol=1e-6)
  assert expected[1] != float(schedule(1))  # what the step counter would have said
