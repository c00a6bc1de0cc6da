"""Decoding speed: sentences/s and generated tokens/s of the jitted beam search.

  python benchmarks/decode.py --size=base            # the paper's base model, 37k vocabulary
  python benchmarks/decode.py --size=tiny --beam_size=1
  python benchmarks/decode.py --size=small --vocab_size=8000 --method=sample --noctranslate2
  python benchmarks/decode.py --size=small --vocab_size=8000 --ensemble=2 --noctranslate2

--method=sample times sampling (one sample per sentence, --temperature/--top_k/--top_p), and
--ensemble=N an ensemble of N models of the size (other random weights each), with --method.

A random-initialised model of the size, a batch of random sources of one length, and EOS forbidden,
so every run makes exactly (source length + max_len_offset) decoder steps and runs compare however
the weights happen to fall. EOS is forbidden by the step function, not by the search: `decode_fixed`
is `decode.decode_batch` with the model's step function wrapped to give EOS a -inf logit, jitted
here (the library's search has no such switch). Timed after a compile warm-up.

With --ctranslate2 (default), the same weights are exported to CTranslate2 (flaxformer_nmt.export)
and the same sources decoded there with the same beam and exactly the same number of steps
(`min_decoding_length = max_decoding_length`, which keeps EOS out as ours does), on the CPU with
--ct2_threads threads; the report adds its sentences/s and our ratio to it. The last line is JSON.

`--target=tpu:v4|v5e|v5p|v6e` runs nothing: it compiles the same program for one chip of that TPU
(libtpu, no TPU needed) and reports the TPU compiler's estimate
(flaxformer_nmt/benchmarking/tpu_estimate.py) of one search step and of the encoder, and from them
sentences/s. The cost model counts a loop body once, so the search's `while_loop` is compiled twice
with its body run in line: two steps and three (the compiler simplifies the first step, whose beams
and cache it knows to be empty); a step is the difference, and a batch is the two-step program plus
the remaining steps at that rate.
"""

from __future__ import annotations

import functools
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags, logging

from flaxformer_nmt.benchmarking import record
from flaxformer_nmt.benchmarking.fixed_decode import decode_fixed
from flaxformer_nmt.config import builders as config_lib
from flaxformer_nmt.config import choices
from flaxformer_nmt.decoding import beam_search, decode, token_loop
from flaxformer_nmt.model.tokens import EOS_ID
from flaxformer_nmt.model.transformer import (
  Transformer,
  TransformerConfig,
  count_params,
  init_params,
)
from flaxformer_nmt.runtime import parallel

_SIZE = flags.DEFINE_string("size", "base", "Model size from config_lib.SIZES.")
_VOCAB = flags.DEFINE_integer("vocab_size", 37_000, "Vocabulary size (the paper's EN-DE: 37k).")
_BATCH = flags.DEFINE_integer("batch_size", 32, "Sentences per batch.")
_SRC_LEN = flags.DEFINE_integer("src_len", 24, "Source length in tokens, EOS included.")
_BEAM = flags.DEFINE_integer("beam_size", 4, "Beam size (1 = greedy).")
_ALPHA = flags.DEFINE_float("alpha", 0.6, "Length penalty.")
_STYLE = flags.DEFINE_enum(
  "beam_style",
  "shrinking",
  list(choices.BEAM_STYLES),
  "Beam search style (decoding/beam_search.py).",
)
_OFFSET = flags.DEFINE_integer("max_len_offset", 50, "Output length = source length + this.")
_DTYPE = flags.DEFINE_string("dtype", "", "Matrix-product dtype; empty = the config's ('auto').")
_REPEATS = flags.DEFINE_integer("repeats", 3, "Timed batches after the warm-up.")
_SEED = flags.DEFINE_integer("seed", 0, "Parameter and input seed.")
_CT2 = flags.DEFINE_bool("ctranslate2", True, "Also time CTranslate2 on the same weights.")
_CT2_THREADS = flags.DEFINE_integer("ct2_threads", 2, "CTranslate2 intra-op threads (CPU).")
_CT2_QUANT = flags.DEFINE_string("ct2_quantization", "float32", "CTranslate2 weight type.")
_TARGET = flags.DEFINE_string("target", "host", "host (run it here), or tpu:<chip> (estimate).")
_METHOD = flags.DEFINE_enum(
  "method", "beam", list(choices.DECODE_METHODS), "Search: beam (--beam_size), greedy, sample."
)
_TEMPERATURE = flags.DEFINE_float("temperature", 1.0, "Sampling temperature (--method=sample).")
_TOP_K = flags.DEFINE_integer("top_k", 0, "Sampling's top-k (0 = off).")
_TOP_P = flags.DEFINE_float("top_p", 1.0, "Sampling's nucleus (1.0 = off).")
_ENSEMBLE = flags.DEFINE_integer(
  "ensemble", 1, "Decode with an ensemble of this many models (decode.Ensemble), seeds seed, ..."
)


