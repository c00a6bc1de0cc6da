"""The pmapped step gives the same result on 8 devices as on 1 for the same global batch."""

import functools

import jax
import model_params
import numpy as np
import optax
import pytest

from flaxformer_nmt.config import builders as config_lib
from flaxformer_nmt.model.transformer import Transformer, TransformerConfig
from flaxformer_nmt.runtime import parallel
from flaxformer_nmt.training import optim, steps

import helpers


def _packed_batch(rows: int, length: int, vocab: int) -> dict[str, np.ndarray]:
  """Rows with uneven real lengths, so shards hold different token counts."""
  rs = np.random.RandomState(0)
  batch = {k: rs.randint(3, vocab, (rows, length)).astype(np.int32) for k in ("inputs", "targets")}
  for r in range(rows):
    batch["inputs"][r, rs.randint(3, length) :] = 0
    batch["targets"][r, rs.randint(2, length) :] = 0
  return batch


def _pmap_train_step(devices, **static):
  """`parallel.pmap_train_step` (which takes every local device) on the given `devices`."""
  return jax.pmap(
    functools.partial(steps.train_step, axis_name=parallel.AXIS, **static),
    axis_name=parallel.AXIS,
    devices=devices,
    donate_argnums=(0,),
  )


def test_eight_devices_equal_one_device():
  assert jax.local_device_count() == 8, "tests/conftest.py should provide 8 CPU devices"
  c = helpers.narrow(config_lib.base_config("tiny"))
  c.model.dropout_rate = 0.0  # dropout masks differ per device layout; everything else must not
  cfg = TransformerConfig.from_config(c.model, 64)
  model = Transformer(cfg)
  # Plain SGD with rate 1: the update *is* the gradient, so any cross-device error shows in the
  # parameters at full size (Adam would hide a scale error and magnify rounding on ~0 gradients).
  tx, schedule = optax.sgd(1.0), optim.paper_schedule(cfg.d_model, c.optim.warmup_steps)
  state = steps.create_train_state(model_params.random_params(cfg), tx, jax.random.PRNGKey(1))
  batches = [_packed_batch(16, 12, 64) for _ in range(2)]
  results = {}
  for n in (1, 8):
    devices = jax.local_devices()[:n]
    step = _pmap_train_step(devices, model=model, tx=tx, schedule=schedule, label_smoothing=0.1)
    p_state = parallel.replicate(state, devices)
    for batch in batches:
      p_state, metrics = step(p_state, parallel.shard(batch, n))
    results[n] = (parallel.local_replica(p_state), parallel.local_replica(metrics))
  (s1, m1), (s8, m8) = results[1], results[8]
  np.testing.assert_allclose(m1["loss_sum"], m8["loss_sum"], rtol=1e-5)
  assert m1["tokens"] == m8["tokens"]
  # Adam is invariant to a gradient's scale, so compare the gradient itself (via its norm) too.
  np.testing.assert_allclose(m1["grad_norm"], m8["grad_norm"], rtol=1e-5)
  assert int(s1.step) == int(s8.step) == 2
  jax.tree.map(
    lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6), s1.params, s8.params
  )
  # And the update did something: parameters moved away from the initial ones.
  moved = jax.tree.map(lambda a, b: float(np.abs(a - b).max()), s1.params, state.params)
  assert max(jax.tree.leaves(moved)) > 1e-4


def test_shard_rejects_uneven_split():
  import pytest

  with pytest.raises(ValueError, match="cannot be split over 8 devices"):
    parallel.shard({"inputs": np.zeros((12, 4), np.int32)}, 8)


def _run_steps(state, batches, tx, model, devices, accumulate_steps):
  step = _pmap_train_step(
    devices,
    model=model,
    tx=tx,
    schedule=optim.paper_schedule(model.cfg.d_model, 10),
    label_smoothing=0.1,
    accumulate_steps=accumulate_steps,
  )
  p_state = parallel.replicate(state, devices)
  for batch in batches:
    p_state, metrics = step(p_state, parallel.shard(batch, len(devices)))
  return parallel.local_replica(p_state), parallel.local_replica(metrics)


