"""Pretrained models' pieces that need no transformers: the weight and id conversions
(export/marian.py), the Marian vocabulary (data/pair_vocabulary.py), the model options. The
checks against transformers itself are tests/e2e/test_pretrained.py (the `hf` extra)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flaxformer_nmt import errors
from flaxformer_nmt.data import pair_vocabulary
from flaxformer_nmt.data.tokenizer import open_vocabulary
from flaxformer_nmt.export import marian
from flaxformer_nmt.model import layers
from flaxformer_nmt.model.shapes import abstract_params
from flaxformer_nmt.model.tokens import EOS_ID, PAD_ID, UNK_ID
from flaxformer_nmt.model.transformer import Transformer, TransformerConfig

import marian_models

_CFG = TransformerConfig(
  vocab_size=50,
  num_layers=2,
  num_decoder_layers=1,
  d_model=16,
  d_ff=32,
  num_heads=2,
  attention_bias=True,
  logits_bias=True,
  activation="swish",
  layer_norm_epsilon=1e-5,
)


def _random_params(cfg: TransformerConfig, seed: int = 0):
  """Unit-normal values in every parameter (biases and scales too: every weight must be used)."""
  leaves, tree = jax.tree.flatten(abstract_params(cfg))
  rng = np.random.default_rng(seed)
  return jax.tree.unflatten(tree, [rng.normal(size=x.shape).astype(np.float32) for x in leaves])


def test_weights_to_marian_and_back_are_bitwise_and_every_weight_is_used():
  params = _random_params(_CFG)
  order = np.concatenate([[49, 0, 1], np.arange(2, 49)])
  state = marian.to_marian(params, order, 2, 1)
  back = marian.to_ours(state, order, 2, 1)
  jax.tree.map(np.testing.assert_array_equal, params, back)
  used = sum(v.size for v in state.values())
  assert used == sum(np.size(v) for v in jax.tree.leaves(params))


def test_the_feature_permutation_turns_marians_sinusoid_into_ours():
  # MarianSinusoidalPositionalEmbedding: sines in the first half, cosines in the second.
  d, positions = 16, np.arange(30)
  angle = positions[:, None] / np.power(10000, 2 * (np.arange(d) // 2) / d)[None, :]
  theirs = np.concatenate([np.sin(angle[:, 0::2]), np.cos(angle[:, 1::2])], axis=1)
  ours = np.asarray(layers.sinusoidal_encoding(jnp.asarray(positions), d))
  np.testing.assert_allclose(theirs[:, marian.feature_order(d)], ours, atol=2e-5)


def test_zero_attention_biases_and_logits_bias_change_nothing():
  plain = TransformerConfig(vocab_size=50, num_layers=1, d_model=16, d_ff=32, num_heads=2)
  biased = TransformerConfig(**{**plain.__dict__, "attention_bias": True, "logits_bias": True})
  params = _random_params(plain)
  with_zeros = abstract_params(biased)  # the shapes; the new biases zero, the rest `params`
  flat = dict(jax.tree_util.tree_leaves_with_path(params))
  with_zeros = jax.tree_util.tree_map_with_path(
    lambda p, v: flat[p] if p in flat else np.zeros(v.shape, v.dtype), with_zeros
  )
  src, tgt = jnp.array([[5, 6, 7, EOS_ID]]), jnp.array([[8, 9, EOS_ID]])
  a = jax.jit(Transformer(plain).apply)({"params": params}, src, tgt)  # one program each: op by
  b = jax.jit(Transformer(biased).apply)({"params": with_zeros}, src, tgt)  # op took 6 s cold
  np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5)


@pytest.fixture(scope="module")
def marian_folder(tmp_path_factory):
  folder = tmp_path_factory.mktemp("marian_vocab")
  vocab = marian_models.marian_vocabulary(folder, codes="de,fr")
  return folder, vocab


def test_a_marian_vocabulary_renumbers_the_special_pieces_and_keeps_the_rest(marian_folder):
  folder, vocab = marian_folder
  v = open_vocabulary(str(folder))
  assert isinstance(v, pair_vocabulary.PairVocabulary)
  assert [v.id_to_piece(i) for i in (PAD_ID, EOS_ID, UNK_ID)] == ["<pad>", "</s>", "<unk>"]
  assert v.vocab_size == len(vocab)
  assert [int(v.marian_ids[i]) for i in (PAD_ID, EOS_ID, UNK_ID)] == [len(vocab) - 1, 0, 1]
  assert list(v.marian_ids[3:]) == list(range(2, len(vocab) - 1))
  text = "Ich habe drei Äpfel."
  ids = v.encode_target(text)
  assert v.decode([*ids, EOS_ID, 7]) == text
  assert [v.id_to_piece(i) for i in v.reserved_ids()] == [">>de<<", ">>fr<<"]
  assert v.encode(">>fr<< three")[0] == v.piece_id(">>fr<<")


def test_a_piece_only_vocab_json_holds_decodes_as_marian_tokenizer_does(marian_folder, tmp_path):
  """Issue 62: a piece in vocab.json but not in target.spm decoded as
  `\u2581newspaper\u2581newspaper`, where MarianTokenizer (convert_tokens_to_string: "\u2581"
  -> " ", stripped) gives `newspaper newspaper`."""
  import json  # pylint: disable=g-import-not-at-top
  import shutil  # pylint: disable=g-import-not-at-top

  folder, vocab = marian_folder
  for name in pair_vocabulary.FILES:
    shutil.copy(folder / name, tmp_path / name)
  extra = dict(vocab)
  extra["\u2581newspaper\u2581newspaper"] = extra.pop("<pad>")
  extra["<pad>"] = len(extra)
  (tmp_path / "vocab.json").write_text(json.dumps(extra, ensure_ascii=False))
  v = pair_vocabulary.PairVocabulary(str(tmp_path))
  piece = v.piece_id("\u2581newspaper\u2581newspaper")
  assert v.decode([piece, EOS_ID]) == "newspaper newspaper"
  assert v.decode([*v.encode_target("Ich habe"), piece, EOS_ID]) == "Ich habe newspaper newspaper"


def test_a_folder_that_is_not_a_marian_vocabulary_is_one_line(tmp_path):
  (tmp_path / "vocab.json").write_text("{}")
  with pytest.raises(errors.DataError, match="not a Marian vocabulary"):
    pair_vocabulary.PairVocabulary(str(tmp_path))


def test_a_hub_id_is_downloaded_with_huggingface_hub_and_a_failure_is_one_line(
  tmp_path, monkeypatch
):
  """No network here: huggingface_hub's snapshot_download is stood in for."""
  import sys  # pylint: disable=g-import-not-at-top
  import types  # pylint: disable=g-import-not-at-top

  from flaxformer_nmt.importing import model_folder  # pylint: disable=g-import-not-at-top

  asked = []

  def snapshot_download(repo_id, allow_patterns):
    asked.append((repo_id, allow_patterns))
    if repo_id.endswith("missing"):
      raise OSError("404 Client Error: Repository Not Found\nmore detail")
    return str(tmp_path)

  hub = types.ModuleType("huggingface_hub")
  hub.snapshot_download = snapshot_download
  monkeypatch.setitem(sys.modules, "huggingface_hub", hub)
  assert model_folder.locate("Helsinki-NLP/opus-mt-en-de") == str(tmp_path)
  # Its config files first (a model import cannot read is refused before the weights come),
  # then the rest.
  assert asked[0] == ("Helsinki-NLP/opus-mt-en-de", ["config.json", "tokenizer_config.json"])
  assert asked[1][0] == "Helsinki-NLP/opus-mt-en-de" and "*.safetensors" in asked[1][1]
  asked.clear()

  def refuse(folder: str) -> None:
    raise errors.ConfigError(f"{folder}: not this one.")

  with pytest.raises(errors.ConfigError, match="not this one"):
    model_folder.locate("facebook/nllb-200-distilled-600M", refuse)
  assert len(asked) == 1 and "*.safetensors" not in asked[0][1]
  with pytest.raises(errors.ConfigError) as info:
    model_folder.locate("Helsinki-NLP/missing")
  assert str(info.value) == (
    "--input=Helsinki-NLP/missing: could not download it from the Hub (OSError: 404 Client "
    "Error: Repository Not Found)."
  )
  with pytest.raises(errors.ConfigError, match="no such folder, nor a Hub id"):
    model_folder.locate(str(tmp_path / "not" / "here"))


