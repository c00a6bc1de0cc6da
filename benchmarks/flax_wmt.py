r"""Side by side with the Flax WMT example: its train step and beam search against ours, in turns.

  git clone --depth 1 https://github.com/google/flax /tmp/flax    # the example is not on PyPI
  python benchmarks/flax_wmt.py --flax_wmt_dir=/tmp/flax/examples/wmt --size=base \
    --dtype=bfloat16 --tokens_per_step=25000 --max_len=256        # one GPU: the paper's batch
  python benchmarks/flax_wmt.py --flax_wmt_dir=/tmp/flax/examples/wmt --size=tiny \
    --tokens_per_step=1024 --max_len=32 --decode_batch_sizes=4     # any CPU, in a minute

The example's own functions run: `train.train_step`, `train.initialize_cache` and
`train.predict_step` (its `models.Transformer` and `decode.beam_search`), imported from
--flax_wmt_dir. Its train.py also imports TensorFlow, clu and its input pipeline, which only its
training loop uses; they are replaced by empty modules here (TensorFlow would also take the GPU's
memory), so the example needs nothing beyond JAX, Flax and optax.

Same work on both sides:
- train step: the size's shapes (d_model, heads, layers, d_ff, a shared vocabulary of
  --vocab_size with tied logits), our dtype for activations and products, our dropout and
  attention dropout rates, label smoothing 0.1, Adam(W) with beta2 0.98, the same packed batches
  (train_step.py's: rows of 4 sentences, segment ids and positions), pmapped over the local
  devices with the state donated. Ours is train_step.py's step (build_step). The example is
  pre-LN (a layer norm before each sublayer, one after each stack) where ours is the paper's
  post-LN: the same products, two more layer norms. In bfloat16 the example computes its tied
  logits in float32 and its layer norms and softmax in bfloat16, where ours computes the logits'
  product in bfloat16 (float32 accumulation) and the norms and softmax in float32; its dropout
  masks come from jax.random.bernoulli, ours from model.dropout_rng (threefry16: two masks a
  draw). Those are the two implementations' own choices, and they are what is timed.
- beam search: beam 4, alpha 0.6, random sources of --src_len tokens on one device, and exactly
  src_len + --max_len_offset decoder steps on both sides (ours forbids EOS, fixed_decode.py; the
  example gets an EOS id no token has, so none of its beams ever ends and its loop runs to its
  max_decode_len - 1 = the same count).

Each side is compiled first; then the timing alternates (--rounds rounds: --steps_per_round steps
of ours, then of the example's; decoding --decode_repeats batches each), and each figure is the
median round, so drift in the machine falls on both. `speedup` is the example's time over ours.
The record names the example's files by SHA-256 (and --flax_commit where given). Last line: JSON
(benchmarks/results/<--record>.json, default flax_wmt).
"""

from __future__ import annotations

import functools
import hashlib
import os
import statistics
import sys
import time
import types
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import train_step
from absl import app, flags

from flaxformer_nmt.benchmarking import record
from flaxformer_nmt.benchmarking.fixed_decode import decode_fixed
from flaxformer_nmt.decoding import decode
from flaxformer_nmt.model.tokens import EOS_ID
from flaxformer_nmt.model.transformer import (
  Transformer,
  TransformerConfig,
  count_params,
  init_params,
)
from flaxformer_nmt.runtime import parallel

flags.DEFINE_string("flax_wmt_dir", "", "The Flax example's folder (flax/examples/wmt).")
flags.DEFINE_string("flax_commit", "", "The flax commit the example came from, for the record.")
flags.DEFINE_list("parts", ["step", "decode"], "What to compare: step, decode.")
flags.DEFINE_integer("rounds", 5, "Alternating rounds (train steps and decoding).")
flags.DEFINE_integer("steps_per_round", 5, "Train steps of each side per round.")
flags.DEFINE_list("decode_batch_sizes", ["32", "256"], "Sentences per decoded batch.")
flags.DEFINE_integer("src_len", 24, "Source length in tokens, EOS included (decode.py's).")
flags.DEFINE_integer("max_len_offset", 50, "Decoder steps = src_len + this (decode.py's).")
flags.DEFINE_integer("decode_repeats", 1, "Batches of each side per round.")
FLAGS = flags.FLAGS