def test_accumulating_four_micro_batches_equals_one_large_step():
  """k=4 micro-batches per device, scanned in one step, give the update of the whole batch."""
  c = helpers.narrow(config_lib.base_config("tiny"))
  c.model.dropout_rate = 0.0  # micro-batches draw their own dropout masks; nothing else may differ
  model = Transformer(TransformerConfig.from_config(c.model, 64))
  params = model_params.random_params(model.cfg)
  devices = jax.local_devices()[:2]
  batches = [_packed_batch(16, 12, 64) for _ in range(2)]  # 8 rows per device: 4 x 2
  # Adam, as training runs. Its moments hold the summed gradients themselves (mu is a weighted
  # sum of the gradients, nu of their squares), so comparing them checks the accumulated gradient
  # and its scale, which Adam's normalised first updates alone would hide.
  tx = optim.make_optimizer(c.optim, model.cfg.d_model)[0]
  state = steps.create_train_state(params, tx, jax.random.PRNGKey(1))
  whole, m1 = _run_steps(state, batches, tx, model, devices, accumulate_steps=1)
  accumulated, m4 = _run_steps(state, batches, tx, model, devices, accumulate_steps=4)
  assert m1["tokens"] == m4["tokens"]
  np.testing.assert_allclose(m4["loss_sum"], m1["loss_sum"], rtol=1e-5)
  np.testing.assert_allclose(m4["grad_norm"], m1["grad_norm"], rtol=1e-5)
  # Summation order differs (4 partial sums), so entries near 0 differ in relative terms:
  # tolerances are relative to each array's scale.
  close = lambda a, b: np.testing.assert_allclose(
    a, b, rtol=1e-4, atol=1e-3 * float(np.abs(b).max()) + 1e-12
  )
  jax.tree.map(close, accumulated.params, whole.params)
  jax.tree.map(close, accumulated.opt_state, whole.opt_state)
  # The steps did move the parameters (Adam by about its learning rate, ~1e-6 this early) and
  # the moments hold real gradients.
  moved = jax.tree.map(lambda a, b: float(np.abs(a - b).max()), whole.params, params)
  assert max(jax.tree.leaves(moved)) > 5e-7
  moments = [
    leaf
    for path, leaf in jax.tree_util.tree_flatten_with_path(whole.opt_state)[0]
    if "mu" in jax.tree_util.keystr(path) or "nu" in jax.tree_util.keystr(path)
  ]
  assert moments and all(float(np.abs(m).max()) > 0 for m in moments)


def test_accumulate_steps_must_divide_the_rows():
  import pytest

  c = helpers.narrow(config_lib.base_config("tiny"))
  model = Transformer(TransformerConfig.from_config(c.model, 64))
  tx = optax.sgd(1.0)
  state = steps.create_train_state(model_params.random_params(model.cfg), tx, jax.random.PRNGKey(1))
  with pytest.raises(ValueError, match="do not split into optim.accumulate_steps=3"):
    _run_steps(state, [_packed_batch(16, 12, 64)], tx, model, jax.local_devices()[:2], 3)


def test_local_replica_and_rows_read_this_process_shards():
  devices = jax.local_devices()
  out = jax.pmap(lambda x: (x * 2, jax.lax.psum(x, "i")), axis_name="i")(
    np.arange(len(devices), dtype=np.float32)
  )
  rows, total = out
  np.testing.assert_array_equal(parallel.local_rows(rows), 2 * np.arange(len(devices)))
  assert parallel.local_replica(total) == sum(range(len(devices)))


def test_pmap_rows_spreads_rows_over_devices_and_restores_order():
  n = jax.device_count()
  seen = parallel.pmap_rows(lambda scale, rows: rows * scale + jax.lax.axis_index("batch"))
  batch = np.arange(3 * n, dtype=np.int32)[:, None].repeat(2, 1)  # [3n, 2]
  out = seen(parallel.replicate(np.int32(10)), batch)
  # Row r ran on device r % n, and comes back in place.
  np.testing.assert_array_equal(out, batch * 10 + (np.arange(3 * n) % n)[:, None])