def time_ctranslate2(
  cfg, params, inputs: np.ndarray, beam_size: int, steps: int, repeats: int
) -> tuple[float, float]:
  """(median seconds per batch, first call's seconds) of CTranslate2 on the same weights."""
  import tempfile  # pylint: disable=g-import-not-at-top

  import ctranslate2  # pylint: disable=g-import-not-at-top

  from flaxformer_nmt.export import ctranslate2 as export  # pylint: disable=g-import-not-at-top

  vocabulary = ["<pad>", "</s>", "<unk>"] + [f"t{i}" for i in range(3, cfg.vocab_size)]
  spec = export.build_spec(cfg, jax.device_get(params), vocabulary)
  spec.optimize(quantization=_CT2_QUANT.value)
  with tempfile.TemporaryDirectory() as model_dir:
    spec.save(model_dir)
    translator = ctranslate2.Translator(
      model_dir, device="cpu", inter_threads=1, intra_threads=_CT2_THREADS.value
    )
  # Our sources end in EOS; CTranslate2 appends it itself (add_source_eos).
  sources = [[vocabulary[i] for i in row[:-1]] for row in inputs]

  def run() -> float:
    start = time.perf_counter()
    results = translator.translate_batch(
      sources,
      max_batch_size=len(sources),
      beam_size=beam_size,
      min_decoding_length=steps,
      max_decoding_length=steps,
    )
    seconds = time.perf_counter() - start
    lengths = {len(r.hypotheses[0]) for r in results}
    if lengths != {steps}:
      raise RuntimeError(f"CTranslate2 made outputs of lengths {lengths}, expected {steps}.")
    return seconds

  first = run()
  return float(np.median([run() for _ in range(repeats)])), first


class _LaxWithLoop:
  """jax.lax as the searches see it, with its while_loop replaced (for estimate_on_tpu)."""

  def __init__(self, while_loop) -> None:
    self.while_loop = while_loop

  def __getattr__(self, name: str) -> Any:
    return getattr(jax.lax, name)


def estimate_on_tpu(model: Transformer, params, inputs, search, steps: int) -> dict[str, Any]:
  """The compiler's estimate of the search on one TPU chip: encoder, one step, the batch."""
  from unittest import mock  # pylint: disable=g-import-not-at-top

  from flaxformer_nmt.benchmarking import tpu_estimate as te  # pylint: disable=g-import-not-at-top

  try:
    chip = te.chip(_TARGET.value)
  except ValueError as e:
    raise app.UsageError(str(e)) from e
  try:
    device = te.device(chip)
  except te.NoTpuCompiler as e:
    raise SystemExit(f"--target={_TARGET.value}: {e}") from e
  sharding = jax.sharding.SingleDeviceSharding(device)
  abstract = jax.tree.map(
    lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding), (params, inputs)
  )
  results = {}
  for name, loop in (
    ("two_steps", lambda cond, body, init: body(body(init))),
    ("three_steps", lambda cond, body, init: body(body(body(init)))),
  ):
    fn = functools.partial(decode_fixed.__wrapped__, model, search=search)
    with mock.patch.object(token_loop, "lax", _LaxWithLoop(loop)):
      with mock.patch.object(beam_search, "lax", _LaxWithLoop(loop)):
        compiled = jax.jit(fn).lower(*abstract).compile()
    results[name] = te.estimate(compiled, 0.0, chip)
  two, three = results["two_steps"]["est_ms"], results["three_steps"]["est_ms"]
  if two is None or three is None:
    why = results["two_steps"]["why_no_estimate"] or results["three_steps"]["why_no_estimate"]
    return {"target": _TARGET.value, "est_ms_per_step": None, "why_no_estimate": why}
  step_ms = three - two
  batch_ms = two + (steps - 2) * step_ms
  return {
    "target": _TARGET.value,
    "est_encoder_and_two_steps_ms": round(two, 3),
    "est_ms_per_step": round(step_ms, 4),
    "est_ms_per_batch": round(batch_ms, 2),
    "est_sentences_per_s": round(_BATCH.value / (batch_ms / 1e3), 1),
    "est_tokens_per_s": round(_BATCH.value * steps / (batch_ms / 1e3), 1),
    "custom_calls_outside_fusions": results["three_steps"]["custom_calls_outside_fusions"],
  }


