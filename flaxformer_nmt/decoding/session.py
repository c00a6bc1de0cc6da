"""A trained run loaded once, for many calls: what `api.load` returns, and what the decoding
modes (translate, score, attention) use for their one call.

Loading a run (its config, vocabulary and parameters) and compiling its searches is most of a
short command's time. A `Session` does both once: its translators and scorers are kept by kind of
request (translators.py), so a second `translate` of a few lines runs the programs compiled by
the first. Its defaults are the command line's: config.decode's search, the 1-best translation,
the model's own target language.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import jax

from flaxformer_nmt import errors
from flaxformer_nmt.config import directions
from flaxformer_nmt.decoding import request
from flaxformer_nmt.decoding import translator as translator_lib
from flaxformer_nmt.decoding.translators import Request, Translators
from flaxformer_nmt.run.folder import Workdir
from flaxformer_nmt.run.loaded import LoadedModel


class Session:
  """`loaded` (run/loaded.py) in `run`, with its translators made once per kind of request."""

  def __init__(self, loaded: LoadedModel, run: Workdir) -> None:
    self.loaded = loaded
    self.run = run
    self.translators = Translators(loaded)

  @property
  def config(self) -> Any:
    return self.loaded.components.config

  @property
  def description(self) -> str:
    """Which parameters were loaded ("step 600 in runs/demo/checkpoints", an ensemble...)."""
    return self.loaded.description

  def translator(
    self, nbest: int = 1, alignments: bool = False, target_lang: str | None = None
  ) -> translator_lib.Translator:
    """The kept translator of this kind of request (checked first)."""
    lang = request.check_request(self.config, nbest, target_lang=target_lang) or ""
    return self.translators.get(Request(nbest, alignments, lang))

  def translate_nbest(
    self,
    lines: Sequence[str],
    nbest: int = 4,
    *,
    alignments: bool = False,
    target_lang: str | None = None,
    constraints: Sequence[Sequence[str]] | None = None,
  ) -> list[list[translator_lib.Hypothesis]]:
    """`nbest` hypotheses per line, best first (translator.Hypothesis: text, score, alignment);
    with `constraints`, each line's terms its hypotheses must contain (beam search)."""
    _check_lines(lines)
    request.check_request(self.config, nbest, constraints is not None, target_lang)
    decoder = self.translator(nbest, alignments, target_lang)
    return decoder.translate_nbest(list(lines), constraints=constraints)

  def translate(self, lines: Sequence[str], target_lang: str | None = None) -> list[str]:
    """The best translation of each line, with config.decode's search."""
    return [h[0].text for h in self.translate_nbest(lines, 1, target_lang=target_lang)]

  def score(
    self, sources: Sequence[str], targets: Sequence[str], target_lang: str | None = None
  ) -> list[Any]:
    """The model's score of each (source, translation) pair: scoring.PairScore(score,
    log_prob, tokens), the score as the n-best list prints it (--mode=score)."""
    from flaxformer_nmt.decoding import scoring  # pylint: disable=g-import-not-at-top

    _check_lines(sources)
    _check_lines(targets)
    scoring.check_pairs(list(sources), list(targets), "sources", "targets")
    return self.translators.scorer(target_lang).score(list(sources), list(targets))

  def attention(
    self, text: str, output: str | None = None, target_lang: str | None = None
  ) -> dict[str, Any]:
    """PNG heatmaps of every attention (layers x heads) for `text` and its translation, and the
    positional encoding, in `output` (default <workdir>/attention); the translation and the
    files written (decoding/attention_pictures.py)."""
    # matplotlib: imported by the pictures only.
    from flaxformer_nmt.decoding import attention_pictures, decode  # pylint: disable=g-import-not-at-top
    from flaxformer_nmt.model.tokens import EOS_ID  # pylint: disable=g-import-not-at-top

    if not text.strip():
      raise errors.ConfigError("--text is empty; give the sentence to translate and picture.")
    out_dir = output or self.run.attention_dir
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
      raise errors.ConfigError(f"--output={out_dir} exists and is not a directory.")
    c = self.loaded.components
    lang = directions.resolve_target(c.config.data, target_lang)
    params = jax.device_get(self.loaded.params)
    prefix = translator_lib.target_prefix(translator_lib.ModelParts.of(c), lang)
    source = (prefix + c.tokenizer.encode(text))[: c.max_src_len - 1] + [EOS_ID]
    search = decode.SearchConfig.from_config(c.config.decode)
    target = attention_pictures.translate_ids(c.model, params, source, search)
    pictures = attention_pictures.write_pictures(
      c.model, params, c.tokenizer.id_to_piece, source, target, out_dir
    )
    return {"translation": c.tokenizer.decode(target), **pictures}


def _check_lines(lines: Sequence[str]) -> None:
  if isinstance(lines, str):
    raise TypeError("lines must be a list of sentences, not one string.")
