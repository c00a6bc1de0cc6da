"""float16 training with a dynamic loss scale (training/loss_scale.py), what model.dtype="auto"
picks on each kind of device, float16 decoding, and checkpoints with and without a loss scale.

XLA's CPU emulates float16, so these run the narrow one-layer model on a fixed batch for a few
steps. The kill -9 resume and the 2 x 4 = 1 x 8 runs in float16 are end-to-end tests
(tests/e2e/test_resume.py, test_multiprocess.py)."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import model_params
import numpy as np
import pytest
from flax import traverse_util

from flaxformer_nmt import api, errors
from flaxformer_nmt.config import builders as config_lib
from flaxformer_nmt.model import losses
from flaxformer_nmt.model.transformer import Transformer, TransformerConfig
from flaxformer_nmt.run.components import Components
from flaxformer_nmt.run.folder import Workdir
from flaxformer_nmt.runtime import parallel
from flaxformer_nmt.training import lora, loss_scale, optim, steps
from flaxformer_nmt.training import metrics as metrics_lib
from flaxformer_nmt.training import state as state_lib

import checkpoint_states
import helpers

VOCAB = 64


# ------------------------------------------------------------------------ what "auto" picks


@dataclasses.dataclass
class _FakeDevice:
  platform: str
  compute_capability: str | None = None


@pytest.mark.parametrize(
  ("device", "expected"),
  [
    (_FakeDevice("cpu"), "float32"),
    (_FakeDevice("tpu"), "bfloat16"),
    (_FakeDevice("gpu", "7.5"), "float16"),  # T4 (Colab's free GPU)
    (_FakeDevice("gpu", "7.0"), "float16"),  # V100
    (_FakeDevice("gpu", "6.0"), "float16"),  # P100
    (_FakeDevice("gpu", "8.0"), "bfloat16"),  # A100
    (_FakeDevice("gpu", "8.9"), "bfloat16"),  # L4
    (_FakeDevice("gpu", "9.0"), "bfloat16"),  # H100, H200
    (_FakeDevice("gpu", "10.0"), "bfloat16"),  # B200
    (_FakeDevice("gpu", None), "bfloat16"),  # ROCm: no CUDA capability; MI200/MI300 do bfloat16
    (_FakeDevice("gpu", "unknown"), "float32"),  # unreadable: the safe choice
  ],
)
def test_auto_dtype_per_device_kind(monkeypatch, device, expected):
  """jax.devices() replaced by a device of each kind, with the `platform` and
  `compute_capability` attributes JAX's CUDA devices carry."""
  monkeypatch.setattr(jax, "devices", lambda *a, **k: [device])
  assert parallel.auto_dtype() == expected
  said = api.precision()  # what the notebook prints
  assert said["dtype"] == expected and said["loss_scale"] == (expected == "float16")
  assert said["platform"] == device.platform


# ------------------------------------------------------------------------ the scale's rule


def _scale(value: float, good: int = 0, skipped: int = 0) -> loss_scale.LossScale:
  return loss_scale.LossScale(jnp.float32(value), jnp.int32(good), jnp.int32(skipped))


def _fields(s: loss_scale.LossScale) -> tuple[float, int, int]:
  return float(s.scale), int(s.good_steps), int(s.skipped_steps)


def test_the_scale_halves_on_overflow_and_doubles_after_the_period():
  yes, no = jnp.array(True), jnp.array(False)
  s = _scale(1024.0, good=2)
  assert _fields(loss_scale.next_state(s, no, yes, period=3)) == (512.0, 0, 1)  # overflow
  assert _fields(loss_scale.next_state(s, yes, no, period=3)) == (2048.0, 0, 0)  # 3rd finite
  assert _fields(loss_scale.next_state(_scale(1024.0), yes, no, period=3)) == (1024, 1, 0)
  # Not finite, not an overflow (a NaN loss, skipped under skip_nonfinite): the scale stays.
  assert _fields(loss_scale.next_state(s, no, no, period=3)) == (1024.0, 0, 1)
  # What an overflow is: a finite loss, a gradient that is not, a scale above the floor.
  assert bool(loss_scale.overflowed(s, loss_finite=yes, grads_finite=no))
  assert not bool(loss_scale.overflowed(s, loss_finite=no, grads_finite=no))
  floor = _scale(loss_scale.MIN_SCALE)
  assert not bool(loss_scale.overflowed(floor, loss_finite=yes, grads_finite=no))
  # Bounded: never below the floor, nor above 2^24.
  assert _fields(loss_scale.next_state(floor, no, yes, 3))[0] == loss_scale.MIN_SCALE
  top = loss_scale.next_state(_scale(2.0**24, good=2), yes, no, period=3)
  assert float(top.scale) == 2.0**24


