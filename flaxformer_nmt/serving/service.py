"""`--mode=serve`: one loaded model behind the HTTP server, decoding as `--mode=translate` does.

The model and its parameters are loaded once (loaded_model.py: any --checkpoint, --ensemble).
Each kind
of search a request may ask for (n-best size, alignments) gets its own `Translator`, with the
search, batch size, length buckets and per-device batching of `--mode=translate`, so the server
runs the very programs the command line runs. The 1-best search (the page's, with alignments, and
the API's, without) is compiled for every batch shape it can take before the server listens, and
the "Ready" line says how long that took; an n-best size is compiled when first asked for.
"""

from __future__ import annotations

import dataclasses
import gc
import threading
import time
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from absl import logging

from flaxformer_nmt import errors
from flaxformer_nmt.decoding import translator as translator_lib
from flaxformer_nmt.loaded_model import LoadedModel
from flaxformer_nmt.model.tokens import PAD_ID
from flaxformer_nmt.runtime import parallel, progress
from flaxformer_nmt.serving import batcher as batcher_lib
from flaxformer_nmt.serving import server
from flaxformer_nmt.serving.options import Options

# Kinds compiled before the server listens: the API's plain 1-best and the page's, which also
# draws the word alignment.
PRECOMPILED = (batcher_lib.Kind(1, False), batcher_lib.Kind(1, True))
# The sentences per device a server's batch may have (up to config.decode.batch_size): powers of
# 4, so a few shapes per length bucket are compiled up front (a batch is padded at most 4x);
# --mode=translate uses every power of two.
ROWS_PER_SHARD = tuple(4**i for i in range(8))
# Samples a request may ask for with config.decode.method="sample" (beam search: up to the beam).
# Each n-best size is a search of its own, compiled when first asked for: few of them.
MAX_SAMPLES = 8


def search_description(decode: Any) -> str:
  """config.decode's search in a line (/health)."""
  if decode.method == "beam":
    return (
      f"beam {decode.beam_size} ({decode.beam_style}), alpha {decode.alpha}, "
      f"max length: source + {decode.max_len_offset}"
    )
  if decode.method == "sample":
    return (
      f"sampling: temperature {decode.temperature}, top_k {decode.top_k}, top_p {decode.top_p}, "
      f"seed {decode.seed}, max length: source + {decode.max_len_offset}"
    )
  return f"greedy, max length: source + {decode.max_len_offset}"


def limits(decode: Any, options: Options) -> server.Limits:
  """What n-best lists config.decode's search can give (as --nbest allows on the command line)."""
  if decode.method == "beam":
    rule = f"beam search finds at most config.decode.beam_size={decode.beam_size} hypotheses"
    return server.Limits(options.max_request_bytes, int(decode.beam_size), rule)
  if decode.method == "sample":
    rule = f"the server draws at most {MAX_SAMPLES} samples per line"
    return server.Limits(options.max_request_bytes, MAX_SAMPLES, rule)
  return server.Limits(options.max_request_bytes, 1, "greedy search finds one hypothesis")


class Translators:
  """One Translator per kind of search, made when first needed (their programs are cached)."""

  def __init__(self, loaded: LoadedModel) -> None:
    self._loaded = loaded
    self._made: dict[batcher_lib.Kind, translator_lib.Translator] = {}
    self._lock = threading.Lock()
    # The parameters go to the devices once, for every kind.
    self._replicated = parallel.replicate(loaded.params)

  def get(self, kind: batcher_lib.Kind) -> translator_lib.Translator:
    with self._lock:
      if kind not in self._made:
        start = time.perf_counter()
        self._made[kind] = translator_lib.make_translator(
          self._loaded.components,
          self._replicated,
          replicated=True,
          nbest=kind.nbest,
          alignments=kind.alignments,
          log_progress=False,
          rows_per_shard=ROWS_PER_SHARD,
        )
        logging.info("Search for %s made in %.1f s.", kind, time.perf_counter() - start)
      return self._made[kind]

  def translate(
    self, kind: batcher_lib.Kind, lines: list[str], numbers: list[int]
  ) -> tuple[list[list[Any]], list[int]]:
    """The batcher's TranslateFn: the translator of `kind` on these lines."""
    translator = self.get(kind)
    hypotheses = translator.translate_nbest(lines, numbers)
    return hypotheses, translator.truncated

  def shapes(self, kind: batcher_lib.Kind) -> list[tuple[int, int]]:
    """The batch shapes (rows, source length) `kind`'s translator can be given."""
    return self.get(kind).batch_shapes()

  def compile(self, kind: batcher_lib.Kind, rows: int, length: int) -> None:
    """Compiles (or reads from the compilation cache) one batch shape of `kind`'s search, by
    decoding an all-padding batch of it."""
    translator = self.get(kind)
    inputs = np.full((rows, length), PAD_ID, np.int32)
    jax.block_until_ready(translator.decode_fn(inputs, np.full((rows,), -1, np.int32)))


