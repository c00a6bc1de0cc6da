"""translate: one output line per input line, in order, through sorting, bucketing, truncation."""

from __future__ import annotations

import ml_collections
import model_params
import numpy as np

from flaxformer_nmt.config import builders as config_lib
from flaxformer_nmt.decoding import translator as translate
from flaxformer_nmt.model.tokens import EOS_ID, PAD_ID
from flaxformer_nmt.model.transformer import Transformer, TransformerConfig

import helpers

CharTokenizer = helpers.CharTokenizer


class ReversingDecoder:
  """A stand-in model: outputs each source reversed (EOS, then PAD); records the shapes it saw."""

  def __init__(self) -> None:
    self.shapes: list[tuple[int, int]] = []
    self.rows = 0

  def __call__(self, inputs: np.ndarray, line_ids: np.ndarray) -> np.ndarray:
    assert line_ids.shape == (inputs.shape[0],)
    self.shapes.append(inputs.shape)
    out = np.zeros((inputs.shape[0], inputs.shape[1] + 2), np.int32)
    for r, row in enumerate(inputs):
      ids = [int(i) for i in row if i not in (PAD_ID, EOS_ID)]
      if not ids:
        assert np.all(row == PAD_ID)  # only filler rows are empty; real lines keep their EOS
        continue
      assert EOS_ID in row  # sources end in EOS, as in training
      self.rows += 1
      out[r, : len(ids) + 1] = [*ids[::-1], EOS_ID]
    return out


LINES = [
  "Hello world.",
  "",
  "Grüße aus Köln — 東京 und Zürich!",
  "   ",
  "x" * 50 + "END",  # longer than the model takes
  "a",
  "naïve café\u2028second part",  # U+2028 is inside a line, not a line break
  "Ünïcödé ",
  "",
  "mid-length line of text",
  "b" * 30,
]


def test_order_count_empty_and_truncation_with_a_stub_model():
  decoder = ReversingDecoder()
  translator = translate.Translator(CharTokenizer(), decoder, batch_size=3, max_src_len=20)
  out = translator.translate(LINES)
  assert len(out) == len(LINES)
  for line, got in zip(LINES, out, strict=True):
    if not line.strip():
      assert got == ""
    elif len(line) + 1 > 20:
      assert got == line[:19][::-1]  # 19 tokens and EOS
    else:
      assert got == line[::-1]
  stats = translator.stats
  too_long = sum(len(s) + 1 > 20 for s in LINES if s.strip())
  assert too_long == 5
  assert (stats.num_lines, stats.num_empty, stats.num_truncated) == (11, 3, too_long)
  assert decoder.rows == 8  # empty lines never reach the model
  # Fixed batch size and bucketed lengths: jit sees a bounded set of shapes.
  assert all(s[0] == 3 for s in decoder.shapes)
  assert {s[1] for s in decoder.shapes} <= set(translate.bucket_lengths(20))
  assert len(decoder.shapes) == 3  # ceil(8 / 3)


def test_sorted_batches_are_length_homogeneous():
  lines = [("w" * n) for n in (1, 40, 2, 39, 3, 38, 4, 37)]
  decoder = ReversingDecoder()
  out = translate.Translator(CharTokenizer(), decoder, batch_size=4, max_src_len=64).translate(
    lines
  )
  assert out == [s[::-1] for s in lines]
  assert sorted(s[1] for s in decoder.shapes) == [8, 48]  # short ones together, long ones together


def test_bucket_lengths():
  assert translate.bucket_lengths(20) == [8, 12, 16, 20]
  assert translate.bucket_lengths(256) == [8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256]


def test_translating_lines_with_the_tiny_model(tmp_path):
  """The real (untrained) model: count, order and empties survive; a line's translation does not
  depend on where it stands in the input or on its batch-mates."""
  c = helpers.narrow(config_lib.base_config("tiny"))
  vocab = 40
  model = Transformer(TransformerConfig.from_config(c.model, vocab_size=vocab))
  params = model_params.random_params(model.cfg)
  decode_config = ml_collections.ConfigDict(
    dict(beam_size=2, alpha=0.6, max_len_offset=3, batch_size=4)
  )
  tokenizer = CharTokenizer(vocab_size=vocab)
  lines = ["Grüße", "", "東京 und Zürich", "ab", "   ", "eine sehr lange Zeile!", "c", "naïve"]

  def translate_lines(lines, beam_size=None):
    return helpers.translator(
      tokenizer, model, params, decode_config, 8, beam_size=beam_size
    ).translate(lines)

  out = translate_lines(lines)
  assert len(out) == len(lines)
  assert [o == "" for o in out] == [not s.strip() for s in lines]
  # The untrained model never says EOS first.
  assert all(o for o, s in zip(out, lines, strict=True) if s.strip())
  assert all(len(o) <= 8 + 3 for o in out)  # source (cut to 8) + max_len_offset

  perm = [7, 4, 2, 0, 6, 1, 5, 3]
  shuffled = translate_lines([lines[i] for i in perm])
  assert shuffled == [out[i] for i in perm]

  translator = helpers.translator(tokenizer, model, params, decode_config, 8)
  assert translator.translate(lines) == out
  stats = translator.stats.as_dict()
  assert stats["num_lines"] == 8 and stats["num_empty"] == 2 and stats["num_truncated"] == 2
  greedy = translate_lines(lines, beam_size=1)
  assert len(greedy) == len(lines) and [o == "" for o in greedy] == [o == "" for o in out]
