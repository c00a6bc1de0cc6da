"""Export to CTranslate2: the exported model translates as ours does ([export] extra)."""

import json
import os

import ctranslate2  # the [export] extra; [test] includes it, so CI runs these tests
import numpy as np
import pytest

from flaxformer_nmt import errors
from flaxformer_nmt.data import pipeline as data_lib
from flaxformer_nmt.decoding.session import Session
from flaxformer_nmt.export import ctranslate2 as export
from flaxformer_nmt.run.components import Components
from flaxformer_nmt.run.folder import Workdir

import helpers

# The tests share module fixtures: one worker runs them all (pyproject: --dist=loadgroup).
pytestmark = pytest.mark.xdist_group("export")


class _Run:
  """A workdir's Components and its dev and test sets, as --mode=eval builds them."""

  def __init__(self, config, workdir):
    self.data = data_lib.make_data(config, Workdir(str(workdir)), 8, 0, 1, need_train=False)
    self.components = Components(config, self.data.tokenizer)
    self.config, self.tokenizer = config, self.data.tokenizer
    self.model_cfg = self.components.model_cfg


@pytest.fixture(scope="module")
def exported(trained_demo, tmp_path_factory):
  """(run, params, model_dir): the trained demo and its float32 CTranslate2 export via main.py."""
  folder = tmp_path_factory.mktemp("export")
  result, work, out = helpers.mode_on_a_copy(trained_demo[1], folder, "export")
  assert result["files"] == ["config.json", "model.bin", "shared_vocabulary.json", "spm.model"]
  assert json.loads((work / "export_result.json").read_text())["output"] == str(out)
  config = helpers.demo_config(model__dtype="float32")
  run = _Run(config, work)
  params, _ = helpers.load_params(config, work, "latest")
  return run, params, str(out)


def _ours(run, params, sources, beam):
  return Session(run.components, params).translate_with(sources, beam)


def _caps(run, sources):
  """Our per-sentence output cap (source pieces + EOS + offset), as CTranslate2's length limit."""
  offset = run.config.decode.max_len_offset
  return [len(run.tokenizer.encode(s)) + 1 + offset for s in sources]


def _ct2_translate(
  model_dir: str,
  lines: list[str],
  *,
  beam_size: int = 4,
  max_decoding_length: int = 256,
  translator: ctranslate2.Translator | None = None,
) -> list[str]:
  """Translates `lines` with an exported model: spm.model pieces in, detokenized text out.

  CTranslate2's length penalty (0.6 here, as ours) divides by length^alpha, where ours is GNMT's
  ((5 + len) / 6)^alpha, so beam outputs can differ; greedy (`beam_size=1`) is the same search.
  """
  import sentencepiece as spm  # pylint: disable=g-import-not-at-top

  sp = spm.SentencePieceProcessor(model_file=os.path.join(model_dir, "spm.model"))
  if translator is None:
    translator = ctranslate2.Translator(model_dir, device="cpu")
  results = translator.translate_batch(
    [sp.encode(line, out_type=str) for line in lines],
    max_batch_size=32,
    beam_size=beam_size,
    length_penalty=0.6,
    max_decoding_length=max_decoding_length,
  )
  return [sp.decode(r.hypotheses[0]).strip() for r in results]  # as docs/translating.md


def test_greedy_output_is_ours(exported):
  run, params, model_dir = exported
  sources = [s for s, _ in run.data.pairs("test")]
  ours = _ours(run, params, sources, beam=1)
  translator = ctranslate2.Translator(model_dir, device="cpu")
  theirs = [
    _ct2_translate(model_dir, [s], beam_size=1, max_decoding_length=cap, translator=translator)[0]
    for s, cap in zip(sources, _caps(run, sources), strict=True)
  ]
  assert theirs == ours
  assert len(set(ours)) > len(ours) // 2  # real, varied translations, not one string repeated


def test_beam_four_bleu_is_within_half_a_point(exported, tmp_path):
  """The two beam searches rank by different length penalties, so a few outputs differ; on the
  demo's 40 test sentences one such sentence moved BLEU by 0.6, so this compares 200."""
  import sacrebleu  # pylint: disable=g-import-not-at-top

  _, params, model_dir = exported
  config = helpers.demo_config(
    model__dtype="float32",
    data__demo_test_size=200,
    data__vocab_path=os.path.join(model_dir, "spm.model"),
  )
  run = _Run(config, tmp_path / "workdir")
  pairs = run.data.pairs("test")
  assert len(pairs) == 200
  sources, refs = [s for s, _ in pairs], [r for _, r in pairs]
  ours = _ours(run, params, sources, beam=4)
  theirs = _ct2_translate(
    model_dir, sources, beam_size=4, max_decoding_length=max(_caps(run, sources))
  )
  ours_bleu = sacrebleu.corpus_bleu(ours, [refs]).score
  theirs_bleu = sacrebleu.corpus_bleu(theirs, [refs]).score
  assert ours_bleu > 1.0, ours_bleu  # a model that translates, so the comparison means something
  assert abs(ours_bleu - theirs_bleu) <= 0.5, (ours_bleu, theirs_bleu)


