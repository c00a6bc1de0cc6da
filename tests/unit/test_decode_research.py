"""n-best lists, sampling, ensembles and alignments through the model and the translator, in
process (tests/e2e/test_decode_research.py runs them through main.py).

test_search_research.py checks the searches against exact answers on hand-made distributions;
here the same features run on the Transformer (an untrained tiny one, a hand-built one, or the
committed small trained workdir).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import ml_collections
import model_params
import numpy as np
import pytest

from flaxformer_nmt import modes
from flaxformer_nmt.config import builders as config_lib
from flaxformer_nmt.decoding import alignments, decode
from flaxformer_nmt.decoding import translator as translate
from flaxformer_nmt.model.tokens import EOS_ID, PAD_ID, UNK_ID
from flaxformer_nmt.model.transformer import Transformer, TransformerConfig

import helpers

# One xdist worker runs the module: its module fixture (`tiny`) is built once, not per worker.
pytestmark = pytest.mark.xdist_group("decode_research")

LINES = ["Grüße aus Köln", "", "ab cd", "eine sehr lange Zeile!", "c", "naïve ding"]


@pytest.fixture(scope="module")
def tiny():
  c = helpers.narrow(config_lib.base_config("tiny"))
  vocab = 40
  model = Transformer(TransformerConfig.from_config(c.model, vocab_size=vocab))
  params = model_params.random_params(model.cfg)
  return model, params, vocab


def _decode_config(**fields) -> ml_collections.ConfigDict:
  base = dict(beam_size=3, alpha=0.6, max_len_offset=3, batch_size=4, method="beam")
  base.update(temperature=1.0, top_k=0, top_p=1.0, seed=0, alignment_layer=-1)
  return ml_collections.ConfigDict({**base, **fields})


def _translate(lines, tokenizer, model, params, decode_config, max_src_len, *, beam_size=None):
  translator = helpers.translator(
    tokenizer, model, params, decode_config, max_src_len, beam_size=beam_size
  )
  return translator.translate(lines)


def _sample_lines(tiny, lines, **fields):
  model, params, vocab = tiny
  return _translate(
    lines,
    helpers.CharTokenizer(vocab_size=vocab),
    model,
    params,
    _decode_config(**{"method": "sample", **fields}),
    16,
  )


@pytest.mark.slow  # over 10 s cold (docs/developing.md)
def test_samples_depend_on_the_seed_and_line_only(tiny):
  """The same seed and lines give the same samples however they are batched (other batch-mates,
  other padded lengths); another seed gives other samples; top_k=1 gives greedy output."""
  first = _sample_lines(tiny, LINES)
  assert [o == "" for o in first] == [not s.strip() for s in LINES]
  assert _sample_lines(tiny, LINES, batch_size=1) == first
  assert _sample_lines(tiny, LINES, batch_size=2) == first
  assert _sample_lines(tiny, LINES, seed=1) != first
  model, params, vocab = tiny
  greedy = _translate(
    LINES, helpers.CharTokenizer(vocab_size=vocab), model, params, _decode_config(), 16, beam_size=1
  )
  assert _sample_lines(tiny, LINES, top_k=1) == greedy


def test_a_sample_does_not_depend_on_padding_or_batch_mates(tiny):
  """What differs between device counts is a row's padding and batch-mates: neither changes it."""
  model, params, _ = tiny
  search = decode.SearchConfig(method="sample", alpha=0.6, max_len_offset=4, nbest=2)
  row = [5, 9, 7, EOS_ID]
  short = np.array([row + [PAD_ID] * 4], np.int32)  # [1, 8]
  long = np.zeros((3, 16), np.int32)
  long[1, :4] = row
  long[0, :6] = [3, 4, 5, 6, 7, EOS_ID]
  a = decode.decode_batch(model, params, jnp.asarray(short), search, line_ids=jnp.asarray([7]))
  b = decode.decode_batch(
    model, params, jnp.asarray(long), search, line_ids=jnp.asarray([0, 7, 2], jnp.int32)
  )
  np.testing.assert_array_equal(a.tokens[0], b.tokens[1, :, : a.tokens.shape[-1]])
  np.testing.assert_allclose(a.normalized_scores[0], b.normalized_scores[1], rtol=1e-5)