def test_a_hand_built_marian_table_lands_where_the_ids_and_features_say():
  """Marian's row m, feature k is our row `order^-1[m]`, feature 2k (a sine) or 2(k - D/2) + 1:
  written out by hand, apart from the conversion's own index arithmetic."""
  vocab, d = 6, 4  # Marian ids: </s> 0, <unk> 1, a 2, b 3, c 4, <pad> 5
  shared = np.arange(vocab * d, dtype=np.float32).reshape(vocab, d)
  sd = {
    "model.shared.weight": shared,
    "final_logits_bias": np.arange(vocab, dtype=np.float32)[None],
  }
  order = pair_vocabulary.marian_order({"</s>": 0, "<unk>": 1, "a": 2, "b": 3, "c": 4, "<pad>": 5})
  ours = marian.to_ours(sd, order, 0, 0)
  table = ours["embedding"]["embedding"]
  rows = {PAD_ID: 5, EOS_ID: 0, UNK_ID: 1, 3: 2, 4: 3, 5: 4}  # our id: Marian id
  for our_id, marian_id in rows.items():
    m = shared[marian_id]
    np.testing.assert_array_equal(table[our_id], [m[0], m[2], m[1], m[3]])
    assert ours["logits_bias"][our_id] == marian_id


def test_attention_pictures_and_alignments_follow_the_decoders_own_depth():
  from flaxformer_nmt.config import builders  # pylint: disable=g-import-not-at-top
  from flaxformer_nmt.decoding import attention_pictures  # pylint: disable=g-import-not-at-top

  cfg = TransformerConfig(
    vocab_size=20, num_layers=1, num_decoder_layers=3, d_model=8, d_ff=16, num_heads=2
  )
  params = _random_params(cfg)
  maps = attention_pictures.attention_maps(Transformer(cfg), params, [5, 6, EOS_ID], [7, EOS_ID])
  assert maps["encoder_self_attention"].shape[0] == 1
  assert maps["decoder_self_attention"].shape[0] == maps["cross_attention"].shape[0] == 3
  config = builders.base_config("tiny")
  config.model.update(num_layers=1, num_decoder_layers=3)
  config.decode.alignment_layer = 2
  builders.validate(config)  # the decoder's last layer
  config.decode.alignment_layer = 3
  with pytest.raises(errors.ConfigError, match="names no decoder layer of the model's 3"):
    builders.validate(config)


