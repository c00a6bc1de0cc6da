"""M2M100 / NLLB-200's model options (issue 62), against transformers' definitions written out in
numpy here (modeling_m2m_100.py of transformers 5.24; no torch needed): the position table and the
decoder's start symbol."""

from __future__ import annotations

import math

import jax
import model_params
import numpy as np

from flaxformer_nmt.model import layers
from flaxformer_nmt.model.tokens import EOS_ID, PAD_ID
from flaxformer_nmt.model.transformer import Transformer, TransformerConfig


def _their_table(num_embeddings: int, dim: int, padding_idx: int = 1) -> np.ndarray:
  """M2M100SinusoidalPositionalEmbedding.get_embedding: [num_embeddings, dim]."""
  half = dim // 2
  step = math.log(10000) / (half - 1)
  freq = np.exp(np.arange(half, dtype=np.float64) * -step)
  angles = np.arange(num_embeddings, dtype=np.float64)[:, None] * freq[None, :]
  table = np.concatenate([np.sin(angles), np.cos(angles)], axis=1)
  table[padding_idx] = 0
  return table


def _their_positions(input_ids: np.ndarray, padding_idx: int = 1) -> np.ndarray:
  """create_position_ids_from_input_ids: each real token's 1-based index + padding_idx."""
  mask = (input_ids != padding_idx).astype(np.int64)
  return np.cumsum(mask, axis=1) * mask + padding_idx


def test_the_m2m100_table_is_transformers_at_the_same_tokens():
  d, length = 16, 40
  ids = np.full((1, length), 7)  # fairseq ids, none of them its pad (1)
  theirs = _their_table(length + 2 + 2, d)[_their_positions(ids)[0]]  # [length, d]
  ours = np.asarray(layers.m2m100_encoding(jax.numpy.arange(length), d))
  np.testing.assert_allclose(ours, theirs, atol=2e-6)
  # Not the paper's table (interleaved, other frequencies): the option changes what is added.
  paper = np.asarray(layers.sinusoidal_encoding(jax.numpy.arange(length), d))
  assert np.abs(paper - ours).max() > 0.5


def test_the_decoder_starts_from_eos_and_reads_no_pad_row():
  """decoder_start="eos": the first position reads `</s>`'s embedding (transformers'
  decoder_start_token_id=2 in M2M100): changing the PAD row changes no real logit, changing the
  EOS row changes the first position's."""
  cfg = TransformerConfig(vocab_size=20, num_layers=1, d_model=16, d_ff=32, num_heads=2)
  eos_cfg = TransformerConfig(**{**cfg.__dict__, "decoder_start": "eos"})
  params = model_params.random_params(cfg)
  src = np.array([[5, 6, 7, EOS_ID]], np.int32)
  tgt = np.array([[8, 9, EOS_ID]], np.int32)

  def logits(config, table):
    p = {**params, "embedding": {"embedding": table}}
    return np.asarray(Transformer(config).apply({"params": p}, src, tgt))[0]  # [T, V]

  table = np.asarray(params["embedding"]["embedding"])
  other_pad, other_eos = table.copy(), table.copy()
  other_pad[PAD_ID] += 1.0
  other_eos[EOS_ID] += 1.0
  real = [i for i in range(20) if i != PAD_ID]  # the PAD column is its row's own dot product
  base = logits(eos_cfg, table)
  np.testing.assert_allclose(logits(eos_cfg, other_pad)[:, real], base[:, real], atol=1e-6)
  assert np.abs(logits(eos_cfg, other_eos)[0] - base[0]).max() > 1e-3
  # The paper's start (PAD) reads the PAD row.
  assert np.abs(logits(cfg, other_pad)[0, real] - logits(cfg, table)[0, real]).max() > 1e-3


def test_weights_to_m2m100_and_back_are_bitwise_and_every_weight_is_used():
  from flaxformer_nmt.export import m2m100  # pylint: disable=g-import-not-at-top

  cfg = TransformerConfig(
    vocab_size=30,
    num_layers=2,
    num_decoder_layers=1,
    d_model=16,
    d_ff=32,
    num_heads=2,
    pre_ln=True,
    positional="m2m100",
    decoder_start="eos",
    attention_bias=True,
  )
  params = model_params.random_params(cfg)
  rng = np.random.default_rng(0)
  params = jax.tree.map(lambda x: rng.normal(size=x.shape).astype(np.float32), params)
  order = np.concatenate([[1, 2, 3, 0], np.arange(4, 30)])  # fairseq: <s> 0, <pad> 1, </s> 2
  sd = m2m100.to_m2m100(params, order, 2, 1)
  assert "final_logits_bias" not in sd and "model.encoder.layer_norm.weight" in sd
  assert sum(v.size for v in sd.values()) == sum(np.size(v) for v in jax.tree.leaves(params))
  np.testing.assert_array_equal(sd["model.shared.weight"][1], params["embedding"]["embedding"][0])
  back = m2m100.to_ours(sd, order, 2, 1)
  jax.tree.map(np.testing.assert_array_equal, params, back)
