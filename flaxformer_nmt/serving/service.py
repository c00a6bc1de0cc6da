"""`--mode=serve`'s model side: one loaded model, decoding as `--mode=translate` does.

The model and its parameters are loaded once (a decoding Session: any --checkpoint, --ensemble),
on the loader's thread while the server already listens (launch.py). Each kind of search a
request may ask for (n-best size, alignments) gets its own `Translator`, made and kept by the
Session (made `quiet`: the server's progress is its own, its batch shapes ROWS_PER_SHARD), with
the search, length buckets and per-device batching of `--mode=translate`, so the server runs the
very programs the command line runs. The 1-best search (the page's, with alignments, and the
API's, without) is compiled for every batch shape it can take before /translate is served
(`start`, which reports its progress to /health), and the "Ready" line says how long that took;
an n-best size is compiled when first asked for.
"""

from __future__ import annotations

import dataclasses
import gc
import re
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
from absl import logging

from flaxformer_nmt.config import directions
from flaxformer_nmt.decoding import translator as translator_lib
from flaxformer_nmt.decoding.requests import Request
from flaxformer_nmt.decoding.session import Session
from flaxformer_nmt.model.tokens import PAD_ID
from flaxformer_nmt.runtime import console
from flaxformer_nmt.serving import batcher as batcher_lib
from flaxformer_nmt.serving import protocol, server
from flaxformer_nmt.serving.options import Options

# Kinds compiled before /translate is served: the API's plain 1-best and the page's, which also
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


def limits(decode: Any, options: Options, data: Any = None) -> protocol.Limits:
  """What a request may ask: n-best lists as config.decode's search gives them (as --nbest allows
  on the command line), the flags' sizes, and the languages of `data` (config.data): a
  multilingual model's, with --target_lang (or its one target language) as the default."""
  if decode.method == "beam":
    nbest = int(decode.beam_size)
    rule = f"beam search finds at most config.decode.beam_size={decode.beam_size} hypotheses"
  elif decode.method == "sample":
    nbest, rule = MAX_SAMPLES, f"the server draws at most {MAX_SAMPLES} samples per line"
  else:
    nbest, rule = 1, "greedy search finds one hypothesis"
  targets: tuple[str, ...] = ()
  default, sources, default_source = "", (), ""
  many = directions.many_to_many(data) if data is not None else []
  if many:  # any of its languages into any other
    targets = sources = tuple(many)
    default = directions.resolve_target(data, options.target_lang or None) or ""
    default_source = directions.resolve_source(data, options.source_lang or None) or ""
  elif data is not None and directions.is_multilingual(data):
    targets = tuple(directions.target_languages(data))
    if options.target_lang or len({d.tgt for d in directions.trained(data)}) == 1:
      default = directions.resolve_target(data, options.target_lang or None) or ""
  elif data is not None:
    directions.resolve_target(data, options.target_lang or None)  # its own, or one line
    default = str(data.tgt_lang)
  return protocol.Limits(
    options.max_request_bytes,
    nbest,
    rule,
    options.max_request_lines,
    targets,
    default,
    constraints=decode.method == "beam",
    sources=sources or _reads(data),
    default_source=default_source,
  )


def _reads(data: Any) -> tuple[str, ...]:
  """The languages a model without source tokens reads (a request's "source_lang" may name
  one; it changes nothing)."""
  if data is None:
    return ()
  found = directions.trained(data) + directions.zero_shot(data)
  return tuple(dict.fromkeys(d.src for d in found)) or (str(data.src_lang),)


def precompiled(allowed: protocol.Limits) -> tuple[batcher_lib.Kind, ...]:
  """PRECOMPILED's kinds, into a multilingual model's default (or first) language: every
  language shares their programs (the tag is an input)."""
  target = allowed.default_target if allowed.targets else ""
  target = target or (allowed.targets[0] if allowed.targets else "")
  return tuple(
    dataclasses.replace(kind, target_lang=target, source_lang=allowed.default_source)
    for kind in PRECOMPILED
  )


def public_description(description: str) -> str:
  """`description` without the paths of the server's files (/health and the page show it)."""
  return re.sub(r" in (/|[A-Za-z]:\\)[^;]*", "", description)