def test_int8_export_translates(exported, tmp_path):
  run, params, _ = exported
  out = tmp_path / "int8"
  result = export.export_ctranslate2(run.model_cfg, params, run.tokenizer, str(out), "int8")
  assert result["quantization"] == "int8"
  float32_bytes = os.path.getsize(os.path.join(exported[2], "model.bin"))
  assert os.path.getsize(out / "model.bin") < 0.5 * float32_bytes
  sources = [s for s, _ in run.data.pairs("test")][:8]
  assert all(_ct2_translate(str(out), sources, beam_size=1))


def test_export_refuses_to_overwrite(exported, tmp_path):
  run, params, _ = exported
  out = tmp_path / "taken"
  out.mkdir()
  (out / "keep.txt").write_text("mine")
  with pytest.raises(errors.ConfigError, match="already exists"):
    export.export_ctranslate2(run.model_cfg, params, run.tokenizer, str(out))
  assert [p.name for p in out.iterdir()] == ["keep.txt"]
  assert not [p for p in tmp_path.iterdir() if p.name.startswith(".export-")]


def test_position_table_interleaves_sines_and_cosines(exported):
  run, params, _ = exported
  table = export.position_table(run.model_cfg, params, "encoder")  # [max_len, d_model]
  pos, d = 7, run.model_cfg.d_model
  np.testing.assert_allclose(
    table[pos, 0::2], np.sin(pos / 10000 ** (np.arange(d // 2) * 2 / d)), atol=1e-5
  )
  np.testing.assert_allclose(
    table[pos, 1::2], np.cos(pos / 10000 ** (np.arange(d // 2) * 2 / d)), atol=1e-5
  )


def test_a_pretrained_models_options_export_and_score_as_ours(tmp_path):
  """swish, attention biases, a logits bias, epsilon 1e-5 and a shallower decoder (an imported
  OPUS-MT model's options, docs/pretrained.md): CTranslate2's teacher-forced scores of the
  export equal ours."""
  import jax  # pylint: disable=g-import-not-at-top

  from flaxformer_nmt.data import demo  # pylint: disable=g-import-not-at-top
  from flaxformer_nmt.data.tokenizer import Tokenizer  # pylint: disable=g-import-not-at-top
  from flaxformer_nmt.decoding import scoring  # pylint: disable=g-import-not-at-top
  from flaxformer_nmt.model import transformer  # pylint: disable=g-import-not-at-top

  tok = Tokenizer(str(helpers.SAVED_RUN / "spm.model"))
  cfg = transformer.TransformerConfig(
    vocab_size=tok.vocab_size,
    num_layers=2,
    num_decoder_layers=1,
    d_model=32,
    d_ff=64,
    num_heads=4,
    activation="swish",
    attention_bias=True,
    logits_bias=True,
    layer_norm_epsilon=1e-5,
    max_len=64,
  )
  params = jax.device_get(transformer.init_params(cfg, jax.random.PRNGKey(0)))
  rng = np.random.default_rng(0)  # every weight non-zero and wide, biases included
  params = jax.tree.map(lambda x: (x + 0.3 * rng.normal(size=x.shape)).astype(np.float32), params)
  out = tmp_path / "ct2"
  export.export_ctranslate2(cfg, params, tok, str(out))
  pairs = demo.make_demo_split("test", 8, 0)
  sources = [tok.encode(s) + [1] for s, _ in pairs]
  targets = [tok.encode_target(t) + [1] for _, t in pairs]

  def padded(rows):
    width = max(map(len, rows))
    return np.asarray([r + [0] * (width - len(r)) for r in rows], np.int32)

  ours, _ = scoring.token_log_probs(
    transformer.Transformer(cfg), params, padded(sources), padded(targets)
  )
  pieces = [[tok.id_to_piece(i) for i in row[:-1]] for row in sources]
  target_pieces = [[tok.id_to_piece(i) for i in row[:-1]] for row in targets]
  results = ctranslate2.Translator(str(out), device="cpu").score_batch(pieces, target_pieces)
  theirs = [sum(r.log_probs) for r in results]
  np.testing.assert_allclose(np.asarray(ours), theirs, rtol=0, atol=1e-3)