# ------------------------------------------------------------------------ the train step


def _narrow_config(dtype: str, **optim_fields):
  c = helpers.narrow(config_lib.base_config("tiny"))
  c.model.update(dtype=dtype, dropout_rate=0.0)  # no dropout: the curves compare precision only
  c.optim.update(warmup_steps=100, **optim_fields)
  return c


def _pmapped_run(
  c, devices: int = 1, accumulate_steps: int = 1, lora_targets=(), skip_nonfinite: bool = False
):
  """(step function, replicated initial state) of the narrow model under config `c`; with
  `lora_targets`, a LoRA run of rank 2 on them (B nonzero, so that the first step's gradient
  reaches A as well), its adapters merged with scale 1."""
  cfg = TransformerConfig.from_config(c.model, VOCAB)
  tx, schedule = optim.make_optimizer(c.optim, cfg.d_model)
  scale = loss_scale.initial(c.optim) if c.model.dtype == "float16" else None

  def make(params, rng):
    if not lora_targets:
      return steps.create_train_state(params, tx, rng, scale)
    adapters = lora.init(params, 2, list(lora_targets), jax.random.PRNGKey(2))
    adapters = adapters.replace(adapters=jax.tree.map(lambda x: x + 0.01, adapters.adapters))
    return steps.create_train_state(lora.merged(params, adapters, 1.0), tx, rng, scale, adapters)

  # In one program (eagerly, Adam's zeros would be one each). The parameters are drawn on the
  # host from init_params' distributions (tests/model_params.py): the initializer compiled with
  # the state cost up to 3.5 s per config from an empty cache.
  state = jax.jit(make)(model_params.random_params(cfg), jax.random.PRNGKey(1))
  step = helpers.pmapped_train_step(
    Transformer(cfg),
    tx,
    schedule,
    devices,
    accumulate_steps=accumulate_steps,
    skip_nonfinite=skip_nonfinite,
    loss_scale_period=int(c.optim.loss_scale_period),
    lora_scale=1.0,
  )
  replicated = jax.tree.map(lambda x: np.stack([np.asarray(x)] * devices), state)
  return step, replicated


def _batch(devices: int, rows: int = 4, length: int = 12) -> dict[str, np.ndarray]:
  tokens = np.random.default_rng(0).integers(3, VOCAB, (devices, rows, length)).astype(np.int32)
  return {"inputs": tokens, "targets": tokens}  # a copy task


def _losses(dtype: str, n: int) -> tuple[np.ndarray, dict]:
  step, state = _pmapped_run(_narrow_config(dtype))
  batch, out = _batch(1), []
  for _ in range(n):
    state, metrics = step(state, batch)
    out.append(float(metrics["loss_sum"][0] / metrics["tokens"][0]))
  return np.array(out), jax.tree.map(lambda x: np.asarray(x)[0], metrics)


@pytest.mark.slow  # over 10 s cold (docs/developing.md)
def test_float16_trains_as_float32_does_within_tolerance():
  """30 steps of the narrow model on one copy-task batch (loss 3.9 -> about 0.8): float16's
  loss curve stays within 0.01 of float32's (measured: 0.0010; bfloat16's: 0.0032), and no step
  overflowed at the default scale."""
  f32, _ = _losses("float32", 30)
  f16, last = _losses("float16", 30)
  assert f32[-1] < 0.6 * f32[0]  # it learned: the comparison is not of two flat lines
  np.testing.assert_allclose(f16, f32, atol=0.01)
  assert last["loss_scale"] == 2.0**15 and last["skipped_steps_total"] == 0
  assert last["overflow"] == 0 and last["nonfinite"] == 0


