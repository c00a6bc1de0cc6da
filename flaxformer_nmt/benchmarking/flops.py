"""Analytic FLOP counts of the Transformer, for MFU in the benchmarks and their cost estimates.

In the package, not in benchmarks/, so the benchmarks and tests import it like any module (no
sys.path edits) and a test holds it against XLA's cost analysis (tests/unit/test_flops.py).

Counts every matrix product (2 FLOPs per multiply-add); element-wise work (softmax, layer norm,
dropout, the loss) is left out, as MFU conventionally does. For a packed batch of `rows` rows of
`row_len` tokens on each side, per layer and per token:

  encoder self-attention   Q, K, V, O projections  8 D^2     scores + values  4 row_len D
  decoder self-attention   8 D^2 + 4 row_len D
  decoder cross-attention  Q, O: 4 D^2 per target token; K, V: 4 D^2 per source token;
                           scores + values 4 row_len D per target token
  feed-forward (both)      4 D F
  logits (once)            2 D V per target token

Attention is counted over the whole row (row_len keys), since that is what runs: packing masks
other sentences out but does not skip them. Backward costs twice the forward (a gradient for the
activations and one for the weights), so a training step is 3x forward. The base model at
row_len 64 and V = 37,000 does ~128 MFLOP forward per target token. With queries and keys Q wide
instead of D (Table 3 row B), each Q or K projection costs 2 D Q instead of 2 D^2, and the scores
2 row_len Q instead of 2 row_len D.
"""

from __future__ import annotations


def forward_flops(
  *,
  num_layers: int,
  d_model: int,
  d_ff: int,
  vocab_size: int,
  src_tokens: int,
  tgt_tokens: int,
  row_len: int,
  d_qk: int = 0,
) -> float:
  """Matrix-product FLOPs of one teacher-forced forward pass (loss not included).

  `d_qk`: the width of all heads' queries (and keys) together, num_heads * d_k; 0 = d_model.
  """
  d, f = float(d_model), float(d_ff)
  q = float(d_qk or d_model)
  attention = 2.0 * row_len * (q + d)  # QK^T and AV, per query token
  projections = 4 * d * q + 4 * d * d  # Q, K, V and O, per token
  encoder = src_tokens * (projections + attention + 4 * d * f)
  decoder = tgt_tokens * (projections + attention)
  decoder += tgt_tokens * (2 * d * q + 2 * d * d + attention)  # cross-attention: Q and O
  decoder += src_tokens * (2 * d * q + 2 * d * d) + tgt_tokens * 4 * d * f  # its K and V
  logits = tgt_tokens * 2 * d * vocab_size
  return num_layers * (encoder + decoder) + logits


def train_step_flops(**kwargs: int) -> float:
  """Forward + backward (2x forward) of one training step; keywords as `forward_flops`."""
  return 3.0 * forward_flops(**kwargs)