def test_imports_mistakes_each_say_what_to_do(tmp_path, monkeypatch):
  """Issue 60, defect 6: one of our runs given to --mode=import said "model_type is None", a
  config.json holding a JSON array "no such file", and a mistyped local folder that looks like
  org/name that it "needs huggingface_hub"."""
  import sys  # pylint: disable=g-import-not-at-top

  from flaxformer_nmt.importing import imported_run, model_folder  # pylint: disable=g-import-not-at-top

  ours = tmp_path / "ours"
  ours.mkdir()
  (ours / "config.json").write_text('{"model": {}, "data": {}, "decode": {}}')
  with pytest.raises(errors.ConfigError) as info:
    imported_run.import_run(str(ours), str(tmp_path / "new"))
  assert str(info.value) == (
    f"--input={ours} is a flaxformer_nmt run, not a transformers model: fine-tune it with "
    f"--config.init_from={ours}, or translate with --workdir={ours}."
  )
  listed = tmp_path / "listed"
  listed.mkdir()
  (listed / "config.json").write_text("[1, 2]")
  with pytest.raises(errors.DataError, match=r"holds a JSON list, not a transformers model's"):
    imported_run.import_run(str(listed), str(tmp_path / "new"))
  monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # not installed
  monkeypatch.chdir(tmp_path)
  with pytest.raises(errors.ConfigError) as info:
    model_folder.locate("models/opus")
  assert str(info.value).startswith("--input=models/opus: no such folder; read as a Hub id,")
  assert not (tmp_path / "new").exists()


def test_an_imported_run_asked_for_training_checkpoints_says_to_fine_tune(tmp_path):
  """Issue 60, defect 6: --checkpoint=latest on an imported run said to train it (refused), and
  --mode=average said the count must be "between 1 and that (0)"."""
  from flaxformer_nmt.run import selection  # pylint: disable=g-import-not-at-top
  from flaxformer_nmt.run.folder import Workdir  # pylint: disable=g-import-not-at-top

  run = Workdir(str(tmp_path / "imported"))
  run.create()
  run.write_run_record("", {"kind": "imported", "source": "Helsinki-NLP/opus-mt-en-de"})
  for asked, call in (
    ("--checkpoint=latest", lambda: selection.resolve(run, "latest")),
    ("--checkpoint=ema", lambda: selection.resolve(run, "ema")),
    ("--mode=average", lambda: selection.average_plan(run, 2, "auto")),
  ):
    with pytest.raises(errors.CheckpointError) as info:
      call()
    assert str(info.value) == (
      f"{asked}: {run.path} is an imported model; it has no training checkpoints, only its "
      f"imported parameters (--checkpoint=auto). To train it, fine-tune it into a new workdir "
      f"with --config.init_from={run.path}."
    )


def test_a_transformers_folder_given_as_a_run_says_import_it_first(tmp_path, tiny_config):
  """Issue 62: api.load and config.init_from on a transformers model folder (an export, an
  OPUS-MT download) said "not a saved flaxformer_nmt config" and "not a trained workdir"."""
  import json  # pylint: disable=g-import-not-at-top

  from flaxformer_nmt import api  # pylint: disable=g-import-not-at-top
  from flaxformer_nmt.run.folder import Workdir  # pylint: disable=g-import-not-at-top
  from flaxformer_nmt.training import init_from  # pylint: disable=g-import-not-at-top

  hf = tmp_path / "opus-mt-en-de"
  hf.mkdir()
  (hf / "config.json").write_text(json.dumps({"model_type": "marian", "d_model": 32}))
  with pytest.raises(errors.ConfigError) as info:
    api.load(str(hf))
  assert str(info.value) == (
    f"{hf} is a transformers model (model_type 'marian'), not a run: import it first "
    f"(--mode=import --input={hf} --workdir=NEW), then use NEW."
  )
  tiny_config.init_from = str(hf)
  with pytest.raises(errors.CheckpointError) as info:
    init_from.check(tiny_config, Workdir(str(tmp_path / "new")))
  assert str(info.value) == (
    f"config.init_from={hf} is a transformers model (model_type 'marian'), not a run: import "
    f"it first (--mode=import --input={hf} --workdir=NEW), then --config.init_from=NEW."
  )