class ServedSession:
  """The batcher's side of a Session made `quiet` (the server's progress is its own, its batch
  shapes ROWS_PER_SHARD): its translators by the batcher's kind of request, which the Session
  makes once and keeps."""

  def __init__(self, session: Session) -> None:
    self.session = session.quiet(ROWS_PER_SHARD)

  def get(self, kind: batcher_lib.Kind) -> translator_lib.Translator:
    return self.session.translator(
      Request(kind.nbest, kind.alignments, kind.target_lang, source_lang=kind.source_lang)
    )

  def translate(
    self, kind: batcher_lib.Kind, lines: list[str], numbers: list[int]
  ) -> tuple[list[list[Any]], list[int]]:
    """The batcher's TranslateFn: the translator of `kind` on these lines."""
    translator = self.get(kind)
    if kind.constrained:  # (text, terms) pairs
      texts, terms = [text for text, _ in lines], [t for _, t in lines]
      hypotheses = translator.translate_nbest(texts, numbers, constraints=terms)
    else:
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
    # A many-to-many model's search takes each row's forced first token too (the same program).
    first = (
      () if translator.first_id is None else (np.full((rows,), translator.first_id, np.int32),)
    )
    jax.block_until_ready(translator.decode_fn(inputs, np.full((rows,), -1, np.int32), *first))


def compile_all(
  served: ServedSession,
  kinds: Sequence[batcher_lib.Kind],
  on_progress: Callable[[int, int], None] = lambda done, total: None,
) -> int:
  """Compiles every batch shape of `kinds`, logging progress with an ETA about every 10 s (a
  cold start compiles for minutes on a small CPU; the compilation cache makes the next one warm)
  and telling `on_progress(done, total)` after each. Returns how many shapes there were."""
  work = [(kind, shape) for kind in kinds for shape in served.shapes(kind)]
  meter = console.Progress(0, len(work))
  last_log = time.monotonic()
  on_progress(0, len(work))
  for done, (kind, (rows, length)) in enumerate(work, 1):
    served.compile(kind, rows, length)
    on_progress(done, len(work))
    if time.monotonic() - last_log >= 10.0 or done == len(work):
      last_log = time.monotonic()
      logging.info("Compiled %d of %d batch shapes (ETA %s).", done, len(work), meter.eta(done))
  return len(work)


def start(session: Session, options: Options, backend: server.Backend) -> Started:
  """Compiles the batch shapes (telling `backend` how far it is), starts the batcher and hands
  both to `backend`: from then on /translate is served. Runs on the loader's thread."""
  decode = session.components.config.decode
  allowed = limits(decode, options, session.components.config.data)  # --target_lang: one line
  kinds = precompiled(allowed)
  served = ServedSession(session)
  began = time.perf_counter()
  compiled = compile_all(served, kinds, backend.progress)
  # Loading and compiling left many long-lived Python objects (traced programs, the
  # config, the vocabulary); the collector would walk them all again at every full collection, a
  # pause in some request's latency. Frozen, they are no longer walked.
  gc.collect()
  gc.freeze()
  first = served.get(kinds[0])
  batcher = batcher_lib.DynamicBatcher(
    served.translate,
    max_rows=first.batch_size * first.num_shards,
    max_wait_s=options.max_wait_ms / 1e3,
    max_queue=options.queue_size,
    max_queue_lines=options.queue_lines,
    on_batch=backend.batch_hook,
  )
  cfg = session.components.model_cfg
  depth = f"{cfg.num_layers}" + (
    f" + {cfg.decoder_depth}" if cfg.decoder_depth != cfg.num_layers else ""
  )
  details = {
    "model": f"{session.components.config.model.size}: {depth} layers, d_model "
    f"{cfg.d_model}, d_ff {cfg.d_ff}, {cfg.num_heads} heads"
    + (f", d_k {cfg.d_k}" if cfg.d_k else ""),
    "vocab_size": session.components.tokenizer.vocab_size,
    "max_source_tokens": session.components.max_src_len,
    "checkpoint": public_description(session.description),
    "step": session.step,
    "search": search_description(decode),
    "devices": jax.local_device_count(),
    "max_nbest": allowed.max_nbest,
    "max_request_lines": allowed.max_request_lines,
    "compiled_at_start": [dataclasses.asdict(kind) for kind in kinds],
    "target_languages": list(allowed.targets) or [allowed.default_target],
    "default_target": allowed.default_target,
    "max_batch_lines": batcher.max_rows,
    "batch_shapes_compiled": compiled,
  }
  tokenizer = session.components.tokenizer
  compile_s = time.perf_counter() - began

  def announce(ready_s: float) -> None:
    logging.info(
      "Ready: serving %s at %s (%d batch shapes compiled in %.1f s; %.1f s after the server "
      "listened). SIGTERM or Ctrl-C stops.",
      session.description,
      backend.url,
      compiled,
      compile_s,
      ready_s,
    )

  backend.ready(
    batcher,
    allowed,
    details,
    lambda lines: protocol.check_encodable(lines, tokenizer.encode),
    announce,
  )
  return Started(batcher, compiled)


@dataclasses.dataclass
class Started:
  batcher: batcher_lib.DynamicBatcher
  batch_shapes_compiled: int
