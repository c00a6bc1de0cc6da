"""Every experiment config loads, picks the paper's values, and overrides reach the model."""

import re

import pytest

from flaxformer_nmt import errors
from flaxformer_nmt.config import builders as config_lib
from flaxformer_nmt.config import checks as config_checks
from flaxformer_nmt.config import loading as config_files


def load(name: str, *args: str):
  """The config as main.py and the API load it (`name:arg`)."""
  return config_files.load(":".join([name, *args]))


@pytest.mark.parametrize(
  "name,size,tfds,tgt,vocab,dropout,steps,every",
  [
    ("wmt14_ende_base", "base", "wmt14_translate/de-en", "de", 37_000, 0.1, 100_000, 1_500),
    ("wmt14_ende_big", "big", "wmt14_translate/de-en", "de", 37_000, 0.3, 300_000, 600),
    ("wmt14_enfr_big", "big", "wmt14_translate/fr-en", "fr", 32_000, 0.1, 300_000, 600),
  ],
)
def test_wmt14_configs_follow_the_paper(name, size, tfds, tgt, vocab, dropout, steps, every):
  c = load(name)
  s = config_lib.SIZES[size]
  assert (c.model.num_layers, c.model.d_model, c.model.d_ff, c.model.num_heads) == (
    s.num_layers,
    s.d_model,
    s.d_ff,
    s.num_heads,
  )
  assert c.model.d_model // c.model.num_heads == 64  # d_k = d_v = 64 for both sizes
  assert (c.data.source, c.data.tfds_name, c.data.src_lang, c.data.tgt_lang) == (
    "tfds",
    tfds,
    "en",
    tgt,
  )
  assert c.data.vocab_size == vocab and c.model.dropout_rate == dropout
  assert c.num_train_steps == steps
  # Averaging windows in steps, as the paper's 10 minutes were on its hardware; no wall clock.
  assert c.checkpoint_every_steps == every and c.checkpoint_every_secs == 0
  assert c.keep_checkpoints >= 20
  assert c.label_smoothing == 0.1 and c.optim.warmup_steps == 4000
  assert (c.optim.beta1, c.optim.beta2, c.optim.eps) == (0.9, 0.98, 1e-9)
  assert c.data.tokens_per_batch == 25_000
  assert c.optim.accumulate_steps == 1  # the batch is 25k tokens; accumulate_steps splits it
  assert (c.decode.beam_size, c.decode.alpha, c.decode.max_len_offset) == (4, 0.6, 50)
  assert c.decode.beam_style == "t2t"
  assert not c.model.pre_ln and c.model.positional == "sinusoidal" and c.model.share_embeddings
  config_lib.validate(c)

  files = load(name, "files")  # --config=configs/<name>.py:files
  assert (files.data.source, files.data.dev_prefix, files.data.test_prefix) == (
    "files",
    "newstest2013",
    "newstest2014",
  )
  assert (files.data.src_lang, files.data.tgt_lang) == ("en", tgt)
  with pytest.raises(errors.ConfigError, match="config.data.dir is empty"):
    config_lib.validate(files)  # the folder must be given
  with pytest.raises(errors.ConfigError, match="Unknown WMT14 data 'tsv'"):
    load(name, "tsv")


@pytest.mark.parametrize("name", ["demo", "multi30k", "multi30k_multilingual", "multi30k_tiny"])
def test_small_configs_load(name):
  c = load(name)
  assert c.model.size in config_lib.SIZES
  config_lib.validate(c)


def test_the_fine_tuning_config_asks_for_the_users_folder_and_holds_its_rate():
  c = load("finetune")
  with pytest.raises(errors.ConfigError, match="config.data.dir is empty"):
    config_lib.validate(c)
  c.data.dir = "data/mine"
  config_lib.validate(c)
  assert (c.data.train_prefix, c.data.dev_prefix, c.data.test_prefix) == ("train", "val", "test")
  # The constant schedule's rate for OPUS-MT's d_model 512: 1e-4.
  rate = c.optim.lr_scale * 512**-0.5 * c.optim.warmup_steps**-0.5
  assert rate == pytest.approx(1e-4, rel=0.02)


def test_the_multilingual_config_is_the_bilingual_one_with_directions():
  bilingual, multi = load("multi30k"), load("multi30k_multilingual")
  assert multi.data.directions == "en-de,de-en,en-fr,fr-en,en-cs,cs-en"
  assert multi.data.zero_shot == "de-fr,fr-de" and multi.data.temperature == 5.0
  changed = {"directions", "zero_shot", "vocab_size"}
  for key in bilingual.data:
    if key not in changed:
      assert multi.data[key] == bilingual.data[key], key
  assert multi.model == bilingual.model and multi.optim == bilingual.optim
  assert multi.eval.dev_bleu_sentences == 200


def test_unknown_size_or_pair_is_one_clear_error():
  with pytest.raises(errors.ConfigError, match="Unknown model size 'huge'"):
    config_lib.base_config("huge")
  with pytest.raises(errors.ConfigError, match="Unknown WMT14 pair 'en-xx'"):
    config_lib.wmt14_config("base", "en-xx")