@pytest.mark.parametrize(
  "name,tokenizer_langs,codes,want",
  [
    # transformers' convert script writes source_lang as the folder name's start: "opus-mt-en".
    ("opus-mt-en-de", ("opus-mt-en", "de"), "", ("en", "de", "")),
    (
      "opus-mt-gem-gem",
      ("opus-mt-gem", "gem"),
      "deu,eng,nld",
      ("gem", "deu", "gem-deu,gem-eng,gem-nld"),
    ),
    ("opus-mt-sla-sla", None, "ces,pol,rus", ("sla", "ces", "sla-ces,sla-pol,sla-rus")),
    ("opus-mt-ROMANCE-en", ("opus-mt-ROMANCE", "en"), "", ("mul", "en", "")),
    ("opus-mt-en-ROMANCE", None, "es,fr,it", ("en", "es", "en-es,en-fr,en-it")),
  ],
)
def test_opus_mt_group_models_are_read_as_many_sources_and_targets(
  tmp_path, name, tokenizer_langs, codes, want
):
  """Issue 62: group models were refused with lines about fields the user never set
  ("config.data.src_lang and config.data.tgt_lang are both 'gem'", "'ROMANCE-de,...' is not a
  direction")."""
  import json  # pylint: disable=g-import-not-at-top

  from flaxformer_nmt.config import checks  # pylint: disable=g-import-not-at-top
  from flaxformer_nmt.importing import marian_config  # pylint: disable=g-import-not-at-top

  folder = tmp_path / name
  folder.mkdir()
  if tokenizer_langs:
    src, tgt = tokenizer_langs
    (folder / "tokenizer_config.json").write_text(
      json.dumps({"source_lang": src, "target_lang": tgt})
    )
  vocab = {"</s>": 0, "<unk>": 1, **{f"▁{w}": 2 + i for i, w in enumerate("abcdefgh")}}
  for code in filter(None, codes.split(",")):
    vocab[f">>{code}<<"] = len(vocab)
  vocab["<pad>"] = len(vocab)
  hf = {"model_type": "marian", "d_model": 32, "encoder_layers": 1, "decoder_layers": 1}
  hf.update(encoder_ffn_dim=64, decoder_ffn_dim=64, vocab_size=len(vocab))
  config = marian_config.make_config(str(folder), f"Helsinki-NLP/{name}", hf, vocab)
  checks.validate(config)
  d = config.data
  assert (d.src_lang, d.tgt_lang, d.directions) == want


def test_a_model_whose_target_language_cannot_be_told_names_its_own_files(tmp_path):
  import json  # pylint: disable=g-import-not-at-top

  from flaxformer_nmt.importing import marian_config  # pylint: disable=g-import-not-at-top

  (tmp_path / "tokenizer_config.json").write_text(
    json.dumps({"source_lang": "opus-mt-gem", "target_lang": "gem"})
  )
  vocab = {"</s>": 0, "<unk>": 1, "<pad>": 2}
  hf = {"model_type": "marian", "d_model": 32, "encoder_layers": 1, "decoder_layers": 1}
  hf.update(encoder_ffn_dim=64, vocab_size=3)
  with pytest.raises(errors.ConfigError) as info:
    marian_config.make_config(str(tmp_path), "x", hf, vocab)
  assert str(info.value) == (
    f"{tmp_path}: which language this model writes cannot be told: its target language, from "
    "tokenizer_config.json's target_lang 'gem', is its source's ('gem'), and vocab.json has no "
    ">>xx<< target-language codes."
  )
  (tmp_path / "tokenizer_config.json").unlink()
  with pytest.raises(errors.ConfigError, match="from the name 'opus-mt-ROMANCE-ROMANCE', is a"):
    marian_config.make_config(str(tmp_path), "Helsinki-NLP/opus-mt-ROMANCE-ROMANCE", hf, vocab)
  # A name whose parts are not languages is not read as languages (the defaults stand).
  config = marian_config.make_config(str(tmp_path), "me/opus-mt-en-medical", hf, vocab)
  assert (config.data.src_lang, config.data.tgt_lang) == ("src", "tgt")