def test_distributed_start_up_follows_the_cluster(monkeypatch):
  """auto: initialize() without arguments in a multi-process SLURM job, nothing on one process."""
  import pytest

  calls = []
  monkeypatch.setattr(jax.distributed, "initialize", lambda *a, **k: calls.append((a, k)))
  monkeypatch.setattr(jax, "process_index", lambda: 0)
  for var in ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID"):
    monkeypatch.delenv(var, raising=False)
  slurm = dict(
    SLURM_JOB_ID="7", SLURM_STEP_NODELIST="node[001-002]", SLURM_PROCID="0", SLURM_LOCALID="0"
  )
  for name, value in slurm.items():
    monkeypatch.setenv(name, value)

  monkeypatch.setenv("SLURM_NTASKS", "1")  # one task: a single-host job needs no coordinator
  parallel.maybe_initialize_distributed("auto")
  assert calls == []
  monkeypatch.setenv("SLURM_NTASKS", "16")
  assert parallel._detected_cluster() == ("SlurmCluster", 16, 0)
  parallel.maybe_initialize_distributed("auto")
  assert calls == [((), {})]  # JAX reads the rest from the environment
  parallel.maybe_initialize_distributed("off")
  assert len(calls) == 1
  with pytest.raises(ValueError, match="--distributed must be one of"):
    parallel.maybe_initialize_distributed("yes")


@pytest.mark.parametrize("block, accumulate_steps", [(40, 1), (1000, 2)])
def test_the_blocked_output_loss_trains_as_the_whole_one(monkeypatch, block, accumulate_steps):
  """model.loss_block_tokens=N: the train step computes the output layer and the loss in blocks
  of at most N positions (losses.blocked_output_loss) and gives the whole-batch step's loss and
  update, on 2 devices with uneven shards: 96 positions each in 3 blocks of 32, or 2 micro-batches
  of 48 positions each in one block (N larger than a micro-batch)."""
  from flaxformer_nmt.model import losses  # pylint: disable=g-import-not-at-top

  calls = []
  blocked_loss = losses.blocked_output_loss
  monkeypatch.setattr(
    losses, "blocked_output_loss", lambda *a: calls.append(a[6]) or blocked_loss(*a)
  )
  c = helpers.narrow(config_lib.base_config("tiny"))
  c.model.dropout_rate = 0.0
  whole = Transformer(TransformerConfig.from_config(c.model, 64))
  c.model.loss_block_tokens = block
  blocked = Transformer(TransformerConfig.from_config(c.model, 64))
  assert blocked.cfg.loss_block_tokens == block
  params = model_params.random_params(whole.cfg)
  tx = optax.sgd(1.0)  # the update is the gradient
  state = steps.create_train_state(params, tx, jax.random.PRNGKey(1))
  devices = jax.local_devices()[:2]
  batches = [_packed_batch(16, 12, 64)]
  s_whole, m_whole = _run_steps(state, batches, tx, whole, devices, accumulate_steps)
  assert not calls
  s_blocked, m_blocked = _run_steps(state, batches, tx, blocked, devices, accumulate_steps)
  assert calls == [block]  # traced once (in the micro-batches' scan too), with the config's block
  np.testing.assert_allclose(m_blocked["loss_sum"], m_whole["loss_sum"], rtol=1e-5)
  np.testing.assert_allclose(m_blocked["nll_sum"], m_whole["nll_sum"], rtol=1e-5)
  np.testing.assert_allclose(m_blocked["grad_norm"], m_whole["grad_norm"], rtol=1e-5)
  jax.tree.map(
    lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6),
    s_blocked.params,
    s_whole.params,
  )


def test_a_blocked_loss_on_an_untied_output_layer_is_refused():
  """config.checks refuses it for a run; a config built by hand is refused by the step itself,
  which would otherwise read the source embedding as the output layer."""
  import pytest

  cfg = TransformerConfig(vocab_size=8, share_embeddings=False, loss_block_tokens=4)
  with pytest.raises(ValueError, match=r"share_embeddings=False"):
    steps._train_loss(Transformer(cfg), {}, {}, None, 0.1, {}, None)
