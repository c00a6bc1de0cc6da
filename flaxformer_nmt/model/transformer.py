"""The Transformer encoder-decoder of Vaswani et al. (2017), in Flax linen.

Reads top to bottom: config, encoder layer, decoder layer, the two stacks, the model. Residual
blocks are post-LN as in the paper, `LayerNorm(x + Dropout(Sublayer(x)))`; `pre_ln=True` gives
`x + Dropout(Sublayer(LayerNorm(x)))` with a final LayerNorm per stack, which trains more stably
at depth. One embedding matrix serves the source, the target and the pre-softmax projection.

Batches may be packed (several sentence pairs per row); `*_segmentation` ids keep attention inside
each pair and `*_position` restarts positions per pair. Without them a row is one sentence.

Mixed precision (`dtype=bfloat16` or `float16`): parameters stay float32 and are cast at each
matrix product; matrix products run in `dtype`, while the residual stream, layer norms, softmaxes,
logits and the loss are float32 (a residual added in bfloat16 loses the small updates of late
training; float16's range ends at 65,504, and its small gradients need the trainer's loss scale,
training/loss_scale.py). `remat`
recomputes each layer's activations in the backward pass instead of keeping them.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections

from flaxformer_nmt.model import attention as attention_layers
from flaxformer_nmt.model import layers
from flaxformer_nmt.model.tokens import EOS_ID, PAD_ID

Array = jax.Array

_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
  """Static hyper-parameters of the model (hashable, so jit can treat it as a constant)."""

  vocab_size: int
  num_layers: int = 6
  d_model: int = 512
  d_ff: int = 2048
  num_heads: int = 8
  d_k: int = 0  # one head's query/key width; 0 = d_model / num_heads (Table 3 row B varies it)
  dropout_rate: float = 0.1
  attention_dropout_rate: float = 0.0
  relu_dropout_rate: float = 0.0
  pre_ln: bool = False
  positional: str = "sinusoidal"
  share_embeddings: bool = True
  max_len: int = 256
  dtype: Any = jnp.float32  # of matrix products; see the module docstring
  remat: bool = False
  dropout_rng: str = "threefry16"  # how masks are drawn: choices.DROPOUT_RNGS
  attention: str = "auto"  # choices.ATTENTIONS (model/attention_choice.py)
  # Options a pretrained model may need (transformers' Marian, export/marian.py); the defaults are
  # the paper's. The activation of the feed-forward (choices.ACTIVATIONS); biases on the attention
  # projections; the layer norms' epsilon; the decoder's depth (0 = num_layers); a learned bias
  # added to the logits.
  activation: str = "relu"
  attention_bias: bool = False
  layer_norm_epsilon: float = 1e-6
  num_decoder_layers: int = 0
  logits_bias: bool = False
  # The decoder's first input (choices.DECODER_STARTS): "pad" (PAD_ID, the paper runs'), or "eos"
  # (EOS_ID: fairseq's and M2M100's `</s>`, transformers' decoder_start_token_id).
  decoder_start: str = "pad"
  # A LoRA run's dropout on its adapters' inputs (config.optim.lora_dropout; layers.py
  # `lora_dropout_term`): set by training only (training/state.py), which alone passes adapters.
  lora_dropout: float = 0.0
  # Training's output layer and loss in blocks of this many target positions (0: whole), so the
  # float32 [tokens, vocabulary] logits are never held at once (losses.blocked_output_loss).
  loss_block_tokens: int = 0

  @property
  def decoder_depth(self) -> int:
    return self.num_decoder_layers or self.num_layers

  @classmethod
  def from_config(
    cls, model: ml_collections.ConfigDict, vocab_size: int, auto_dtype: str = "float32"
  ) -> TransformerConfig:
    """Builds the model's config from `config.model` (checked by `config.checks.validate`).

    `auto_dtype` is what `model.dtype="auto"` resolves to on this machine
    (`parallel.auto_dtype()`: bfloat16 on TPUs and recent GPUs, float16 on older GPUs, float32
    on CPUs).
    """
    # Fields carry over by name, so a field added to both places needs no code here.
    copied = {f.name for f in dataclasses.fields(cls)} - {"vocab_size", "dtype", "lora_dropout"}
    dtype = auto_dtype if model.dtype == "auto" else model.dtype
    return cls(vocab_size=vocab_size, dtype=_DTYPES[dtype], **{k: model[k] for k in copied})


def _layer_norm(cfg: TransformerConfig, name: str) -> layers.LayerNorm:
  # Always float32 (statistics and output), whatever the matmul dtype: see the module docstring.
  return layers.LayerNorm(epsilon=cfg.layer_norm_epsilon, dtype=jnp.float32, name=name)


def _attention(cfg: TransformerConfig, name: str) -> attention_layers.MultiHeadAttention:
  return attention_layers.MultiHeadAttention(
    cfg.num_heads,
    cfg.d_model,
    cfg.attention_dropout_rate,
    cfg.dtype,
    dropout_kind=cfg.dropout_rng,
    implementation=cfg.attention,
    d_k=cfg.d_k,
    use_bias=cfg.attention_bias,
    lora_dropout=cfg.lora_dropout,
    name=name,
  )


def _feed_forward(cfg: TransformerConfig) -> layers.FeedForward:
  return layers.FeedForward(
    cfg.d_model,
    cfg.d_ff,
    cfg.relu_dropout_rate,
    cfg.dtype,
    cfg.dropout_rng,
    activation=cfg.activation,
    lora_dropout=cfg.lora_dropout,
    name="ffn",
  )


class Residual(nn.Module):
  """One residual block around a sub-layer, post-LN (the paper) or pre-LN."""

  cfg: TransformerConfig

  @nn.compact
  def __call__(self, x: Array, sublayer, *, deterministic: bool) -> Array:
    # x: [B, T, D]; sublayer: [B, T, D] -> same
    dropout = layers.Dropout(self.cfg.dropout_rate, self.cfg.dropout_rng)
    if self.cfg.pre_ln:
      return x + dropout(sublayer(_layer_norm(self.cfg, "ln")(x)), deterministic=deterministic)
    return _layer_norm(self.cfg, "ln")(x + dropout(sublayer(x), deterministic=deterministic))


class EncoderLayer(nn.Module):
  cfg: TransformerConfig

  @nn.compact
  def __call__(self, x: Array, mask: Array, deterministic: bool) -> Array:
    # x: [B, S, D]; mask: [B, 1, S, S]
    cfg = self.cfg
    attn = _attention(cfg, "self_attention")
    ffn = _feed_forward(cfg)
    x = Residual(cfg, name="attention_block")(
      x, lambda h: attn(h, h, mask, deterministic=deterministic), deterministic=deterministic
    )
    return Residual(cfg, name="ffn_block")(
      x, lambda h: ffn(h, deterministic=deterministic), deterministic=deterministic
    )


class DecoderLayer(nn.Module):
  cfg: TransformerConfig

  @nn.compact
  def __call__(
    self,
    y: Array,
    encoded: Array,
    self_mask: Array | None,
    cross_mask: Array,
    deterministic: bool,
    decode: bool,
  ) -> Array:
    # y: [B, T, D]; encoded: [B, S, D]
    cfg = self.cfg
    self_attn = _attention(cfg, "self_attention")
    cross_attn = _attention(cfg, "cross_attention")
    ffn = _feed_forward(cfg)
    y = Residual(cfg, name="self_attention_block")(
      y,
      lambda h: self_attn(h, h, self_mask, deterministic=deterministic, decode=decode),
      deterministic=deterministic,
    )
    y = Residual(cfg, name="cross_attention_block")(
      y,
      lambda h: cross_attn(
        h, encoded, cross_mask, deterministic=deterministic, decode=decode, cross=True
      ),
      deterministic=deterministic,
    )
    return Residual(cfg, name="ffn_block")(
      y, lambda h: ffn(h, deterministic=deterministic), deterministic=deterministic
    )


# Remat wraps whole layers; `deterministic` and `decode` (positions 3 and 5, 6 counting `self`) are
# Python flags, static for jax.checkpoint.
_RematEncoderLayer = nn.remat(EncoderLayer, static_argnums=(3,))
_RematDecoderLayer = nn.remat(DecoderLayer, static_argnums=(5, 6))


def _embed_init(d_model: int):
  # N(0, d_model^-0.5): after the sqrt(d_model) scaling the embeddings have unit variance.
  return nn.initializers.normal(stddev=d_model**-0.5)


class Transformer(nn.Module):
  """Encoder-decoder Transformer. `encode` and `decode` are separate so search calls the decoder."""

  cfg: TransformerConfig

  def setup(self) -> None:
    cfg = self.cfg
    self.embedding = layers.Embed(
      cfg.vocab_size, cfg.d_model, embedding_init=_embed_init(cfg.d_model), name="embedding"
    )
    if not cfg.share_embeddings:
      self.target_embedding = layers.Embed(
        cfg.vocab_size, cfg.d_model, embedding_init=_embed_init(cfg.d_model)
      )
      self.logits_dense = layers.Dense(
        cfg.vocab_size,
        use_bias=False,
        dtype=cfg.dtype,
        dot_general=layers.dot_general_f32,
      )
    self.encoder_positions = layers.PositionalEncoding(cfg.d_model, cfg.max_len, cfg.positional)
    self.decoder_positions = layers.PositionalEncoding(cfg.d_model, cfg.max_len, cfg.positional)
    encoder_layer = _RematEncoderLayer if cfg.remat else EncoderLayer
    decoder_layer = _RematDecoderLayer if cfg.remat else DecoderLayer
    self.encoder_layers = [encoder_layer(cfg, name=f"encoder_{i}") for i in range(cfg.num_layers)]
    self.decoder_layers = [
      decoder_layer(cfg, name=f"decoder_{i}") for i in range(cfg.decoder_depth)
    ]
    self.dropout = layers.Dropout(cfg.dropout_rate, cfg.dropout_rng)
    if cfg.pre_ln:
      self.encoder_norm = _layer_norm(cfg, "encoder_norm")
      self.decoder_norm = _layer_norm(cfg, "decoder_norm")
    if cfg.logits_bias:
      # Marian's final_logits_bias: [V], added to the float32 logits.
      self.logits_bias = self.param("logits_bias", nn.initializers.zeros, (cfg.vocab_size,))

  def _embed(self, table: layers.Embed, tokens: Array) -> Array:
    # tokens: [B, T] -> [B, T, D] float32, scaled by sqrt(d_model) (3.4).
    return table(tokens) * jnp.sqrt(self.cfg.d_model).astype(jnp.float32)

  def _logits(self, y: Array) -> Array:
    """[B, T, D] -> [B, T, V] float32: a `dtype` product, accumulated
    and returned in float32 (rounding logits to bfloat16 would coarsen the loss)."""
    if not self.cfg.share_embeddings:
      logits = self.logits_dense(y)
    else:
      table = self.embedding.embedding  # [vocab, d_model] float32 parameter
      dtype = self.cfg.dtype
      logits = layers.tied_logits(y.astype(dtype), table.astype(dtype))
    return logits + self.logits_bias if self.cfg.logits_bias else logits

  def encode(
    self,
    inputs: Array,
    inputs_position: Array | None = None,
    inputs_segmentation: Array | None = None,
    *,
    train: bool = False,
  ) -> Array:
    """inputs: [B, S] ids (0 = padding) -> [B, S, D]."""
    deterministic = not train
    mask = attention_layers.padding_mask(inputs, inputs)
    if inputs_segmentation is not None:
      mask = mask & attention_layers.segment_mask(inputs_segmentation, inputs_segmentation)
    x = self.encoder_positions(self._embed(self.embedding, inputs), inputs_position)
    x = self.dropout(x, deterministic=deterministic)
    for layer in self.encoder_layers:
      x = layer(x, mask, deterministic)
    return self.encoder_norm(x) if self.cfg.pre_ln else x

  def decode(
    self,
    encoded: Array,
    inputs: Array,
    targets: Array,
    targets_position: Array | None = None,
    inputs_segmentation: Array | None = None,
    targets_segmentation: Array | None = None,
    *,
    train: bool = False,
    decode: bool = False,
    logits: bool = True,
  ) -> Array:
    """Logits for each target position (with `logits=False`: the decoder's output before the
    output layer, [B, T, D] float32, for a loss that computes the output layer itself in blocks,
    losses.blocked_output_loss).

    Training / scoring (`decode=False`): `targets` [B, T] are the reference ids; the
    decoder input is `targets` shifted right by one with 0 in front (per packed segment), so
    position t predicts targets[t] from targets[:t].

    Incremental decoding (`decode=True`, mutable `cache`): `targets` [B, 1] is the previous
    token (0 at the first step); returns the logits for the next one.

    Returns:
      [B, T, V] float32 logits.
    """
    cfg = self.cfg
    deterministic = not train
    if decode:
      decoder_input = targets
      self_mask = None  # the cache builds the causal mask step by step
      cross_mask = (inputs > 0)[:, None, None, :]  # [B, 1, 1, S]
    else:
      decoder_input = shift_right(targets, targets_segmentation)
      causal = attention_layers.causal_mask(targets.shape[1])
      self_mask = attention_layers.padding_mask(targets, targets) & causal
      cross_mask = attention_layers.padding_mask(targets, inputs)
      if targets_segmentation is not None:
        self_mask &= attention_layers.segment_mask(targets_segmentation, targets_segmentation)
        cross_mask &= attention_layers.segment_mask(targets_segmentation, inputs_segmentation)
    if cfg.decoder_start == "eos":
      # PAD in the decoder's input is the start symbol (shift_right's, the search's first step)
      # or padding, which no real position attends to: the start becomes `</s>`.
      decoder_input = jnp.where(decoder_input == PAD_ID, EOS_ID, decoder_input)
    table = self.embedding if cfg.share_embeddings else self.target_embedding
    y = self.decoder_positions(self._embed(table, decoder_input), targets_position, decode=decode)
    y = self.dropout(y, deterministic=deterministic)
    for layer in self.decoder_layers:
      y = layer(y, encoded, self_mask, cross_mask, deterministic, decode)
    if cfg.pre_ln:
      y = self.decoder_norm(y)
    return self._logits(y) if logits else y

  def __call__(
    self,
    inputs: Array,
    targets: Array,
    inputs_position: Array | None = None,
    targets_position: Array | None = None,
    inputs_segmentation: Array | None = None,
    targets_segmentation: Array | None = None,
    *,
    train: bool = False,
    logits: bool = True,
  ) -> Array:
    """Teacher-forced forward pass: [B, S], [B, T] -> [B, T, V] (`logits=False`: [B, T, D])."""
    encoded = self.encode(inputs, inputs_position, inputs_segmentation, train=train)
    return self.decode(
      encoded,
      inputs,
      targets,
      targets_position,
      inputs_segmentation,
      targets_segmentation,
      train=train,
      logits=logits,
    )


def shift_right(targets: Array, segmentation: Array | None = None) -> Array:
  """Decoder inputs: targets shifted right by one, 0 (the start symbol) at each segment start."""
  # targets: [B, T]
  shifted = jnp.pad(targets, ((0, 0), (1, 0)))[:, :-1]
  if segmentation is not None:
    # In a packed row, the first token of each pair must not see the previous pair's last token.
    shifted_seg = jnp.pad(segmentation, ((0, 0), (1, 0)))[:, :-1]
    shifted = jnp.where(segmentation == shifted_seg, shifted, 0)
  return shifted


@functools.partial(jax.jit, static_argnums=(0, 2, 3))
def init_params(cfg: TransformerConfig, rng: Array, src_len: int = 8, tgt_len: int = 8) -> Any:
  """Fresh parameters (the lengths only shape the dummy input; parameters don't depend on them).

  Jitted: run op by op, the initialisation of even the tiny model takes seconds (each op compiled
  on its own); as one program, a fraction of that, with the same values."""
  model = Transformer(cfg)
  dummy_src = jnp.ones((1, src_len), jnp.int32)
  dummy_tgt = jnp.ones((1, tgt_len), jnp.int32)
  return model.init(rng, dummy_src, dummy_tgt)["params"]


def tied_output_layer(params: Any) -> tuple[Array, Array | None]:
  """(table [V, D], bias [V] or None): the output layer `Transformer._logits` applies with
  share_embeddings, read from `params` by those that compute it outside the module (the blocked
  training loss), so the parameters' names stay this module's."""
  return params["embedding"]["embedding"], params.get("logits_bias")


def count_params(params: Any) -> int:
  return sum(int(x.size) for x in jax.tree.leaves(params))