# Modules the example's train.py imports for its training loop only.
_UNUSED = ("tensorflow", "input_pipeline", "clu", "clu.metric_writers", "clu.periodic_actions")
_FILES = ("train.py", "models.py", "decode.py")


def load_example(directory: str) -> tuple[Any, Any, dict[str, str]]:
  """The example's `train` and `models` modules, and the SHA-256 of the files that run."""
  missing = [f for f in _FILES if not os.path.isfile(os.path.join(directory, f))]
  if missing:
    raise app.UsageError(
      f"--flax_wmt_dir={directory!r}: no {', '.join(missing)} (flax/examples/wmt of a flax clone)."
    )
  # flax.io asks importlib whether TensorFlow exists when it is first imported: before the stubs.
  import flax.training.checkpoints  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import

  for name in _UNUSED:
    module = _Unused(name)
    sys.modules[name] = module
    parent, _, child = name.rpartition(".")
    if parent:
      setattr(sys.modules[parent], child, module)
  # First on the path: this folder holds a decode.py and an input_pipeline.py of its own.
  sys.path.insert(0, os.path.abspath(directory))
  for name in ("decode", "models", "bleu", "train"):
    sys.modules.pop(name, None)
  import models  # pylint: disable=g-import-not-at-top
  import train  # pylint: disable=g-import-not-at-top

  # The example holds its stubs now. Out of sys.modules with them: a stub there (whose __spec__
  # is None) made importlib.util.find_spec("tensorflow") raise inside JAX's persistent
  # compilation cache on the H200 (2026-11-28), which then skipped the cache.
  for name in _UNUSED:
    sys.modules.pop(name, None)

  digests = {}
  for f in _FILES:
    with open(os.path.join(directory, f), "rb") as fh:
      digests[f] = hashlib.sha256(fh.read()).hexdigest()
  return train, models, digests


class _Unused(types.ModuleType):
  """A module the example imports for its training loop: any name in it (the loop's type hints,
  `tf.data.Dataset`) is another such stub, and calling one fails naming it."""

  def __getattr__(self, attribute: str) -> Any:
    if attribute.startswith("__"):
      raise AttributeError(attribute)
    return _Unused(f"{self.__name__}.{attribute}")

  def __call__(self, *args: Any, **kwargs: Any) -> Any:
    raise RuntimeError(f"flax_wmt.py: the example called {self.__name__}, stubbed as unused.")