@pytest.mark.parametrize(
  "field,value,message",
  [
    ("num_train_steps", 0, "config.num_train_steps must be >= 1, got 0"),
    ("checkpoint_every_steps", -1, "config.checkpoint_every_steps must be >= 0"),
    ("keep_checkpoints", 0, "config.keep_checkpoints must be >= 1"),
    ("label_smoothing", 1.0, "config.label_smoothing must be in [0, 1), got 1.0"),
    ("model.num_heads", 3, "config.model.d_model=128 is not divisible by config.model.num_heads=3"),
    ("model.dropout_rate", -0.1, "config.model.dropout_rate must be in [0, 1)"),
    ("model.positional", "rotary", "config.model.positional must be one of"),
    ("optim.loss_scale_init", 0.5, "config.optim.loss_scale_init must be >= 1, got 0.5"),
    ("optim.loss_scale_init", 2.0**30, "config.optim.loss_scale_init must be <= 2^24"),
    ("optim.loss_scale_period", 0, "config.optim.loss_scale_period must be >= 1, got 0"),
    ("model.dtype", "fp8", "config.model.dtype must be one of"),
    ("decode.beam_style", "marian", "config.decode.beam_style must be one of"),
    ("eval.compound_split", "yes", "config.eval.compound_split must be one of"),
    ("eval.bleu_protocol", "wmt", "config.eval.bleu_protocol must be one of"),
    ("optim.accumulate_steps", 0, "config.optim.accumulate_steps must be >= 1"),
    ("optim.lr_scale", 0.0, "config.optim.lr_scale must be > 0"),
    ("data.source", "web", "config.data.source must be one of ['demo', 'tfds', 'files', 'none']"),
    ("data.tokens_per_batch", 10, "config.data.tokens_per_batch=10 is smaller than"),
    ("data.tgt_lang", "en", "config.data.src_lang and config.data.tgt_lang are both 'en'"),
    ("decode.beam_size", 0, "config.decode.beam_size must be >= 1"),
    ("decode.batch_size", 0, "config.decode.batch_size must be >= 1"),
    ("optim.lora_rank", -1, "config.optim.lora_rank must be >= 0, got -1"),
    ("optim.lora_dropout", 0.1, "config.optim.lora_dropout=0.1 drops out the adapters' inputs"),
  ],
)
def test_validate_names_the_field(field, value, message):
  c = config_lib.base_config("tiny")
  config_lib.validate(c)  # the defaults are valid
  *groups, name = field.split(".")
  node = c
  for group in groups:
    node = node[group]
  node[name] = value
  with pytest.raises(errors.ConfigError, match=re.escape(message)) as info:
    config_lib.validate(c)
  assert "\n" not in str(info.value)


@pytest.mark.parametrize(
  "field,value,message",
  [
    ("lora_alpha", 0.0, "config.optim.lora_alpha must be > 0, got 0.0"),
    ("lora_targets", "", "'' is not a LoRA target"),
    ("lora_targets", "q,ffn", "'ffn' is not a LoRA target"),
    ("lora_dropout", 1.0, "config.optim.lora_dropout must be in [0, 1), got 1.0"),
    ("lora_dropout", -0.1, "config.optim.lora_dropout must be in [0, 1), got -0.1"),
  ],
)
def test_validate_lora_fields_when_lora_is_on(field, value, message):
  c = config_lib.base_config("tiny")
  c.optim.lora_rank = 8
  config_lib.validate(c)  # a rank with the default alpha and targets
  c.optim[field] = value
  with pytest.raises(errors.ConfigError, match=re.escape(message)):
    config_lib.validate(c)


def test_validate_files_source_needs_a_folder():
  c = config_lib.base_config("tiny")
  c.data.source = "files"
  with pytest.raises(errors.ConfigError, match="config.data.dir is empty"):
    config_lib.validate(c)


def test_table3_config_rows_change_one_thing_each():
  base = load("wmt14_ende_base")
  for row, (changes, _) in config_lib.TABLE3.items():
    c = load("wmt14_table3", row)
    config_lib.validate(c)
    differing = {
      path
      for path in (
        "model.num_heads",
        "model.d_k",
        "model.num_layers",
        "model.d_model",
        "model.d_ff",
        "model.dropout_rate",
        "label_smoothing",
        "model.positional",
      )
      if config_checks._get(c, path) != config_checks._get(base, path)
    }
    assert differing == set(changes), row
    assert c.data.test_split == "validation"  # newstest2013, as the table
  files = load("wmt14_table3", "E,files")
  assert files.data.source == "files" and files.data.test_prefix == "newstest2013"
  with pytest.raises(errors.ConfigError, match="Unknown Table 3 row 'B3'"):
    load("wmt14_table3", "B3")


def test_multi30k_tiny_is_wu_et_al_2021s_transformer_tiny_recipe():
  """fairseq's transformer_tiny (4+4 layers, d_model 128, FFN 256, 4 heads, dropout 0.3, shared
  embeddings, post-LN), Adam (0.9, 0.98, 1e-8), lr 0.005 reached at warmup's end (2,000 updates)
  on our schedule, 8,000 updates, beam 5, and the Multi30k protocol's BLEU reported."""
  from flaxformer_nmt.training import optim  # pylint: disable=g-import-not-at-top

  c = load("multi30k_tiny")
  m = c.model
  assert (m.num_layers, m.d_model, m.d_ff, m.num_heads, m.num_decoder_layers) == (4, 128, 256, 4, 0)
  assert (m.dropout_rate, m.attention_dropout_rate, m.relu_dropout_rate) == (0.3, 0.0, 0.0)
  assert m.share_embeddings and not m.pre_ln
  assert (c.optim.beta1, c.optim.beta2, c.optim.eps, c.label_smoothing) == (0.9, 0.98, 1e-8, 0.1)
  lr = optim.paper_schedule(m.d_model, c.optim.warmup_steps, c.optim.lr_scale)
  assert float(lr(1999)) == pytest.approx(0.005, rel=1e-6)  # count 1999 is update 2,000
  assert float(lr(7999)) == pytest.approx(0.005 * (2000 / 8000) ** 0.5, rel=1e-6)
  assert (c.num_train_steps, c.decode.beam_size, c.keep_checkpoints) == (8_000, 5, 10)
  assert (c.eval.bleu_protocol, c.eval.compound_split) == ("multi30k", "off")
