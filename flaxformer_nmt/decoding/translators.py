"""A loaded model's translators and scorers, made once per kind of request and kept.

A `Translator` (translator.py) holds compiled searches: making a new one per call (what the API
did) recompiles, or at best re-traces, every batch shape. `Translators` makes one per kind of
request (n-best, alignments, output language, beam), puts the parameters on the devices once for
all of them, and hands back the same one for the same kind: the command line, the server
(serving/service.py), scoring and the API (`api.load`) all take theirs from here.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Sequence
from typing import Any

from absl import logging

from flaxformer_nmt.config import directions
from flaxformer_nmt.decoding import scoring
from flaxformer_nmt.decoding import translator as translator_lib
from flaxformer_nmt.run.loaded import LoadedModel
from flaxformer_nmt.runtime import parallel


@dataclasses.dataclass(frozen=True)
class Request:
  """What a search is asked for: the translator a kind of request needs."""

  nbest: int = 1
  alignments: bool = False
  target_lang: str = ""  # "" = the model's only target language (a bilingual model: its own)
  beam_size: int | None = None  # None = config.decode's


class Translators:
  """The translators (and scorers) of one loaded model, by `Request`, made when first asked."""

  def __init__(
    self,
    loaded: LoadedModel,
    *,
    log_progress: bool = True,
    rows_per_shard: Sequence[int] | None = None,
  ) -> None:
    self.loaded = loaded
    self._log_progress = log_progress
    self._rows_per_shard = rows_per_shard
    self._made: dict[Request, translator_lib.Translator] = {}
    self._scorers: dict[str, Any] = {}
    self._lock = threading.Lock()
    # The parameters go to the devices once, for every kind.
    self.replicated = parallel.replicate(loaded.params)

  def get(self, request: Request | None = None) -> translator_lib.Translator:
    """The translator of `request` (default: config.decode's 1-best; made and kept on first
    use; thread-safe)."""
    request = request or Request()
    with self._lock:
      if request not in self._made:
        start = time.perf_counter()
        self._made[request] = translator_lib.make_translator(
          self.loaded.components,
          self.replicated,
          replicated=True,
          beam_size=request.beam_size,
          nbest=request.nbest,
          alignments=request.alignments,
          log_progress=self._log_progress,
          rows_per_shard=self._rows_per_shard,
          target_lang=request.target_lang or None,
        )
        logging.info("Search for %s made in %.1f s.", request, time.perf_counter() - start)
      return self._made[request]

  def scorer(self, target_lang: str | None = None) -> Any:
    """The teacher-forced scorer (decoding/scoring.py) into `target_lang`, kept like a
    translator."""
    components = self.loaded.components
    lang = directions.resolve_target(components.config.data, target_lang) or ""
    with self._lock:
      if lang not in self._scorers:
        parts = translator_lib.ModelParts.of(components)
        self._scorers[lang] = scoring.Scorer(
          parts,
          self.replicated,
          alpha=float(components.config.decode.alpha),
          source_prefix=translator_lib.target_prefix(parts, lang or None),
          reserved_ids=translator_lib.reserved_ids(parts),
          replicated=True,
        )
      return self._scorers[lang]