def example_config(models: Any, cfg: TransformerConfig, vocab: int, max_len: int) -> Any:
  """The example's TransformerConfig for our model's shapes (its train.py's other arguments)."""
  if cfg.num_decoder_layers or cfg.pre_ln or cfg.activation != "relu" or not cfg.share_embeddings:
    raise app.UsageError("flax_wmt.py compares the paper's architecture only (no model options).")
  return models.TransformerConfig(
    vocab_size=vocab,
    output_vocab_size=vocab,
    share_embeddings=True,
    logits_via_embedding=True,
    dtype=cfg.dtype,
    emb_dim=cfg.d_model,
    num_heads=cfg.num_heads,
    num_layers=cfg.num_layers,
    qkv_dim=cfg.num_heads * (cfg.d_k or cfg.d_model // cfg.num_heads),
    mlp_dim=cfg.d_ff,
    max_len=max_len,
    dropout_rate=cfg.dropout_rate,
    attention_dropout_rate=cfg.attention_dropout_rate,
    deterministic=False,
    decode=False,
  )


def _timed_round(run: Any, rounds: list[float]) -> None:
  start = time.perf_counter()
  run()
  rounds.append(time.perf_counter() - start)


def compare_steps(train: Any, models: Any) -> dict[str, Any]:
  """Ours and the example's train step, compiled, then timed in alternating rounds."""
  ours = train_step.build_step(
    train_step.config_for_flags(),
    FLAGS.vocab_size,
    FLAGS.tokens_per_step,
    FLAGS.max_len,
    1,
    batches=2,
  )
  theirs_cfg = example_config(models, ours.cfg, FLAGS.vocab_size, FLAGS.max_len)
  init = jax.jit(models.Transformer(theirs_cfg.replace(deterministic=True)).init)
  ones = jnp.ones((1, FLAGS.max_len), jnp.float32)
  params = init(jax.random.key(0), ones, ones)["params"]
  schedule = train.create_learning_rate_schedule(learning_rate=0.002, warmup_steps=1000)
  dynamic_scale = None
  if ours.cfg.dtype == jnp.float16:
    from flax.training import dynamic_scale as dynamic_scale_lib  # pylint: disable=g-import-not-at-top

    dynamic_scale = dynamic_scale_lib.DynamicScale()
  theirs_state = train.TrainState.create(
    apply_fn=None,
    params=params,
    tx=optax.adamw(schedule, b1=0.9, b2=0.98, eps=1e-9, weight_decay=0.0),
    dynamic_scale=dynamic_scale,
  )
  theirs_state = parallel.replicate(jax.device_get(theirs_state))
  p_theirs = jax.pmap(
    functools.partial(
      train.train_step, config=theirs_cfg, learning_rate_fn=schedule, label_smoothing=0.1
    ),
    axis_name="batch",
    donate_argnums=(0,),
  )
  dropout_rngs = jax.random.split(jax.random.key(1), jax.local_device_count())
  sides: dict[str, dict[str, Any]] = {
    "ours": {"state": ours.state, "step": lambda s, b: ours.p_step(s, b)},
    "flax_example": {
      "state": theirs_state,
      "step": lambda s, b: p_theirs(s, b, dropout_rng=dropout_rngs),
    },
  }
  for side in sides.values():
    start = time.perf_counter()
    side["state"], metrics = side["step"](side["state"], ours.batches[0])
    jax.block_until_ready(metrics)
    side["compile_s"] = round(time.perf_counter() - start, 1)
    side["rounds"] = []

  def run(side: dict[str, Any]) -> None:
    for i in range(FLAGS.steps_per_round):
      side["state"], metrics = side["step"](side["state"], ours.batches[i % 2])
    jax.block_until_ready(metrics)

  for _ in range(FLAGS.rounds):
    for side in sides.values():
      _timed_round(functools.partial(run, side), side["rounds"])
  tokens = ours.rows * FLAGS.max_len
  n_dev = jax.local_device_count()
  flops = train_step.step_flops(ours.cfg, FLAGS.vocab_size, tokens, FLAGS.max_len, n_dev)
  nominal = train_step._peak_tflops()  # pylint: disable=protected-access
  out: dict[str, Any] = {
    "target_tokens_per_step": tokens,
    "rows": ours.rows,
    # The example is pre-LN, with a final layer norm after each stack: 4 x d_model more.
    "params": {"ours": count_params(ours.params), "flax_example": count_params(params)},
  }
  for name, side in sides.items():
    step_s = statistics.median(side["rounds"]) / FLAGS.steps_per_round
    out[name] = {
      "compile_s": side["compile_s"],
      "step_s": round(step_s, 5),
      "tokens_per_s": round(tokens / step_s, 1),
      "tflops_per_s_per_device": round(flops / step_s / 1e12, 4),
      "mfu_nominal": round(flops / step_s / 1e12 / nominal, 4) if nominal else None,
    }
  out["speedup"] = round(out["flax_example"]["step_s"] / out["ours"]["step_s"], 4)
  return out


def compare_decoding(train: Any, models: Any, batch_size: int) -> dict[str, Any]:
  """Beam-4 search of one batch, ours and the example's, the same number of steps on each."""
  c = train_step.config_for_flags()
  cfg = TransformerConfig.from_config(c.model, FLAGS.vocab_size, auto_dtype=parallel.auto_dtype())
  model = Transformer(cfg)
  params = jax.jit(init_params, static_argnums=0)(cfg, jax.random.PRNGKey(0))
  search = decode.SearchConfig(beam_size=4, alpha=0.6, max_len_offset=FLAGS.max_len_offset)
  steps = decode.decode_length_bound(FLAGS.src_len, FLAGS.max_len_offset, cfg.max_len)
  rng = np.random.default_rng(0)
  inputs = rng.integers(3, FLAGS.vocab_size, size=(batch_size, FLAGS.src_len)).astype(np.int32)
  inputs[:, -1] = EOS_ID
  device = jax.local_devices()[0]

  theirs_cfg = example_config(models, cfg, FLAGS.vocab_size, max(cfg.max_len, steps + 1))
  predict_cfg = theirs_cfg.replace(deterministic=True, decode=True)
  ones = jnp.ones((1, FLAGS.src_len), jnp.float32)
  theirs_params = jax.jit(models.Transformer(theirs_cfg.replace(deterministic=True)).init)(
    jax.random.key(0), ones, ones
  )["params"]
  # jit on one device, as ours (the example pmaps the same functions over its devices).
  p_cache = jax.jit(
    functools.partial(train.initialize_cache, max_decode_len=steps + 1, config=predict_cfg)
  )
  # eos_id -1: no token is EOS, so the example's loop runs max_decode_len - 1 = `steps` steps.
  p_predict = jax.jit(
    functools.partial(train.predict_step, config=predict_cfg, beam_size=4),
    static_argnums=(3, 4),
  )
  theirs_inputs = jax.device_put(jnp.asarray(inputs), device)
  theirs_params = jax.device_put(theirs_params, device)
  ours_inputs = jax.device_put(jnp.asarray(inputs), device)

  def ours() -> Any:
    return jax.block_until_ready(decode_fixed(model, params, ours_inputs, search))

  def theirs() -> Any:
    cache = p_cache(theirs_inputs)
    return jax.block_until_ready(p_predict(theirs_inputs, theirs_params, cache, -1, steps + 1))

  sides = {"ours": {"run": ours, "rounds": []}, "flax_example": {"run": theirs, "rounds": []}}
  first = ours()
  if int(first.num_steps) != steps:
    raise RuntimeError(f"ours ran {int(first.num_steps)} steps, not {steps}.")
  theirs()  # compiled and run once
  # Its loop count is not returned: with no EOS among the ids no beam finishes, and its
  # beam_search runs while cur_index < max_decode_len - 1 (flax examples/wmt/decode.py).
  for _ in range(FLAGS.rounds):
    for side in sides.values():
      for _ in range(FLAGS.decode_repeats):
        _timed_round(side["run"], side["rounds"])
  out: dict[str, Any] = {"batch_size": batch_size, "decode_steps": steps}
  for name, side in sides.items():
    seconds = statistics.median(side["rounds"])
    out[name] = {
      "seconds_per_batch": round(seconds, 4),
      "sentences_per_s": round(batch_size / seconds, 2),
      "ms_per_step": round(1000 * seconds / steps, 3),
    }
  out["speedup"] = round(
    out["flax_example"]["seconds_per_batch"] / out["ours"]["seconds_per_batch"], 4
  )
  return out


def main(argv: list[str]) -> None:
  del argv
  if not FLAGS.flax_wmt_dir:
    raise app.UsageError("--flax_wmt_dir: the Flax example's folder (flax/examples/wmt).")
  unknown = set(FLAGS.parts) - {"step", "decode"}
  if unknown:
    raise app.UsageError(f"--parts: {sorted(unknown)} (step, decode).")
  train, models, digests = load_example(FLAGS.flax_wmt_dir)
  result: dict[str, Any] = {
    "size": FLAGS.size,
    "device_kind": jax.devices()[0].device_kind,
    "devices": jax.local_device_count(),
    "dtype": np.dtype(
      TransformerConfig.from_config(
        train_step.config_for_flags().model, FLAGS.vocab_size, auto_dtype=parallel.auto_dtype()
      ).dtype
    ).name,
    "vocab_size": FLAGS.vocab_size,
    "max_len": FLAGS.max_len,
    "rounds": FLAGS.rounds,
    "flax_example": {"commit": FLAGS.flax_commit or None, "sha256": digests},
  }
  if "step" in FLAGS.parts:
    result["train_step"] = compare_steps(train, models)
    print("train step", result["train_step"], flush=True)
  if "decode" in FLAGS.parts:
    result["decode"] = []
    for b in FLAGS.decode_batch_sizes:
      result["decode"].append(compare_decoding(train, models, int(b)))
      print("decode", result["decode"][-1], flush=True)
  record.report(result)


if __name__ == "__main__":
  app.run(main)
