"""Every experiment config loads, picks the paper's values, and overrides reach the model."""

import runpy
import pathlib

import pytest

from flaxformer_nmt import config_lib

CONFIGS = pathlib.Path(__file__).resolve().parent.parent / "configs"


def load(name: str):
  return runpy.run_path(str(CONFIGS / f"{name}.py"))["get_config"]()


@pytest.mark.parametrize("name,size,tfds,tgt,vocab,dropout,steps", [
    ("wmt14_ende_base", "base", "wmt14_translate/de-en", "de", 37_000, 0.1, 100_000),
    ("wmt14_ende_big", "big", "wmt14_translate/de-en", "de", 37_000, 0.3, 300_000),
    ("wmt14_enfr_big", "big", "wmt14_translate/fr-en", "fr", 32_000, 0.1, 300_000),
])
def test_wmt14_configs_follow_the_paper(name, size, tfds, tgt, vocab, dropout, steps):
  c = load(name)
  s = config_lib.SIZES[size]
  assert (c.model.num_layers, c.model.d_model, c.model.d_ff, c.model.num_heads) == (
      s.num_layers, s.d_model, s.d_ff, s.num_heads)
  assert c.model.d_model // c.model.num_heads == 64  # d_k = d_v = 64 for both sizes
  assert (c.data.source, c.data.tfds_name, c.data.src_lang, c.data.tgt_lang) == (
      "tfds", tfds, "en", tgt)
  assert c.data.vocab_size == vocab and c.model.dropout_rate == dropout
  assert c.num_train_steps == steps and c.checkpoint_every_secs == 600
  assert c.label_smoothing == 0.1 and c.optim.warmup_steps == 4000
  assert (c.optim.beta1, c.optim.beta2, c.optim.eps) == (0.9, 0.98, 1e-9)
  assert c.data.tokens_per_batch == 25_000
  assert (c.decode.beam_size, c.decode.alpha, c.decode.max_len_offset) == (4, 0.6, 50)
  assert not c.model.pre_ln and c.model.positional == "sinusoidal" and c.model.share_embeddings


@pytest.mark.parametrize("name", ["demo", "multi30k"])
def test_small_configs_load(name):
  c = load(name)
  assert c.model.size in config_lib.SIZES


def test_unknown_size_or_pair_is_one_clear_error():
  with pytest.raises(ValueError, match="Unknown model size 'huge'"):
    config_lib.base_config("huge")
  with pytest.raises(ValueError, match="Unknown WMT14 pair 'en-xx'"):
    config_lib.wmt14_config("base", "en-xx")
