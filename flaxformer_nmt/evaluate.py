"""BLEU, two ways: sacreBLEU (today's standard) and the paper's tokenized, compound-split BLEU.

The paper's 27.3 / 28.4 (EN-DE) come from tensor2tensor's `get_ende_bleu.sh`: Moses-tokenize
hypotheses and references, split hyphenated compounds as `##AT##-##AT##` (as GNMT and ConvS2S did),
then `multi-bleu.perl`. Splitting hyphens creates extra matching tokens, so that number runs higher
than sacreBLEU's detokenized, 13a-tokenized score; a paper comparison needs the former, a
comparison with today's literature the latter. We never write BLEU ourselves: both go through
sacrebleu, and the Moses tokenizer is sacremoses' port of tokenizer.perl.
"""

from __future__ import annotations

import functools
import json
import os
import re
from typing import Sequence

from absl import logging
from sacrebleu.metrics import BLEU
from sacremoses import MosesTokenizer

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


@functools.lru_cache(maxsize=8)
def _moses(lang: str) -> MosesTokenizer:
  return MosesTokenizer(lang=lang)


def tokenize_for_paper_bleu(text: str, lang: str) -> str:
  """tokenizer.perl -l `lang` (escaping on, as its default), then the ##AT## compound split."""
  tokenized = _moses(lang).tokenize(text, return_str=True, escape=True)
  return _COMPOUND_HYPHEN.sub(r"\1 ##AT##-##AT## \2", tokenized)


def tokenized_bleu(hyps: Sequence[str], refs: Sequence[str], lang: str = "de") -> float:
  """The paper's BLEU (t2t get_ende_bleu.sh): Moses + ##AT## on both sides, then multi-bleu.

  sacrebleu with `tokenize='none'` scores the already-tokenized text as multi-bleu.perl does
  (cased, one reference, no smoothing: a zero n-gram precision gives 0, as multi-bleu's does).
  """
  _check_lengths(hyps, refs)
  tok_hyps = [tokenize_for_paper_bleu(h, lang) for h in hyps]
  tok_refs = [tokenize_for_paper_bleu(r, lang) for r in refs]
  bleu = BLEU(tokenize="none", smooth_method="none", force=True)
  score = float(bleu.corpus_score(tok_hyps, [tok_refs]).score)
  logging.info("Tokenized (Moses %s + ##AT##) BLEU %.2f", lang, score)
  return score


def score_and_write(
    hyps: Sequence[str],
    refs: Sequence[str],
    out_dir: str,
    name: str,
    tgt_lang: str,
    *,
    write: bool = True,
) -> dict[str, float | str | int]:
  """Scores hypotheses both ways and writes `<name>.hyp.txt` and `<name>.scores.json` to out_dir.

  Hypotheses go to disk one per line so any score can be recomputed later with other tools.
  `write=False` only scores (the processes of a multi-process run other than process 0).
  """
  scores: dict[str, float | str | int] = {}
  sacre, signature = sacrebleu_score(hyps, refs)
  scores["sacrebleu"] = sacre
  scores["sacrebleu_signature"] = signature
  scores["tokenized_bleu"] = tokenized_bleu(hyps, refs, lang=tgt_lang)
  scores["num_sentences"] = len(hyps)
  if not write:
    return scores
  os.makedirs(out_dir, exist_ok=True)
  hyp_path = os.path.join(out_dir, f"{name}.hyp.txt")
  with open(hyp_path, "w", encoding="utf-8") as f:
    for h in hyps:
      # A line break inside a hypothesis would shift every later line against the references.
      f.write(h.replace("\r", " ").replace("\n", " ") + "\n")
  score_path = os.path.join(out_dir, f"{name}.scores.json")
  with open(score_path, "w", encoding="utf-8") as f:
    json.dump(scores, f, indent=2, ensure_ascii=False)
    f.write("\n")
  logging.info("Wrote %s and %s.", hyp_path, score_path)
  return scores