def test_nbest_samples_are_ranked_and_differ(tiny):
  model, params, vocab = tiny
  translator = helpers.translator(
    helpers.CharTokenizer(vocab_size=vocab),
    model,
    params,
    _decode_config(method="sample"),
    16,
    nbest=4,
  )
  hyps = translator.translate_nbest(LINES)
  assert [len(h) for h in hyps] == [4] * len(LINES)
  for line, h in zip(LINES, hyps, strict=True):
    scores = [x.score for x in h]
    assert scores == sorted(scores, reverse=True)
    if line.strip():
      assert len({x.text for x in h}) > 1  # an untrained model over 40 tokens: samples differ
    else:
      assert all(x.text == "" and x.score == 0.0 for x in h)


def test_beam_nbest_through_the_translator_and_its_tsv(tiny):
  model, params, vocab = tiny
  tokenizer = helpers.CharTokenizer(vocab_size=vocab)
  best = _translate(LINES, tokenizer, model, params, _decode_config(), 16)
  translator = helpers.translator(tokenizer, model, params, _decode_config(), 16, nbest=3)
  hyps = translator.translate_nbest(LINES)
  assert [h[0].text for h in hyps] == best
  for h in hyps:
    assert [x.score for x in h] == sorted((x.score for x in h), reverse=True)
  rows = modes.translation_lines(hyps, modes.Outputs(nbest=3))
  assert len(rows) == 3 * len(LINES)
  for n, row in enumerate(rows):
    line, rank, score, text = row.split("\t")
    assert (int(line), int(rank)) == (n // 3, n % 3)
    assert float(score) == pytest.approx(hyps[n // 3][n % 3].score, abs=1e-6)
    assert text == hyps[n // 3][n % 3].text
  with pytest.raises(ValueError, match="nbest=4"):
    decode.SearchConfig(beam_size=3, nbest=4)


@pytest.mark.parametrize("method", ["beam", "sample"])
def test_an_ensemble_of_the_model_with_itself_is_the_model(tiny, method):
  model, params, _ = tiny
  search = decode.SearchConfig(beam_size=3, max_len_offset=4, method=method, nbest=2)
  inputs = jnp.asarray([[5, 9, 7, EOS_ID], [3, 4, EOS_ID, PAD_ID]], jnp.int32)
  one = decode.decode_batch(model, params, inputs, search)
  two = decode.decode_batch(model, decode.Ensemble((params, params)), inputs, search)
  np.testing.assert_array_equal(two.tokens, one.tokens)
  np.testing.assert_allclose(two.normalized_scores, one.normalized_scores, rtol=1e-4, atol=1e-5)
  other = model_params.random_params(model.cfg, seed=1)
  mixed = decode.decode_batch(model, decode.Ensemble((params, other)), inputs, search)
  assert not np.allclose(mixed.normalized_scores, one.normalized_scores)


class WordPieceTokenizer:
  """Characters as pieces, SentencePiece's word-start mark on each word's first one (ids wrap
  around a small vocabulary, as CharTokenizer's)."""

  def __init__(self, vocab_size: int) -> None:
    self.vocab_size = vocab_size
    self.ids: dict[str, int] = {}
    self.pieces: dict[int, str] = {}

  def _id(self, piece: str) -> int:
    if piece not in self.ids:
      i = 3 + (len(self.ids) % (self.vocab_size - 3))
      self.ids[piece] = i
      self.pieces.setdefault(i, piece)
    return self.ids[piece]

  def encode(self, text: str) -> list[int]:
    out = []
    for word in text.split():
      out += [self._id("\u2581" + word[0])] + [self._id(ch) for ch in word[1:]]
    return out

  def encode_target(self, text: str) -> list[int]:
    return self.encode(text)

  def id_to_piece(self, i: int) -> str:
    return self.pieces.get(int(i), "\u2581?")

  def decode(self, ids) -> str:
    pieces = []
    for i in ids:
      if i == EOS_ID:
        break
      if i != PAD_ID:
        pieces.append(self.id_to_piece(i))
    words: list[str] = []
    for p in pieces:  # a new word at each marked piece, and at the first (word_starts' rule)
      if p.startswith("\u2581") or not words:
        words.append(p.lstrip("\u2581"))
      else:
        words[-1] += p
    return " ".join(words)


def test_alignments_name_only_existing_words(tiny):
  model, params, _ = tiny
  lines = ["ein Haus steht dort", "", "zwei", "rote Autos fahren schnell vorbei"]
  tokenizer = WordPieceTokenizer(vocab_size=40)
  translator = helpers.translator(
    tokenizer, model, params, _decode_config(alignment_layer=0), 24, nbest=2, alignments=True
  )
  hyps = translator.translate_nbest(lines)
  pairs_seen = 0
  for line, h in zip(lines, hyps, strict=True):
    for hyp in h:
      assert hyp.alignment is not None
      if not line.strip():
        assert hyp.alignment == ""
        continue
      source_words, target_words = len(line.split()), len(hyp.text.split())
      for pair in hyp.alignment.split():
        i, j = (int(x) for x in pair.split("-"))
        assert 0 <= i < source_words and 0 <= j < target_words, (line, hyp)
        pairs_seen += 1
  assert pairs_seen > 0


def test_pharaoh_from_piece_positions():
  starts = alignments.word_starts(["\u2581a", "b", "\u2581c", "\u2581d", "e"])
  assert starts == [0, 0, 1, 2, 2]
  # A bare "▁" is a space, not a word: "a ,b" is two words (what text.split() counts).
  assert alignments.word_starts(["\u2581a", "\u2581", ",", "b"]) == [0, 1, 1, 1]
  assert alignments.word_starts(["\u2581", "\u2581x", "y", "\u2581"]) == [0, 0, 0, 0]
  assert alignments.word_starts(["x", "\u2581\u2581", "\u2581y"]) == [0, 1, 1]
  assert alignments.word_starts(["\u2581"]) == [0]
  # target pieces 0..3 (words 0, 0, 1, 1) aligned to source pieces 4, 0, -1 (none), 2
  assert alignments.pharaoh(starts, [0, 0, 1, 1], [4, 0, -1, 2]) == "0-0 1-1 2-0"


def test_an_unknown_output_piece_is_a_word_of_its_own(tmp_path):
  """SentencePiece decodes <unk> as " ⁇ ": a word of its own, and the piece after it starts
  another. Output word indices follow the decoded text's words, so none shifts after an <unk>
  (at 97ad9e1 every later index was one short); source words stay the input line's."""
  from flaxformer_nmt.data.tokenizer import train_tokenizer  # pylint: disable=g-import-not-at-top

  sentences = ["we need forty two chairs", "wir brauchen zweiundvierzig stuehle"] * 50
  tokenizer = train_tokenizer(sentences, str(tmp_path / "spm"), 60, model_type="bpe")
  piece = tokenizer.id_to_piece
  wir, brauchen = tokenizer.encode("wir"), tokenizer.encode("brauchen")
  inner = next(i for i in range(3, tokenizer.vocab_size) if not piece(i).startswith("\u2581"))
  for output in (
    wir + [UNK_ID] + brauchen,  # "wir ⁇ brauchen"
    wir + [UNK_ID, UNK_ID] + brauchen,  # "wir ⁇ ⁇ brauchen"
    [UNK_ID] + wir,  # "⁇ wir"
    wir + [UNK_ID, inner],  # "wir ⁇ <inner>": the piece after <unk> is a word without a "▁"
  ):
    words = tokenizer.decode(output).split()
    starts = alignments.word_starts([piece(i) for i in output], [i == UNK_ID for i in output])
    assert max(starts) + 1 == len(words), (output, words, starts)
  # Each output piece aligned to source piece 0 ("we"): every output word appears once, the last
  # one (after the <unk>) with its own index.
  source = tokenizer.encode("we need") + [EOS_ID]
  output = wir + [UNK_ID] + brauchen + [EOS_ID]
  positions = [0] * (len(output) - 1)
  pairs = alignments.pharaoh_of(tokenizer, source, output, positions).split()
  assert pairs == ["0-0", "0-1", "0-2"]


def test_alignment_layer_counts_from_the_top_and_is_validated():
  assert [alignments.alignment_layer(s, 6) for s in (-1, -2, 0, 5)] == [5, 4, 0, 5]
  assert alignments.alignment_layer(-2, 1) == 0  # fewer layers than asked for: the first
  c = config_lib.base_config("tiny")
  c.decode.alignment_layer = 2  # tiny has 2 layers: 0 and 1
  with pytest.raises(Exception, match="alignment_layer=2 names no decoder layer"):
    config_lib.validate(c)


def test_alignments_follow_the_cross_attention_of_a_hand_built_model():
  """A one-layer model whose cross-attention is known: every other sublayer adds nothing (its
  output projection is zero), positions are zero, each token's embedding is its own axis, and the
  cross-attention's query and key projections are the identity. So at output position t, whose
  decoder input is the previous output token (teacher forcing shifts the output right), the
  cross-attention peaks on the source position holding that token: the alignment of output token
  t is the source position of token t - 1. An off-by-one in the shift would give token t's."""
  import flax  # pylint: disable=g-import-not-at-top

  from flaxformer_nmt.decoding import model_step  # pylint: disable=g-import-not-at-top

  c = config_lib.base_config("tiny")
  c.model.update(num_layers=1, d_model=16, d_ff=16, num_heads=1, max_len=16)
  c.model.update(positional="learned", dtype="float32")
  model = Transformer(TransformerConfig.from_config(c.model, vocab_size=16))
  params = flax.core.unfreeze(model_params.random_params(model.cfg))
  eye, zero = np.eye(16, dtype=np.float32), np.zeros((16, 16), np.float32)
  params["embedding"]["embedding"] = eye
  for name in ("encoder_positions", "decoder_positions"):
    params[name]["pos_embedding"] = zero
  params["encoder_0"]["self_attention"]["out"] = zero
  params["decoder_0"]["self_attention"]["out"] = zero
  for layer in ("encoder_0", "decoder_0"):
    params[layer]["ffn"]["wo"] = {"kernel": zero, "bias": np.zeros(16, np.float32)}
  params["decoder_0"]["cross_attention"]["query"] = eye
  params["decoder_0"]["cross_attention"]["key"] = eye

  inputs = jnp.asarray([[5, 6, 7, 8, EOS_ID, PAD_ID]], jnp.int32)  # source words 0..3
  tokens = jnp.asarray([[6, 8, 5, 7, EOS_ID, PAD_ID, PAD_ID]], jnp.int32)
  # Jitted as the decoders run it (eagerly, every operation of the model is a program of its own).
  align = jax.jit(functools.partial(model_step.source_positions, model, layer=0))
  positions = np.asarray(align(params, inputs, tokens))[0]
  # t = 1..3: the inputs 6, 8, 5 sit at source positions 1, 3, 0; EOS and padding: none.
  assert positions[1:].tolist() == [1, 3, 0, -1, -1, -1]
  assert 0 <= positions[0] < 4  # after the start symbol, which no source token matches


def test_samples_are_the_same_on_one_device_as_on_eight(tiny):
  """The translator spreads a batch over every device (8 here); the same lines decoded by one
  device's jitted search, in one batch of as many rows, draw the same samples: a line's keys come
  from the seed, its number and the sample's index, not from where it is decoded."""
  model, params, vocab = tiny
  tokenizer = helpers.CharTokenizer(vocab_size=vocab)
  config = _decode_config(method="sample", seed=5)
  assert jax.device_count() == 8
  eight = helpers.translator(tokenizer, model, params, config, 16, nbest=2)
  search = decode.SearchConfig.from_config(config, nbest=2)

  def one_device(inputs, line_ids):
    return decode.decode_batch(
      model, params, jnp.asarray(inputs), search, line_ids=jnp.asarray(line_ids)
    )

  one = translate.Translator(
    tokenizer, one_device, batch_size=8, max_src_len=16, num_shards=1, nbest=2
  )
  ones, eights = one.translate_nbest(LINES), eight.translate_nbest(LINES)
  assert [[h.text for h in hyps] for hyps in ones] == [[h.text for h in hyps] for hyps in eights]
  assert any(h.text for hyps in ones for h in hyps)
  for a, b in zip(ones, eights, strict=True):  # the same samples, scored up to the float rounding
    assert [h.score for h in a] == pytest.approx([h.score for h in b], rel=1e-5)