def compile_all(translators: Translators, kinds: Sequence[batcher_lib.Kind]) -> int:
  """Compiles every batch shape of `kinds`, logging progress with an ETA about every 10 s (a
  cold start compiles for minutes on a small CPU; the compilation cache makes the next one warm).
  Returns how many shapes there were."""
  work = [(kind, shape) for kind in kinds for shape in translators.shapes(kind)]
  meter = progress.Progress(0, len(work))
  last_log = time.monotonic()
  for done, (kind, (rows, length)) in enumerate(work, 1):
    translators.compile(kind, rows, length)
    if time.monotonic() - last_log >= 10.0 or done == len(work):
      last_log = time.monotonic()
      logging.info("Compiled %d of %d batch shapes (ETA %s).", done, len(work), meter.eta(done))
  return len(work)


def run(loaded: LoadedModel, options: Options) -> dict[str, Any]:
  """Serves `loaded` (loaded_model.load's) until SIGTERM; the server's figures."""
  decode = loaded.components.config.decode
  translators = Translators(loaded)
  start = time.perf_counter()
  compiled = compile_all(translators, PRECOMPILED)
  # Loading and compiling left many long-lived Python objects (traced programs, the
  # config, the vocabulary); the collector would walk them all again at every full collection, a
  # pause in some request's latency. Frozen, they are no longer walked.
  gc.collect()
  gc.freeze()
  ready_s = time.perf_counter() - start
  first = translators.get(PRECOMPILED[0])
  batcher = batcher_lib.DynamicBatcher(
    translators.translate,
    max_rows=first.batch_size * first.num_shards,
    max_wait_s=options.max_wait_ms / 1e3,
    max_queue=options.queue_size,
  )
  cfg = loaded.components.model_cfg
  allowed = limits(decode, options)
  health = {
    "model": f"{loaded.components.config.model.size}: {cfg.num_layers} layers, d_model "
    f"{cfg.d_model}, d_ff {cfg.d_ff}, {cfg.num_heads} heads"
    + (f", d_k {cfg.d_k}" if cfg.d_k else ""),
    "vocab_size": loaded.components.tokenizer.vocab_size,
    "max_source_tokens": loaded.components.max_src_len,
    "checkpoint": loaded.description,
    "step": loaded.step,
    "search": search_description(decode),
    "devices": jax.local_device_count(),
    "max_nbest": allowed.max_nbest,
    "compiled_at_start": [dataclasses.asdict(kind) for kind in PRECOMPILED],
    "max_batch_lines": batcher.max_rows,
    "batch_shapes_compiled": compiled,
    "ready_seconds": round(ready_s, 1),
  }
  app = server.make_app(batcher, lambda: health, allowed)
  began = time.time()

  def ready(url: str) -> None:
    logging.info(
      "Ready: serving %s at %s (%d batch shapes compiled in %.1f s). SIGTERM or Ctrl-C stops.",
      loaded.description,
      url,
      compiled,
      ready_s,
    )

  try:
    server.serve(app, options.host, options.port, ready)
  except OSError as e:  # taken since Options.check_address looked
    raise errors.ConfigError(
      f"--host={options.host} --port={options.port}: cannot listen there ({e.strerror or e})."
    ) from None
  finally:
    batcher.close(timeout=server.SHUTDOWN_TIMEOUT_S)
  return {
    "mode": "serve",
    "checkpoint": loaded.description,
    "url": f"http://{options.host}:{options.port}",
    "ready_seconds": round(ready_s, 1),
    "batch_shapes_compiled": compiled,
    "served_seconds": round(time.time() - began, 1),
    **batcher.stats.as_dict(),
  }
