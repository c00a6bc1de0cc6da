"""Both BLEU flavours against sacrebleu and sacremoses called directly, and ##AT## split by hand."""

from __future__ import annotations

import json

import pytest
import sacrebleu

from flaxformer_nmt.decoding import bleu

# German hypotheses and references with compounds, punctuation, quotes and umlauts.
HYPS = [
  "Die E-Mail-Adresse ist gültig.",
  'Der Preis ist 5,50 € für "Wein-Proben".',
  "Sie wurde 1999 in Köln geboren.",
  "Das ist ein Test-Fall.",
]
REFS = [
  "Die E-Mail-Adresse ist nicht gültig.",
  'Der Preis beträgt 5,50 € für "Wein-Proben".',
  "Sie wurde 1999 in Köln geboren.",
  "Das ist ein Prüf-Fall.",
]


def test_sacrebleu_score_is_cased_13a_sacrebleu():
  score, signature = bleu.sacrebleu_score(HYPS, REFS)
  expected = sacrebleu.corpus_bleu(HYPS, [REFS])  # defaults: 13a, cased
  assert score == pytest.approx(expected.score, abs=1e-9)
  assert 0 < score < 100
  assert "tok:13a" in signature and "case:mixed" in signature and "nrefs:1" in signature
  # Cased: lowercasing a hypothesis must cost points.
  lowered, _ = bleu.sacrebleu_score([h.lower() for h in HYPS], REFS)
  assert lowered < score


def test_chrf_is_sacrebleus_corpus_chrf():
  score, signature = bleu.chrf_score(HYPS, REFS)
  assert score == pytest.approx(sacrebleu.corpus_chrf(HYPS, [REFS]).score, abs=1e-9)
  assert 0 < score < 100 and score != pytest.approx(bleu.sacrebleu_score(HYPS, REFS)[0])
  assert "nc:6" in signature and "nw:0" in signature and "version:" in signature
  assert bleu.chrf_score(REFS, REFS)[0] == pytest.approx(100.0)


def test_compound_split_matches_t2t_perl_by_hand():
  # perl -ple 's{(\S)-(\S)}{$1 ##AT##-##AT## $2}g' on Moses output, written out by hand. Matches do
  # not overlap ("a-b-c" splits once); a hyphen next to a space is left alone.
  assert (
    bleu.tokenize_for_paper_bleu("Die E-Mail-Adresse ist gültig.", "de")
    == "Die E ##AT##-##AT## Mail ##AT##-##AT## Adresse ist gültig ."
  )
  assert bleu.tokenize_for_paper_bleu("a-b-c x -y z- w", "de") == ("a ##AT##-##AT## b-c x -y z- w")
  assert bleu.tokenize_for_paper_bleu("über-all 3-4", "de") == (
    "über ##AT##-##AT## all 3 ##AT##-##AT## 4"
  )
  # Moses escaping (tokenizer.perl's default) and language-aware rules.
  assert bleu.tokenize_for_paper_bleu('"Wein-Proben" & Käse', "de") == (
    "&quot; Wein ##AT##-##AT## Proben &quot; &amp; Käse"
  )
  assert bleu.tokenize_for_paper_bleu("It's well-known.", "en") == (
    "It &apos;s well ##AT##-##AT## known ."
  )


def test_tokenized_bleu_equals_sacremoses_then_sacrebleu_none():
  from sacremoses import MosesTokenizer  # pylint: disable=g-import-not-at-top  (slow import)

  moses = MosesTokenizer(lang="de")

  def paper_tok(s: str) -> str:
    tok = moses.tokenize(s, return_str=True, escape=True)
    return bleu._COMPOUND_HYPHEN.sub(r"\1 ##AT##-##AT## \2", tok)

  expected = sacrebleu.corpus_bleu(
    [paper_tok(h) for h in HYPS],
    [[paper_tok(r) for r in REFS]],
    tokenize="none",
    smooth_method="none",
    force=True,
  ).score
  assert bleu.tokenized_bleu(HYPS, REFS, lang="de") == pytest.approx(expected, abs=1e-9)
  # The split is applied to both sides: "Test-Fall" vs "Prüf-Fall" share "##AT##-##AT##" and
  # "Fall" only once split, so the paper's flavour scores higher than without the split.
  unsplit = sacrebleu.corpus_bleu(
    [moses.tokenize(h, return_str=True, escape=True) for h in HYPS],
    [[moses.tokenize(r, return_str=True, escape=True) for r in REFS]],
    tokenize="none",
    smooth_method="none",
    force=True,
  ).score
  assert bleu.tokenized_bleu(HYPS, REFS, lang="de") > unsplit


