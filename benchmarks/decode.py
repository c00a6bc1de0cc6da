"""Decoding speed: sentences/s and generated tokens/s of the jitted beam search.

  python benchmarks/decode.py --size=base            # the paper's base model, 37k vocabulary
  python benchmarks/decode.py --size=tiny --beam_size=1

A random-initialised model of the size, a batch of random sources of one length, and EOS forbidden,
so every run makes exactly (source length + max_len_offset) decoder steps and runs compare however
the weights happen to fall. Timed after a compile warm-up. The last line is JSON.
"""

from __future__ import annotations

import json
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags, logging

from flaxformer_nmt import config_lib, decode, parallel
from flaxformer_nmt.model import Transformer, TransformerConfig, count_params, init_params
from flaxformer_nmt.tokenizer import EOS_ID

_SIZE = flags.DEFINE_string("size", "base", "Model size from config_lib.SIZES.")
_VOCAB = flags.DEFINE_integer("vocab_size", 37_000, "Vocabulary size (the paper's EN-DE: 37k).")
_BATCH = flags.DEFINE_integer("batch_size", 32, "Sentences per batch.")
_SRC_LEN = flags.DEFINE_integer("src_len", 24, "Source length in tokens, EOS included.")
_BEAM = flags.DEFINE_integer("beam_size", 4, "Beam size (1 = greedy).")
_ALPHA = flags.DEFINE_float("alpha", 0.6, "Length penalty.")
_OFFSET = flags.DEFINE_integer("max_len_offset", 50, "Output length = source length + this.")
_DTYPE = flags.DEFINE_string("dtype", "", "Matrix-product dtype; empty = the config's ('auto').")
_REPEATS = flags.DEFINE_integer("repeats", 3, "Timed batches after the warm-up.")
_SEED = flags.DEFINE_integer("seed", 0, "Parameter and input seed.")


def main(argv: list[str]) -> None:
  del argv
  c = config_lib.base_config(_SIZE.value)
  if _DTYPE.value:
    c.model.dtype = _DTYPE.value
  model = Transformer(
    TransformerConfig.from_config(
      c.model, vocab_size=_VOCAB.value, auto_dtype=parallel.auto_dtype()
    )
  )
  params = jax.jit(init_params, static_argnums=0)(model.cfg, jax.random.PRNGKey(_SEED.value))
  search = decode.SearchConfig(
    beam_size=_BEAM.value, alpha=_ALPHA.value, max_len_offset=_OFFSET.value, allow_eos=False
  )
  rng = np.random.default_rng(_SEED.value)
  inputs = rng.integers(3, _VOCAB.value, size=(_BATCH.value, _SRC_LEN.value)).astype(np.int32)
  inputs[:, -1] = EOS_ID
  inputs = jnp.asarray(inputs)  # [batch, src_len]
  steps = decode.decode_length_bound(_SRC_LEN.value, _OFFSET.value, model.cfg.max_len)
  logging.info(
    "%s model (%.1fM parameters), vocab %d, batch %d, source %d, beam %d, %d steps, on %s.",
    _SIZE.value,
    count_params(params) / 1e6,
    _VOCAB.value,
    _BATCH.value,
    _SRC_LEN.value,
    _BEAM.value,
    steps,
    jax.devices()[0].device_kind,
  )

  start = time.perf_counter()
  result = jax.block_until_ready(decode.decode_batch(model, params, inputs, search))
  compile_s = time.perf_counter() - start
  if int(result.num_steps) != steps or not np.all(np.asarray(result.lengths) == steps):
    raise RuntimeError(f"Expected {steps} steps for every sentence, got {result.num_steps}.")
  logging.info("Compiled and ran once in %.1fs.", compile_s)

  times = []
  for i in range(_REPEATS.value):
    start = time.perf_counter()
    jax.block_until_ready(decode.decode_batch(model, params, inputs, search))
    times.append(time.perf_counter() - start)
    logging.info("Batch %d: %.3fs.", i, times[-1])
  seconds = float(np.median(times))
  report = {
    "benchmark": "decode",
    "size": _SIZE.value,
    "dtype": np.dtype(model.cfg.dtype).name,
    "vocab_size": _VOCAB.value,
    "batch_size": _BATCH.value,
    "src_len": _SRC_LEN.value,
    "beam_size": _BEAM.value,
    "decode_steps": steps,
    "seconds_per_batch": round(seconds, 4),
    "sentences_per_s": round(_BATCH.value / seconds, 2),
    # Output tokens (the best hypothesis of each sentence); the beam computes beam_size times as
    # many rows per step.
    "tokens_per_s": round(_BATCH.value * steps / seconds, 1),
    "ms_per_step": round(1000 * seconds / steps, 3),
    "compile_and_first_s": round(compile_s, 2),
    "device": jax.devices()[0].device_kind,
    "num_devices_used": 1,
  }
  print(json.dumps(report), flush=True)


if __name__ == "__main__":
  app.run(main)
