"""BLEU, two ways: sacreBLEU (today's standard) and the paper's tokenized, compound-split BLEU;
and chrF (sacreBLEU's), which current papers report beside them; and, when a config asks
(eval.bleu_protocol), BLEU4 by another field's published protocol (`protocol_bleu`).

The paper's 27.3 / 28.4 (EN-DE) come from tensor2tensor's `get_ende_bleu.sh`: Moses-tokenize
hypotheses and references, split hyphenated compounds as `##AT##-##AT##` (as GNMT and ConvS2S did),
then `multi-bleu.perl`. The split belongs to that EN-DE script; for other targets (EN-FR's 41.8)
the tokenized BLEU is Moses + multi-bleu without it (`config.eval.compound_split="auto"`).
Splitting hyphens creates extra matching tokens, so that number runs higher than sacreBLEU's
detokenized, 13a-tokenized score; a paper comparison needs the former, a comparison with today's
literature the latter. We never write BLEU ourselves: both go through
sacrebleu, and the Moses tokenizer is sacremoses' port of tokenizer.perl.

evaluation.py scores a model with them (dev BLEU during training, the test set at its end and in
`--mode=eval`).
"""

from __future__ import annotations

import functools
import json
import os
import re
from collections.abc import Sequence
from typing import Any

from absl import logging
from sacrebleu.metrics import BLEU, CHRF

from flaxformer_nmt.config.choices import BLEU_PROTOCOLS, COMPOUND_SPLITS
from flaxformer_nmt.runtime import files

# t2t's `perl -ple 's{(\S)-(\S)}{$1 ##AT##-##AT## $2}g'`. Perl without -C reads bytes, where
# \S means "not ASCII whitespace"; re.ASCII gives Python the same \S (non-ASCII letters count as
# non-space, as their UTF-8 bytes do in Perl). Matches do not overlap, as in Perl: "a-b-c" becomes
# "a ##AT##-##AT## b-c".
_COMPOUND_HYPHEN = re.compile(r"(\S)-(\S)", re.ASCII)


def _check_lengths(hyps: Sequence[str], refs: Sequence[str]) -> None:
  if len(hyps) != len(refs):
    raise ValueError(f"BLEU needs one hypothesis per reference: got {len(hyps)} and {len(refs)}.")


def sacrebleu_score(hyps: Sequence[str], refs: Sequence[str]) -> tuple[float, str]:
  """Cased, detokenized corpus BLEU with sacreBLEU's 13a tokenizer, and its signature.

  The signature (e.g. `nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0`) says exactly
  how the number was computed; report it with the score.
  """
  _check_lengths(hyps, refs)
  bleu = BLEU()  # tokenize='13a', lowercase=False: the defaults are the standard.
  score = bleu.corpus_score(list(hyps), [list(refs)])
  signature = str(bleu.get_signature())
  logging.info("sacreBLEU %.2f (%s)", score.score, signature)
  return float(score.score), signature


def chrf_score(hyps: Sequence[str], refs: Sequence[str]) -> tuple[float, str]:
  """sacreBLEU's chrF (character 6-grams, beta 2, no word n-grams: its defaults, the standard
  chrF that current papers report beside BLEU), and its signature."""
  _check_lengths(hyps, refs)
  chrf = CHRF()
  score = chrf.corpus_score(list(hyps), [list(refs)])
  signature = str(chrf.get_signature())
  logging.info("chrF %.2f (%s)", score.score, signature)
  return float(score.score), signature


@functools.lru_cache(maxsize=8)
def _moses(lang: str) -> Any:  # sacremoses.MosesTokenizer
  # Imported here: sacremoses compiles its regular expressions at import (0.4 s of every start-up).
  from sacremoses import MosesTokenizer  # pylint: disable=g-import-not-at-top

  return MosesTokenizer(lang=lang)


def splits_compounds(setting: str, tgt_lang: str) -> bool:
  """Whether the tokenized BLEU splits compounds: "auto" = for German targets, as t2t's EN-DE
  script (`get_ende_bleu.sh`); no such step exists for EN-FR."""
  if setting not in COMPOUND_SPLITS:
    raise ValueError(f"Unknown compound_split {setting!r}; choose one of {COMPOUND_SPLITS}.")
  return tgt_lang == "de" if setting == "auto" else setting == "on"


def tokenized_bleu_method(lang: str, compound_split: bool) -> str:
  """How the tokenized BLEU was computed, e.g. `moses-de+##AT##` (for the score files)."""
  return f"moses-{lang}" + ("+##AT##" if compound_split else "")


def tokenize_for_paper_bleu(text: str, lang: str, compound_split: bool = True) -> str:
  """tokenizer.perl -l `lang` (escaping on, as its default), then the ##AT## compound split."""
  tokenized = _moses(lang).tokenize(text, return_str=True, escape=True)
  return _COMPOUND_HYPHEN.sub(r"\1 ##AT##-##AT## \2", tokenized) if compound_split else tokenized