def test_compound_split_only_for_german_targets_unless_asked():
  """t2t's ##AT## split belongs to its EN-DE script: "auto" splits for German targets only, so
  EN-FR's tokenized BLEU is Moses + multi-bleu as the paper's 41.8."""
  assert bleu.splits_compounds("auto", "de") and not bleu.splits_compounds("auto", "fr")
  assert bleu.splits_compounds("on", "fr") and not bleu.splits_compounds("off", "de")
  with pytest.raises(ValueError, match="compound_split 'yes'"):
    bleu.splits_compounds("yes", "de")
  hyps = ["C'est un porte-monnaie bien rempli.", "Le week-end est là."]
  refs = ["C'est un porte-clés bien rempli.", "Le week-end arrive."]
  from sacremoses import MosesTokenizer  # pylint: disable=g-import-not-at-top  (slow import)

  moses = MosesTokenizer(lang="fr")
  plain = sacrebleu.corpus_bleu(
    [moses.tokenize(h, return_str=True, escape=True) for h in hyps],
    [[moses.tokenize(r, return_str=True, escape=True) for r in refs]],
    tokenize="none",
    smooth_method="none",
    force=True,
  ).score
  assert bleu.tokenized_bleu(hyps, refs, "fr", compound_split=False) == pytest.approx(plain)
  assert bleu.tokenized_bleu(hyps, refs, "fr", compound_split=True) != pytest.approx(plain)
  scores = bleu.score_and_write(hyps, refs, "", "test", tgt_lang="fr", write=False)
  assert scores["tokenized_bleu_method"] == "moses-fr"
  assert scores["tokenized_bleu"] == pytest.approx(plain)


def test_identical_and_disjoint_corpora():
  assert bleu.tokenized_bleu(REFS, REFS) == pytest.approx(100.0)
  assert bleu.sacrebleu_score(REFS, REFS)[0] == pytest.approx(100.0)
  assert bleu.tokenized_bleu(["x y z w"] * 4, REFS) == 0.0  # no smoothing, as multi-bleu


def test_mismatched_lengths_fail_loudly():
  with pytest.raises(ValueError, match="one hypothesis per reference"):
    bleu.sacrebleu_score(HYPS, REFS[:2])


def test_score_and_write(tmp_path):
  hyps = HYPS[:-1] + ["Zwei\nZeilen"]  # a stray line break must not add a line
  scores = bleu.score_and_write(hyps, REFS, str(tmp_path / "out"), "test", tgt_lang="de")
  assert set(scores) == {
    "sacrebleu",
    "sacrebleu_signature",
    "tokenized_bleu",
    "tokenized_bleu_method",
    "chrf",
    "chrf_signature",
    "num_sentences",
  }
  assert scores["chrf"] == pytest.approx(sacrebleu.corpus_chrf(hyps, [REFS]).score)
  assert scores["tokenized_bleu_method"] == "moses-de+##AT##"
  assert scores["num_sentences"] == 4
  assert scores["sacrebleu"] == pytest.approx(sacrebleu.corpus_bleu(hyps, [REFS]).score)
  lines = (tmp_path / "out" / "test.hyp.txt").read_text(encoding="utf-8").split("\n")
  assert lines[:3] == HYPS[:3] and lines[3] == "Zwei Zeilen" and lines[4] == ""
  on_disk = json.loads((tmp_path / "out" / "test.scores.json").read_text(encoding="utf-8"))
  assert on_disk == scores


def test_the_multi30k_protocol_lowercases_normalizes_and_moses_tokenizes():
  """task1-tokenize.sh's lowercase.perl | normalize-punctuation.perl -l de | tokenizer.perl -l de
  (escaping on, no -a): German quotes become ", then &quot;; hyphenated words stay whole."""
  assert bleu.tokenize_lowercased("„Ein Hund“ & eine Katze, 3,5 m groß...", "de") == (
    "&quot; ein hund &quot; &amp; eine katze , 3,5 m groß ..."
  )
  assert bleu.tokenize_lowercased("Ein saftig-grünes Gras.", "de") == "ein saftig-grünes gras ."


def test_the_multi30k_protocol_by_hand_and_on_the_reference_itself():
  """BLEU4 on the protocol's tokens: a reference scored against itself is 100; one sentence of
  7 tokens with 6/7, 4/6, 2/5 and 1/4 n-gram matches and no brevity penalty is their geometric
  mean, computed here by hand. The hypothesis' case and spacing do not count."""
  ref = "ein mann läuft über eine straße ."
  score, signature = bleu.protocol_bleu(["Ein Mann läuft über die Straße."], [ref], "de")
  assert score == pytest.approx(100 * (6 / 7 * 4 / 6 * 2 / 5 * 1 / 4) ** 0.25, abs=1e-9)
  assert signature.endswith(
    "|tok:none|smooth:none|version:" + sacrebleu.__version__ + "|pre:lc+norm-punct+moses-de"
  )
  refs = ["Zwei Hunde spielen im Schnee.", "Ein Kind mit einem „roten“ Ball."]
  assert bleu.protocol_bleu(refs, refs, "de")[0] == pytest.approx(100.0)
  with pytest.raises(ValueError, match="Unknown BLEU protocol 'wmt'"):
    bleu.protocol_bleu(refs, refs, "de", "wmt")


def test_score_and_write_adds_the_protocols_bleu(tmp_path):
  scores = bleu.score_and_write(
    ["Ein Mann läuft über die Straße."],
    ["Ein Mann läuft über eine Straße."],
    str(tmp_path),
    "x",
    "de",
    compound_split=False,
    protocol="multi30k",
  )
  assert scores["multi30k_bleu"] == pytest.approx(100 * (6 / 7 * 4 / 6 * 2 / 5 * 1 / 4) ** 0.25)
  assert scores["multi30k_bleu_signature"].endswith("pre:lc+norm-punct+moses-de")
  assert (
    json.loads((tmp_path / "x.scores.json").read_text())["multi30k_bleu"] == scores["multi30k_bleu"]
  )
