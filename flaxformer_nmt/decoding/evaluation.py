"""Scoring a model: dev loss and dev BLEU during training, both BLEUs and chrF of the test set.

Each function takes only what it uses: batches and an eval step, or sentence pairs and a
`Translate` function (a Session's translate_with, which decodes on every device of every process
with the session's kept searches); the training loop and `--mode=eval` call them. The metrics
themselves are bleu.py's (sacreBLEU).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

import jax
import numpy as np
from absl import logging

from flaxformer_nmt import errors
from flaxformer_nmt.config import directions as directions_lib
from flaxformer_nmt.decoding import language_id
from flaxformer_nmt.decoding.bleu import (
  protocol_bleu,
  sacrebleu_score,
  score_and_write,
  splits_compounds,
  tokenized_bleu_method,
)
from flaxformer_nmt.decoding.requests import Request
from flaxformer_nmt.runtime import parallel

if TYPE_CHECKING:  # the test set's type only: decoding does not load the input pipeline
  from flaxformer_nmt.data.pipeline import Data
  from flaxformer_nmt.decoding.session import Session

# (source sentences, beam size) -> their translations: how a model is asked to translate.
Translate = Callable[[Sequence[str], int], list[str]]


def dev_loss(
  batches: Iterable[dict[str, np.ndarray]], p_eval_step: Any, replicated_params: Any
) -> dict[str, float]:
  """Per-token dev loss, perplexity and accuracy over the whole dev set (`batches`), in order."""
  totals: dict[str, float] = {}
  for batch in batches:
    out = jax.tree.map(
      float, parallel.local_replica(p_eval_step(replicated_params, parallel.shard(batch)))
    )
    for k, v in out.items():
      totals[k] = totals.get(k, 0.0) + v
  tokens = max(totals.get("tokens", 0.0), 1.0)
  nll = totals.get("nll_sum", 0.0) / tokens
  return {
    "dev_loss": totals.get("loss_sum", 0.0) / tokens,
    "dev_nll": nll,
    "dev_perplexity": float(np.exp(min(nll, 50.0))),
    "dev_accuracy": totals.get("correct", 0.0) / tokens,
  }


def dev_bleu(
  pairs: Sequence[tuple[str, str]],
  translate_fn: Translate,
  beam_size: int,
  protocol: str = "",
  tgt_lang: str = "",
) -> dict[str, float]:
  """sacreBLEU of (greedy, by default) translations of dev `pairs`: a cheap learning signal;
  with `protocol` ("multi30k"), also BLEU4 by that protocol as `dev_<protocol>_bleu` (the
  learning curve a paper's figure is compared with)."""
  if not pairs:
    return {}
  hyps = translate_fn([s for s, _ in pairs], beam_size)
  refs = [r for _, r in pairs]
  score, _ = sacrebleu_score(hyps, refs)
  out = {"dev_bleu": score}
  if protocol:
    out[f"dev_{protocol}_bleu"] = protocol_bleu(hyps, refs, tgt_lang, protocol)[0]
  return out


def dev_figures(
  data: Data,
  p_eval_step: Any,
  session: Session,
  bleu_sentences: int,
  bleu_beam: int,
  protocol: str = "",
) -> dict[str, float]:
  """Dev loss and dev BLEU of `session`'s parameters (replicated: the train state's); a
  multilingual run's for each direction (`dev_bleu.en-de`, ...), with their mean under the
  bilingual names (`dev_bleu`), which the best checkpoint and early stopping go by."""
  params = session.replicated

  def translate(target: str | None) -> Translate:
    return lambda sources, beam: session.translate_with(sources, beam, target)

  if not data.directions:
    out = dev_loss(data.eval_batches("dev"), p_eval_step, params)
    pairs = data.pairs("dev")[:bleu_sentences]
    tgt = session.config.data.tgt_lang if protocol else ""
    out.update(dev_bleu(pairs, translate(None), bleu_beam, protocol, tgt))
    return out
  per: dict[str, dict[str, float]] = {}
  for direction in data.directions:
    figures = dev_loss(data.eval_batches("dev", direction), p_eval_step, params)
    target = direction.split("-", 1)[1]
    pairs = data.pairs("dev", direction)[:bleu_sentences]
    figures.update(dev_bleu(pairs, translate(target), bleu_beam, protocol, target))
    per[direction] = figures
  out = {k: float(np.mean([f[k] for f in per.values()])) for k in per[data.directions[0]]}
  for direction, figures in per.items():
    out.update({f"{k}.{direction}": v for k, v in figures.items()})
  return out


def test_scores(
  pairs: Sequence[tuple[str, str]],
  translate_fn: Translate,
  *,
  test_set: str,
  test_set_id: str,
  beam_size: int,
  beam_style: str,
  alpha: float,
  max_len_offset: int,
  tgt_lang: str,
  compound_split: str,
  out_dir: str,
  tag: str,
  languages: Sequence[str] = (),
  protocol: str = "",
) -> dict[str, Any]:
  """Translates the test `pairs` greedily and with `beam_size`, and scores both both ways.

  Every process decodes its share and scores the whole set; process 0 writes
  `<out_dir>/<test_set_id>_<tag>_<search_tag>.{hyp.txt,scores.json}`: named by what was scored
  (which test set by content, with which settings: scored_set_id; which parameters; which
  search), so no evaluation overwrites another's files.
  The result names the test set
  (e.g. `newstest2014` for the WMT14 configs), its size and how the tokenized BLEU was made.
  With `languages` (a multilingual model's), it also gives each search's off-target rate: the
  share of outputs that language_id does not find in `tgt_lang`, and the identifier's own rate
  on the references beside it.
  """
  split = splits_compounds(compound_split, tgt_lang)
  sources, refs = [s for s, _ in pairs], [r for _, r in pairs]
  out: dict[str, Any] = {
    "test_set": test_set,
    "test_sentences": len(pairs),
    "beam_style": beam_style,
    "tokenized_bleu_method": tokenized_bleu_method(tgt_lang, split),
  }
  for beam in sorted({1, beam_size}):
    start = time.monotonic()
    hyps = translate_fn(sources, beam)
    name = "greedy" if beam == 1 else f"beam{beam}"
    scores = score_and_write(
      hyps,
      refs,
      out_dir,
      f"{test_set_id}_{tag}_{search_tag(beam, beam_style, alpha, max_len_offset)}",
      tgt_lang,
      compound_split=split,
      protocol=protocol,
      write=parallel.is_main_process(),
    )
    logging.info(
      "%s (test), %s: sacreBLEU %.2f (%s), tokenized BLEU %.2f (%s), chrF %.2f, %d sentences in "
      "%.1fs",
      test_set,
      name,
      scores["sacrebleu"],
      scores["sacrebleu_signature"],
      scores["tokenized_bleu"],
      scores["tokenized_bleu_method"],
      scores["chrf"],
      len(hyps),
      time.monotonic() - start,
    )
    out.update(_test_figures(name, scores, protocol))
    rate = language_id.off_target_rate(hyps, tgt_lang, languages) if languages else None
    if rate is not None:
      out[f"off_target_rate_{name}"] = rate
  rate = language_id.off_target_rate(refs, tgt_lang, languages) if languages else None
  if rate is not None:
    out["reference_off_target_rate"] = rate
  elif languages:
    logging.warning("No off-target rate into %r: py3langid does not know it.", tgt_lang)
  return out


def _test_figures(name: str, scores: dict[str, Any], protocol: str) -> dict[str, Any]:
  """One search's (`name`: greedy, beam4) test figures as a result names them."""
  out = {
    f"test_sacrebleu_{name}": scores["sacrebleu"],
    f"test_tokenized_bleu_{name}": scores["tokenized_bleu"],
    f"test_chrf_{name}": scores["chrf"],
    "sacrebleu_signature": scores["sacrebleu_signature"],
    "chrf_signature": scores["chrf_signature"],
  }
  if protocol:
    out[f"test_{protocol}_bleu_{name}"] = scores[f"{protocol}_bleu"]
    out[f"{protocol}_bleu_signature"] = scores[f"{protocol}_bleu_signature"]
  return out


def test_set_tag(data_config: Any) -> str:
  """What a test set is, for file names: its source and its split or prefix (and the demo's
  size), e.g. `test_files.newstest2014`, `test_tfds.wmt14_translate-de-en.test`,
  `test_demo.test1000`."""
  d = data_config
  if d.source == "tfds":
    name = f"tfds.{d.tfds_name.replace('/', '-')}.{d.test_split}"
  elif d.source == "demo":
    name = f"demo.test{d.demo_test_size}"
  else:
    name = f"{d.source}.{d.test_prefix}"
  return "test_" + "".join(c if c.isalnum() or c in "._-" else "-" for c in name)


def scored_set_id(
  config: Any,
  pairs: Sequence[tuple[str, str]],
  direction: str | None = None,
  extra: Any = None,
) -> str:
  """The name an evaluation's files carry for what was scored: `test_set_tag` (readable), the
  direction, and a digest of everything else that changes the scores: the pairs themselves
  (their text, so another folder's test set with the same prefix, or fewer sentences, is another
  name), the longest source (data.max_len), the compute dtype and attention, every decoding
  setting and the tokenized BLEU's compound split (and `extra`: a constrained search's terms).
  The same evaluation gets the same name (its
  files may be reused); any other never overwrites them."""
  digest = hashlib.sha256()
  for src, ref in pairs:
    digest.update(f"{src}\t{ref}\n".encode())
  settings = {
    "max_len": config.data.max_len,
    "dtype": config.model.dtype,
    "attention": config.model.get("attention", ""),
    "decode": config.decode.to_dict(),
    "compound_split": config.eval.compound_split,
    "extra": extra,
  }
  digest.update(json.dumps(settings, sort_keys=True, default=str).encode())
  name = test_set_tag(config.data) + (f".{direction}" if direction else "")
  return f"{name}.{digest.hexdigest()[:8]}"


def test_pairs(config: Any, data: Data, direction: str | None = None) -> list[tuple[str, str]]:
  """The test pairs scored: the first eval.max_test_sentences of the split (all when 0)."""
  pairs = data.pairs("test", direction) if direction else data.pairs("test")
  limit = int(config.eval.get("max_test_sentences", 0) or 0)
  return list(pairs[:limit]) if limit else list(pairs)


def say_if_another_test_set(config: Any, saved: Any) -> None:
  """One warning line when eval scores a test set other than the run's own (free: docs/runs.md),
  so a --config meant for another run is not taken for this run's figures."""
  ours, theirs = test_set_tag(config.data), test_set_tag(saved.data)
  if ours != theirs:
    logging.warning(
      "Scoring the test set %s, not the run's own (%s); its files in eval/ are named so.",
      ours.removeprefix("test_"),
      theirs.removeprefix("test_"),
    )


def search_tag(beam: int, beam_style: str, alpha: float, max_len_offset: int) -> str:
  """The search, for file names: `greedy`, or `beam4-shrinking-a0.6`; `-len50` is the default
  output length allowance and is left out."""
  name = "greedy" if beam == 1 else f"beam{beam}-{beam_style}-a{alpha:g}"
  return name if max_len_offset == 50 else f"{name}-len{max_len_offset}"


def score_test_set(session: Session, data: Data, out_dir: str) -> dict[str, Any]:
  """`test_scores` of `session`'s parameters on `data`'s test set with the config's beam, its
  hypotheses and scores written to `out_dir` under the session's tag. A multilingual run's:
  every direction's under "directions", the zero-shot ones' under "zero_shot" (each with
  off-target rates), and the trained directions' mean of each figure under "mean"."""
  config = session.config
  settings = dict(
    beam_size=config.decode.beam_size,
    beam_style=config.decode.beam_style,
    alpha=config.decode.alpha,
    max_len_offset=config.decode.max_len_offset,
    compound_split=config.eval.compound_split,
    out_dir=out_dir,
    tag=session.tag,
    protocol=config.eval.get("bleu_protocol", ""),
  )
  if not data.directions:
    pairs = test_pairs(config, data)
    return test_scores(
      pairs,
      lambda sources, beam: session.translate_with(sources, beam),
      test_set=data.split_name("test"),
      test_set_id=scored_set_id(config, pairs),
      tgt_lang=config.data.tgt_lang,
      **settings,
    )
  languages = directions_lib.languages(config.data)
  out: dict[str, Any] = {"test_set": data.split_name("test", data.directions[0])}
  for group, names in (("directions", data.directions), ("zero_shot", data.zero_shot)):
    out[group] = {}
    for direction in names:
      target = direction.split("-", 1)[1]
      pairs = test_pairs(config, data, direction)
      figures = test_scores(
        pairs,
        lambda sources, beam, target=target: session.translate_with(sources, beam, target),
        test_set=data.split_name("test", direction),
        test_set_id=scored_set_id(config, pairs, direction),
        tgt_lang=target,
        languages=languages,
        **settings,
      )
      out[group][direction] = figures
  trained = list(out["directions"].values())
  out["mean"] = {
    k: float(np.mean([f[k] for f in trained]))
    for k, v in trained[0].items()
    if isinstance(v, float) and k != "test_sentences"
  }
  return out


def constrained_test_scores(
  session: Session,
  data: Data,
  out_dir: str,
  terms: Sequence[Sequence[str]],
  terms_path: str,
) -> dict[str, Any]:
  """BLEU and chrF of the test set translated with the configured beam, each sentence's
  translation made to contain its `terms` (--constraints=`terms_path`), and what was met; the
  files are named `..._beamK-..._constrained-<file name>` beside the unconstrained ones."""
  config, tag = session.config, session.tag
  everything = data.pairs("test")
  if len(terms) != len(everything):
    raise errors.ConfigError(
      f"--constraints={terms_path} has {len(terms)} lines and the test set "
      f"{data.split_name('test')} {len(everything)} sentences: one line of terms per sentence."
    )
  pairs = test_pairs(config, data)
  terms = terms[: len(pairs)]  # eval.max_test_sentences: the first sentences' terms
  d = config.decode
  decoder = session.translator(Request(beam_size=d.beam_size))
  start = time.monotonic()
  hyps = decoder.translate_nbest([s for s, _ in pairs], constraints=terms)
  seconds = time.monotonic() - start
  figures = decoder.stats.constraints or {}
  stem = os.path.splitext(os.path.basename(terms_path))[0]
  search = search_tag(d.beam_size, d.beam_style, d.alpha, d.max_len_offset)
  split = splits_compounds(config.eval.compound_split, config.data.tgt_lang)
  protocol = config.eval.get("bleu_protocol", "")
  scores = score_and_write(
    [h[0].text for h in hyps],
    [r for _, r in pairs],
    out_dir,
    f"{scored_set_id(config, pairs, extra=terms)}_{tag}_{search}_constrained-{stem}",
    config.data.tgt_lang,
    compound_split=split,
    protocol=protocol,
    write=parallel.is_main_process(),
  )
  name = f"beam{d.beam_size}_constrained"
  logging.info(
    "%s (test), %s: sacreBLEU %.2f, %d of %d terms met (beam %d), %d sentences in %.1fs",
    data.split_name("test"),
    name,
    scores["sacrebleu"],
    figures.get("terms_met", 0),
    figures.get("terms", 0),
    figures.get("beam_size", d.beam_size),
    len(hyps),
    seconds,
  )
  return {
    "test_set": data.split_name("test"),
    "test_sentences": len(pairs),
    "beam_style": d.beam_style,
    "tokenized_bleu_method": tokenized_bleu_method(config.data.tgt_lang, split),
    "constraints_file": terms_path,
    **_test_figures(name, scores, protocol),
    "constraints": figures,
    "decode_seconds": seconds,
  }