def tokenized_bleu(
  hyps: Sequence[str], refs: Sequence[str], lang: str = "de", compound_split: bool = True
) -> float:
  """The paper's BLEU: Moses (+ ##AT## for EN-DE, t2t get_ende_bleu.sh) on both sides, then
  multi-bleu.

  sacrebleu with `tokenize='none'` scores the already-tokenized text as multi-bleu.perl does
  (cased, one reference, no smoothing: a zero n-gram precision gives 0, as multi-bleu's does).
  """
  _check_lengths(hyps, refs)
  tok_hyps = [tokenize_for_paper_bleu(h, lang, compound_split) for h in hyps]
  tok_refs = [tokenize_for_paper_bleu(r, lang, compound_split) for r in refs]
  bleu = BLEU(tokenize="none", smooth_method="none", force=True)
  score = float(bleu.corpus_score(tok_hyps, [tok_refs]).score)
  logging.info("Tokenized (%s) BLEU %.2f", tokenized_bleu_method(lang, compound_split), score)
  return score


@functools.lru_cache(maxsize=8)
def _normalizer(lang: str) -> Any:  # sacremoses.MosesPunctNormalizer
  from sacremoses import MosesPunctNormalizer  # pylint: disable=g-import-not-at-top

  # normalize-punctuation.perl's defaults (sacremoses' penn=True is the script without -penn),
  # with its exact substitutions.
  return MosesPunctNormalizer(lang=lang, perl_parity=True)


def tokenize_lowercased(text: str, lang: str) -> str:
  """Multi30k's task-1 tokenization of one line: lowercase, normalize punctuation, then
  tokenizer.perl -l `lang` (escaping on, no -a), as task1-tokenize.sh pipes them."""
  normalized = _normalizer(lang).normalize(text.lower())
  return _moses(lang).tokenize(normalized, return_str=True, escape=True)


def protocol_bleu(
  hyps: Sequence[str], refs: Sequence[str], lang: str, protocol: str = "multi30k"
) -> tuple[float, str]:
  """BLEU4 by a published protocol, and its signature. "multi30k": hypothesis and reference
  each lowercased, punctuation-normalized and Moses-tokenized (`tokenize_lowercased`), then
  corpus BLEU4 on those tokens (sacrebleu tokenize="none", no smoothing: multi-bleu.perl's and
  fairseq's BLEU4). This is how the Multi30k papers (Elliott et al.'s shared tasks, Wu et al.
  2021) score test2016; no compound split."""
  if protocol not in BLEU_PROTOCOLS or not protocol:
    raise ValueError(f"Unknown BLEU protocol {protocol!r}; choose one of {BLEU_PROTOCOLS[1:]}.")
  _check_lengths(hyps, refs)
  tok_hyps = [tokenize_lowercased(h, lang) for h in hyps]
  tok_refs = [tokenize_lowercased(r, lang) for r in refs]
  bleu = BLEU(tokenize="none", smooth_method="none", force=True)
  score = float(bleu.corpus_score(tok_hyps, [tok_refs]).score)
  signature = f"{bleu.get_signature()}|pre:lc+norm-punct+moses-{lang}"
  logging.info("%s BLEU4 %.2f (%s)", protocol, score, signature)
  return score, signature


def score_and_write(
  hyps: Sequence[str],
  refs: Sequence[str],
  out_dir: str,
  name: str,
  tgt_lang: str,
  *,
  compound_split: bool | None = None,
  protocol: str = "",
  write: bool = True,
) -> dict[str, float | str | int]:
  """Scores hypotheses both ways and writes `<name>.hyp.txt` and `<name>.scores.json` to out_dir.

  Hypotheses go to disk one per line so any score can be recomputed later with other tools.
  `compound_split`: None = "auto" (German targets). `protocol` ("multi30k"): also BLEU4 by that
  protocol (`protocol_bleu`), as `<protocol>_bleu` with its signature. `write=False` only scores
  (the processes of a multi-process run other than process 0).
  """
  if compound_split is None:
    compound_split = splits_compounds("auto", tgt_lang)
  scores: dict[str, float | str | int] = {}
  sacre, signature = sacrebleu_score(hyps, refs)
  scores["sacrebleu"] = sacre
  scores["sacrebleu_signature"] = signature
  scores["tokenized_bleu"] = tokenized_bleu(hyps, refs, tgt_lang, compound_split)
  scores["tokenized_bleu_method"] = tokenized_bleu_method(tgt_lang, compound_split)
  scores["chrf"], scores["chrf_signature"] = chrf_score(hyps, refs)
  if protocol:
    bleu4, bleu4_signature = protocol_bleu(hyps, refs, tgt_lang, protocol)
    scores[f"{protocol}_bleu"], scores[f"{protocol}_bleu_signature"] = bleu4, bleu4_signature
  scores["num_sentences"] = len(hyps)
  if not write:
    return scores
  hyp_path = os.path.join(out_dir, f"{name}.hyp.txt")
  files.write_lines(hyp_path, hyps)  # one line each, whatever a hypothesis contains
  score_path = os.path.join(out_dir, f"{name}.scores.json")
  files.write_text(score_path, json.dumps(scores, indent=2, ensure_ascii=False) + "\n")
  logging.info("Wrote %s and %s.", hyp_path, score_path)
  return scores