@pytest.mark.parametrize("accumulate_steps", [1, 2])
def test_an_overflow_skips_the_update_on_every_device_and_halves_the_scale(accumulate_steps):
  """A scale of 2^24 overflows float16's cotangents (a real overflow, nothing injected): the
  update is skipped on both devices alike (parameters, Adam's moments and count as they were),
  the step and the data move on, the scale halves, and it is counted as skipped, not as an
  error. Then, at a sane scale, two finite steps double it (period 2)."""
  c = _narrow_config("float16", loss_scale_init=2.0**24, loss_scale_period=2)
  pmapped, start = _pmapped_run(c, devices=2, accumulate_steps=accumulate_steps)
  # Each step's state and metrics on the host: the checks below index them in Python (on device
  # arrays, each index is a program of its own).
  step = lambda state, batch: jax.device_get(pmapped(state, batch))
  start = jax.device_get(start)
  batch = _batch(2)
  after, metrics = step(start, batch)
  for name in ("params", "opt_state"):
    checkpoint_states.assert_bitwise_equal(getattr(after, name), getattr(start, name))
  assert list(after.step) == [1, 1]
  assert list(after.loss_scale.scale) == [2.0**23] * 2
  assert list(after.loss_scale.skipped_steps) == [1, 1]
  assert list(metrics["overflow"]) == [1.0, 1.0] and list(metrics["nonfinite"]) == [0.0, 0.0]
  assert list(metrics["loss_scale"]) == [2.0**24] * 2  # the scale the step ran with

  sane = after.replace(loss_scale=after.loss_scale.replace(scale=np.full(2, 2.0**10, np.float32)))
  grown, metrics = step(sane, batch)
  assert list(grown.loss_scale.scale) == [2.0**10] * 2
  assert list(grown.loss_scale.good_steps) == [1, 1]
  moved = [
    not np.array_equal(a, b) for a, b in zip(*map(jax.tree.leaves, (grown, sane)), strict=True)
  ]
  assert any(moved)  # this update was applied
  grown, metrics = step(grown, batch)
  assert list(grown.loss_scale.scale) == [2.0**11] * 2  # two finite steps in a row: doubled
  assert list(grown.loss_scale.good_steps) == [0, 0]
  assert list(grown.loss_scale.skipped_steps) == [1, 1] and list(metrics["overflow"]) == [0, 0]
  leaves = jax.tree.leaves(grown)
  assert all(np.array_equal(leaf[0], leaf[1]) for leaf in leaves)  # the replicas agree


def test_a_nan_loss_in_float16_is_a_nonfinite_step_not_an_overflow(monkeypatch):
  """A loss that is NaN in the forward pass (the "bad batch" of test_train.py) is no overflow:
  the step is flagged non-finite (the trainer stops on it, or skips it under skip_nonfinite), the
  update is skipped and counted, and the scale stays where it was."""
  poison = 63
  real_loss = losses.label_smoothed_cross_entropy

  def loss_with_poison(logits, targets, weights, smoothing):
    loss_sum, nll_sum, tokens = real_loss(logits, targets, weights, smoothing)
    return jnp.where(jnp.any(targets == poison), jnp.nan, loss_sum), nll_sum, tokens

  monkeypatch.setattr(losses, "label_smoothed_cross_entropy", loss_with_poison)
  step, start = _pmapped_run(_narrow_config("float16", loss_scale_init=1024.0))
  batch = _batch(1)
  bad = dict(batch, targets=np.full_like(batch["targets"], poison))
  after, metrics = step(start, bad)
  assert float(metrics["nonfinite"][0]) == 1.0 and float(metrics["overflow"][0]) == 0.0
  assert float(after.loss_scale.scale[0]) == 1024.0 and int(after.loss_scale.skipped_steps[0]) == 1
  checkpoint_states.assert_bitwise_equal(after.params, start.params)