def main(argv: list[str]) -> None:
  del argv
  c = config_lib.base_config(_SIZE.value)
  if _DTYPE.value:
    c.model.dtype = _DTYPE.value
  elif _TARGET.value != "host":
    c.model.dtype = "bfloat16"  # what "auto" is on a TPU
  model = Transformer(
    TransformerConfig.from_config(
      c.model, vocab_size=_VOCAB.value, auto_dtype=parallel.auto_dtype()
    )
  )
  init = jax.jit(init_params, static_argnums=0)
  params = init(model.cfg, jax.random.PRNGKey(_SEED.value))
  if _ENSEMBLE.value > 1:  # members with other random weights, so their distributions differ
    seeds = range(_SEED.value, _SEED.value + _ENSEMBLE.value)
    params = decode.Ensemble(tuple(init(model.cfg, jax.random.PRNGKey(s)) for s in seeds))
  search = decode.SearchConfig(
    beam_size=_BEAM.value,
    alpha=_ALPHA.value,
    max_len_offset=_OFFSET.value,
    style=_STYLE.value,
    method=_METHOD.value,
    temperature=_TEMPERATURE.value,
    top_k=_TOP_K.value,
    top_p=_TOP_P.value,
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

  if _TARGET.value != "host":
    report = estimate_on_tpu(model, params, inputs, search, steps)
    report.update(
      benchmark="decode",
      size=_SIZE.value,
      dtype=np.dtype(model.cfg.dtype).name,
      batch_size=_BATCH.value,
      src_len=_SRC_LEN.value,
      beam_size=_BEAM.value,
      method=_METHOD.value,
      ensemble=_ENSEMBLE.value,
      decode_steps=steps,
    )
    record.report(report)
    return
  start = time.perf_counter()
  result = jax.block_until_ready(decode_fixed(model, params, inputs, search))
  compile_s = time.perf_counter() - start
  if int(result.num_steps) != steps or not np.all(np.asarray(result.lengths) == steps):
    raise RuntimeError(f"Expected {steps} steps for every sentence, got {result.num_steps}.")
  logging.info("Compiled and ran once in %.1fs.", compile_s)

  times = []
  for i in range(_REPEATS.value):
    start = time.perf_counter()
    jax.block_until_ready(decode_fixed(model, params, inputs, search))
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
    "beam_style": _STYLE.value,
    "method": _METHOD.value,
    "ensemble": _ENSEMBLE.value,
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
  if _CT2.value and (_METHOD.value != "beam" or _ENSEMBLE.value > 1):
    logging.info("CTranslate2 is timed for single-model beam search only.")
  elif _CT2.value:
    ct2_s, ct2_first = time_ctranslate2(
      model.cfg, params, np.asarray(inputs), _BEAM.value, steps, _REPEATS.value
    )
    logging.info("CTranslate2: %.3fs per batch (first %.3fs).", ct2_s, ct2_first)
    report.update(
      ct2_threads=_CT2_THREADS.value,
      ct2_quantization=_CT2_QUANT.value,
      ct2_seconds_per_batch=round(ct2_s, 4),
      ct2_sentences_per_s=round(_BATCH.value / ct2_s, 2),
      ct2_tokens_per_s=round(_BATCH.value * steps / ct2_s, 1),
      ratio_to_ct2=round(ct2_s / seconds, 3),  # our sentences/s over CTranslate2's
    )
  record.report(report)


if __name__ == "__main__":
  app.run(main)
