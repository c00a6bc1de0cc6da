"""The pmapped step gives the same result on 8 devices as on 1 for the same global batch."""

import jax
import numpy as np
import optax

from flaxformer_nmt import config_lib, optim, parallel, steps
from flaxformer_nmt.model import Transformer, TransformerConfig, init_params


def _packed_batch(rows: int, length: int, vocab: int) -> dict[str, np.ndarray]:
  """Rows with uneven real lengths, so shards hold different token counts."""
  rs = np.random.RandomState(0)
  batch = {k: rs.randint(3, vocab, (rows, length)).astype(np.int32) for k in ("inputs", "targets")}
  for r in range(rows):
    batch["inputs"][r, rs.randint(3, length):] = 0
    batch["targets"][r, rs.randint(2, length):] = 0
  return batch


def test_eight_devices_equal_one_device():
  assert jax.local_device_count() == 8, "tests/conftest.py should provide 8 CPU devices"
  c = config_lib.base_config("tiny")
  c.model.dropout_rate = 0.0  # dropout masks differ per device layout; everything else must not
  cfg = TransformerConfig.from_config(c.model, 64)
  model = Transformer(cfg)
  # Plain SGD with rate 1: the update *is* the gradient, so any cross-device error shows in the
  # parameters at full size (Adam would hide a scale error and magnify rounding on ~0 gradients).
  tx, schedule = optax.sgd(1.0), optim.paper_schedule(cfg.d_model, c.optim.warmup_steps)
  state = steps.create_train_state(init_params(cfg, jax.random.PRNGKey(0)), tx,
                                   jax.random.PRNGKey(1))
  batches = [_packed_batch(16, 12, 64) for _ in range(2)]
  results = {}
  for n in (1, 8):
    devices = jax.local_devices()[:n]
    step = parallel.pmap_train_step(steps.train_step, devices=devices, model=model, tx=tx,
                                    schedule=schedule, label_smoothing=0.1)
    p_state = parallel.replicate(state, devices)
    for batch in batches:
      p_state, metrics = step(p_state, parallel.shard(batch, n))
    results[n] = (parallel.unreplicate(p_state), parallel.unreplicate(metrics))
  (s1, m1), (s8, m8) = results[1], results[8]
  np.testing.assert_allclose(m1["loss_sum"], m8["loss_sum"], rtol=1e-5)
  assert m1["tokens"] == m8["tokens"]
  # Adam is invariant to a gradient's scale, so compare the gradient itself (via its norm) too.
  np.testing.assert_allclose(m1["grad_norm"], m8["grad_norm"], rtol=1e-5)
  assert int(s1.step) == int(s8.step) == 2
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6),
               s1.params, s8.params)
  # And the update did something: parameters moved away from the initial ones.
  moved = jax.tree.map(lambda a, b: float(np.abs(a - b).max()), s1.params, state.params)
  assert max(jax.tree.leaves(moved)) > 1e-4


def test_shard_rejects_uneven_split():
  import pytest

  with pytest.raises(ValueError, match="cannot be split over 8 devices"):
    parallel.shard({"inputs": np.zeros((12, 4), np.int32)}, 8)
