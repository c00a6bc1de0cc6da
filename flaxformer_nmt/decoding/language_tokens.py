"""Which tokens a request's languages put where: the ids every source starts with (a multilingual
model's target-language tag, or a many-to-many model's source-language token), the output's forced
first token (a many-to-many model's target-language token), and the vocabulary's tags, which
never come from the text. config/directions.py resolves and checks the languages; this turns them
into ids of the model's vocabulary.
"""

from __future__ import annotations

from flaxformer_nmt import errors
from flaxformer_nmt.config import directions
from flaxformer_nmt.data import tokenizer as tokenizer_lib
from flaxformer_nmt.run.components import Components


def language_ids(
  parts: Components, target_lang: str | None, source_lang: str | None = None
) -> tuple[list[int], int | None]:
  """(the ids every source starts with, the forced first output or None) for a request into
  `target_lang` from `source_lang`, both already resolved ("" or None: the model's defaults). A
  many-to-many model (data.lang_tokens="m2m100") reads `[__en__] pieces </s>` and is made to
  start its output with `__de__`; any other model: `target_prefix`, nothing forced."""
  data_config = parts.config.data
  if not directions.many_to_many(data_config):
    return target_prefix(parts, target_lang), None
  src = directions.resolve_source(data_config, source_lang)  # the defaults, when not given
  tgt = directions.resolve_target(data_config, target_lang)
  ids = [parts.tokenizer.piece_id(directions.lang_tag(x, data_config)) for x in (src, tgt)]  # type: ignore[union-attr]
  for lang, i in zip((src, tgt), ids, strict=True):
    if i is None:
      raise errors.DataError(
        f"{parts.tokenizer.model_path}: has no token of {lang!r} "  # type: ignore[union-attr]
        f"({directions.lang_tag(lang, data_config)}), though config.data.languages names it."
      )
  return [int(ids[0])], int(ids[1])  # type: ignore[arg-type]


def target_prefix(parts: Components, lang: str | None) -> list[int]:
  """The source prefix into `lang`, a language already resolved and checked (a request's:
  requests.check_request, directions.resolve_target), which is not resolved again: [] for a
  bilingual model, else a multilingual model's language tag. A multilingual model asked for no
  language (a default request) gets its one target language's, or a ConfigError."""
  data_config = parts.config.data
  if not lang and directions.is_multilingual(data_config):
    # Asked for none (a default request): the model's one target language, or one line.
    lang = directions.resolve_target(data_config, None)
  if not lang:
    return []
  return tokenizer_lib.source_prefix(
    parts.tokenizer,  # type: ignore[arg-type]
    lang,
    data_config=data_config,
  )


def reserved_ids(parts: Components) -> list[int]:
  """The ids of the tags of the model's own vocabulary (none for a bilingual model's): never
  the command's config's, which may narrow data.directions."""
  ids = getattr(parts.tokenizer, "reserved_ids", None)
  return list(ids()) if ids is not None else []