def test_a_log_line_ending_on_an_overflow_reports_finite_figures():
  """train_metrics.jsonl after a window whose last step overflowed: the gradient norm is the last
  applied update's (not inf), the loss that of every step's forward pass, the skip counted."""
  step = dict(tokens=10.0, source_tokens=9.0, learning_rate=1e-3, param_norm=5.0, nonfinite=0.0)
  history = [
    dict(step, loss_sum=20.0, nll_sum=18.0, grad_norm=0.5, overflow=0.0, loss_scale=2048.0),
    dict(step, loss_sum=22.0, nll_sum=19.0, grad_norm=np.inf, overflow=1.0, loss_scale=4096.0),
  ]
  for m, total in zip(history, (0.0, 1.0), strict=True):
    m["skipped_steps_total"] = total
  summary = metrics_lib.summarize_train(history, seconds=2.0)
  assert summary["grad_norm"] == 0.5 and summary["loss"] == 2.1 and summary["nll"] == 1.85
  assert summary["skipped_steps"] == 1.0 and summary["skipped_steps_total"] == 1.0
  assert summary["loss_scale"] == 4096.0  # the scale the last step ran with
  assert all(np.isfinite(v) for v in summary.values())


# ------------------------------------------------------------------------ checkpoints


def test_float16_state_round_trips_through_a_checkpoint(tmp_path):
  state = checkpoint_states.make_state(0, step=5)
  state = state.replace(loss_scale=jax.device_get(_scale(4096.0, good=7, skipped=3)))
  with checkpoint_states.new_ckpt(tmp_path / "ckpt") as ckpt:
    assert ckpt.save(5, lambda: (state, {}), force=True)
    ckpt.wait_until_finished()
    restored, _, step = ckpt.restore(checkpoint_states.abstract(state))
  assert step == 5 and _fields(restored.loss_scale) == (4096.0, 7, 3)
  checkpoint_states.assert_bitwise_equal(restored, state)


def test_a_checkpoint_saved_before_float16_restores(saved_run):
  """The committed trained run (saved before the train state had a loss scale) restores into
  today's train state, whose float32 layout is unchanged (no loss_scale field is stored)."""
  config, workdir = saved_run
  components = Components.load(config, Workdir(str(workdir)))
  setup = state_lib.TrainSetup(components)
  assert not setup.scales_loss
  with checkpoint_states.new_ckpt(workdir / "checkpoints") as ckpt:
    restored, data, step = ckpt.restore(setup.abstract_state())
  assert step == 12 and int(restored.step) == 12 and restored.loss_scale is None
  assert "streams" in data


def test_a_float32_run_does_not_resume_in_float16(saved_run):
  """Built in process (the API, tests), where the command line's config check does not stand
  between: the checkpoints' own layout (no loss scale) refuses float16 before any data is read."""
  config, workdir = saved_run
  config.model.dtype = "float16"
  components = Components.load(config, Workdir(str(workdir)))
  with pytest.raises(errors.CheckpointMismatchError, match="were saved in float32 or bfloat16"):
    state_lib.check_resume_fits(config, Workdir(str(workdir)), components)
  config.model.dtype = "float32"
  state_lib.check_resume_fits(
    config, Workdir(str(workdir)), Components.load(config, Workdir(str(workdir)))
  )


# ------------------------------------------------------------------------ decoding


def test_float16_decoding_scores_in_float32_and_agrees_with_float32(saved_run):
  """The float32-trained run decoded in float16 (model.dtype is free for decoding commands):
  finite scores, close to float32's, and mostly the same translations."""
  config, workdir = saved_run
  lines = ["three hundred and five", "twelve", "forty one", "nine hundred and ninety nine"]
  half = config.copy_and_resolve_references()
  half.model.dtype = "float16"
  ours = api.translate_nbest(config, str(workdir), lines, nbest=2)
  theirs = api.translate_nbest(half, str(workdir), lines, nbest=2)
  scores = np.array([[h.score for h in row] for row in theirs])
  assert np.isfinite(scores).all()
  same = [a[0].text == b[0].text for a, b in zip(ours, theirs, strict=True)]
  assert sum(same) >= len(lines) - 1, (ours, theirs)
  for a, b in zip(ours, theirs, strict=True):
    if a[0].text == b[0].text:
      assert abs(a[0].score - b[0].score) < 0.05


def _lora_run(c, accumulate_steps: int, skip_nonfinite: bool = False):
  """A LoRA run (q and v) on 2 devices, its states and metrics on the host."""
  step, state = _pmapped_run(c, 2, accumulate_steps, ("q", "v"), skip_nonfinite)
  return lambda s, b: jax.device_get(step(s, b)), jax.device_get(state)


@pytest.mark.slow  # over 10 s cold (docs/developing.md)
def test_a_lora_runs_overflow_keeps_its_adapters_and_its_accumulated_step_is_the_whole_batchs():
  """LoRA with float16's loss scale and with accumulation (#62 left them untested): an overflow
  skips the adapters' update and their Adam moments as it does a full run's; a finite float16
  step moves only the adapters and the kernels they merge into; and 2 micro-batches give the
  update of one whole batch."""
  c = _narrow_config("float16", loss_scale_init=2.0**24, loss_scale_period=2)
  step, start = _lora_run(c, accumulate_steps=2)
  batch = _batch(2)
  after, metrics = step(start, batch)
  assert list(metrics["overflow"]) == [1.0, 1.0]
  for name in ("params", "opt_state", "lora"):
    checkpoint_states.assert_bitwise_equal(getattr(after, name), getattr(start, name))
  sane = after.replace(loss_scale=after.loss_scale.replace(scale=np.full(2, 2.0**10, np.float32)))
  moved, metrics = step(sane, batch)
  assert list(metrics["overflow"]) == [0.0, 0.0] and list(metrics["nonfinite"]) == [0.0, 0.0]
  checkpoint_states.assert_bitwise_equal(moved.lora.base, sane.lora.base)  # W0 stays frozen
  flat_new = traverse_util.flatten_dict(moved.params)
  flat_old = traverse_util.flatten_dict(sane.params)
  changed = {k for k in flat_new if not np.array_equal(flat_new[k], flat_old[k])}
  targeted = {k for k in flat_new if k[-1] in ("query", "value")}
  assert changed and changed <= targeted  # only the merged q and v kernels moved

  f32 = _narrow_config("float32")
  whole_step, whole = _lora_run(f32, accumulate_steps=1)
  split_step, split = _lora_run(f32, accumulate_steps=2)
  whole, m1 = whole_step(whole, batch)
  split, m2 = split_step(split, batch)
  np.testing.assert_allclose(m2["grad_norm"], m1["grad_norm"], rtol=1e-5)
  close = lambda a, b: np.testing.assert_allclose(
    a, b, rtol=1e-4, atol=1e-3 * float(np.abs(b).max()) + 1e-12
  )
  jax.tree.map(close, split.lora.adapters, whole.lora.adapters)
  jax.tree.map(close, split.opt_state, whole.opt_state)


def test_a_lora_runs_nan_loss_is_skipped_under_skip_nonfinite(monkeypatch):
  """A NaN loss in a float32 LoRA run with optim.skip_nonfinite: the adapters, their moments and
  the merged kernels are kept, and the step is counted as non-finite."""
  real = steps._forward  # pylint: disable=protected-access

  def nan_forward(*args, **kwargs):
    return real(*args, **kwargs) * jnp.nan

  monkeypatch.setattr(steps, "_forward", nan_forward)
  step, start = _lora_run(_narrow_config("float32"), accumulate_steps=1, skip_nonfinite=True)
  after, metrics = step(start, _batch(2))
  assert list(metrics["nonfinite"]) == [1.0, 1.0]
  for name in ("params", "opt_state", "lora"):
    checkpoint_states.assert_bitwise_equal(getattr(after, name), getattr(start, name))
  assert list(after.step) == [1, 1]
