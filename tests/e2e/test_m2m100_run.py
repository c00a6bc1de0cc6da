"""An M2M100 model made a run, end to end, without torch (issue 62, item 1): `--mode=import`, the
command line's --source_lang / --target_lang, export back to the M2M100 format and in again
bitwise, and a LoRA fine-tune on the user's own files in a vocabulary of NLLB-200's size
(256,000 made-up pieces first, 256,3xx ids), every token id above 65,535 (stored as int32,
data/tokenized.py); and an NLLB-200 folder (its own tokenizer files) made a run.

It cannot reuse the shared trained fixtures: they are our post-LN paper models with a
SentencePiece vocabulary, and this needs an M2M100 folder (tests/m2m100_models.handmade_m2m100:
random weights of M2M100's shape, written as transformers names them). Agreement with
transformers itself (greedy with a forced token, teacher-forced scores) is the `hf` leg's
tests/e2e/test_m2m100.py."""

from __future__ import annotations

import glob
import json
import os

import numpy as np
import pytest

from flaxformer_nmt import api
from flaxformer_nmt.data import demo
from flaxformer_nmt.importing.model_folder import state_dict

import helpers
import m2m100_models

pytestmark = pytest.mark.xdist_group("m2m100_run")

_DUMMY = 256_000  # NLLB-200-sized (256,206 ids): every real piece's id is above 65,535


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
  root = tmp_path_factory.mktemp("m2m100")
  m2m100_models.handmade_m2m100(root / "model", dummy_pieces=_DUMMY)
  result = api.import_model(str(root / "model"), str(root / "run"))
  return root, result


def test_import_makes_a_many_to_many_run(imported):
  root, result = imported
  assert result["vocab_size"] > _DUMMY and len(result["target_languages"]) == 100
  config = json.loads((root / "run" / "config.json").read_text())
  d = config["data"]
  assert (d["lang_tokens"], d["src_lang"], d["tgt_lang"]) == ("m2m100", "en", "de")
  assert d["languages"].split(",")[:3] == ["af", "am", "ar"]
  assert sorted(os.listdir(root / "run" / "vocabulary")) == [
    "sentencepiece.bpe.model",
    "tokenizer_config.json",
    "vocab.json",
  ]


def test_the_command_line_chooses_both_languages(imported, tmp_path):
  root, _ = imported
  lines = [s for s, _ in demo.make_demo_split("test", 6, 0)]
  (tmp_path / "in.txt").write_text("\n".join(lines) + "\n")
  outputs = {}
  for langs in (("en", "de"), ("en", "fr"), ("fr", "de")):
    proc = helpers.run_main(
      f"--workdir={root / 'run'}",
      "--mode=translate",
      f"--input={tmp_path / 'in.txt'}",
      "--output=-",
      "--config.decode.method=greedy",
      f"--source_lang={langs[0]}",
      f"--target_lang={langs[1]}",
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    outputs[langs] = proc.stdout.splitlines()[: len(lines)]
  # The default request is the import's en-de; the API gives the command line's output.
  session = api.load(str(root / "run"), overrides={"decode.method": "greedy"})
  assert session.translate(lines) == outputs[("en", "de")]
  assert session.translate(lines, target_lang="fr") == outputs[("en", "fr")]
  assert session.translate(lines, source_lang="fr") == outputs[("fr", "de")]
  # Either token changes what the model computes (a random model, but not a constant one).
  assert len({tuple(v) for v in outputs.values()}) == 3
  proc = helpers.run_main(
    f"--workdir={root / 'run'}",
    "--mode=translate",
    f"--input={tmp_path / 'in.txt'}",
    "--output=-",
    "--target_lang=deu",
  )
  assert proc.returncode == 2 and proc.stderr.strip().splitlines()[-1].startswith(
    "error: --target_lang=deu: this model has no such language (closest: de)"
  ), proc.stderr[-500:]


def test_export_writes_m2m100_and_imports_back_bitwise(imported, tmp_path):
  root, _ = imported
  api.export(None, str(root / "run"), str(tmp_path / "hf"), fmt="huggingface")
  config = json.loads((tmp_path / "hf" / "config.json").read_text())
  assert config["model_type"] == "m2m_100"
  ours, theirs = state_dict(str(tmp_path / "hf")), state_dict(str(root / "model"))
  assert sorted(ours) == sorted(theirs)
  for name, value in theirs.items():
    np.testing.assert_array_equal(ours[name], value, err_msg=name)
  for name in ("sentencepiece.bpe.model", "vocab.json"):
    assert (tmp_path / "hf" / name).read_bytes() == (root / "model" / name).read_bytes()


def test_a_lora_fine_tune_on_ids_above_uint16(imported, tmp_path):
  """Fine-tuning the import on the user's own en-de files: every source starts with `__en__`,
  every target with `__de__` (the token the search forces), all ids above 65,535 kept whole."""
  root, _ = imported
  data = tmp_path / "data"
  data.mkdir()
  for prefix, split, n in (("train", "train", 200), ("val", "dev", 8), ("test", "test", 8)):
    pairs = demo.make_demo_split(split, n, 0)
    (data / f"{prefix}.en").write_text("\n".join(s for s, _ in pairs) + "\n")
    (data / f"{prefix}.de").write_text("\n".join(t for _, t in pairs) + "\n")
  work = tmp_path / "ft"
  proc = helpers.run_main(
    "--config=configs/finetune.py",
    f"--workdir={work}",
    f"--config.init_from={root / 'run'}",
    f"--config.data.dir={data}",
    "--config.num_train_steps=4",
    "--config.eval_every_steps=4",
    "--config.checkpoint_every_steps=4",
    "--config.data.tokens_per_batch=512",
    "--config.optim.lora_rank=2",
    "--config.eval.dev_bleu_sentences=4",
    timeout=600,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert json.loads(proc.stdout.strip().splitlines()[-1])["step"] == 4
  (cache,) = glob.glob(str(work / "data_cache" / "train-*.npz"))
  split = np.load(cache)
  assert split["src_ids"].dtype == np.int32 and split["src_ids"].min() > 65_535
  vocabulary = api.load(str(work)).components.tokenizer
  en, de = vocabulary.language_id("en"), vocabulary.language_id("de")
  starts = split["src_offsets"][:-1]
  assert (split["src_ids"][starts] == en).all()
  assert (split["tgt_ids"][split["tgt_offsets"][:-1]] == de).all()
  # Its adapters go out for PEFT with M2M100's module names (no Marian feature permutation).
  from safetensors.numpy import load_file  # pylint: disable=g-import-not-at-top

  api.export(None, str(work), str(tmp_path / "peft"), fmt="peft")
  config = json.loads((tmp_path / "peft" / "adapter_config.json").read_text())
  assert config["r"] == 2 and sorted(config["target_modules"]) == [
    "k_proj",
    "out_proj",
    "q_proj",
    "v_proj",
  ]
  tensors = load_file(str(tmp_path / "peft" / "adapter_model.safetensors"))
  assert "base_model.model.model.decoder.layers.0.encoder_attn.q_proj.lora_B.weight" in tensors


def test_ctranslate2_translates_an_m2m100_run_as_ours(imported, tmp_path):
  """--format=ctranslate2 of a many-to-many run, used as CTranslate2 uses M2M100: the source
  token in front, the target token as target_prefix. Greedy, into two languages, with our length
  rule (source + EOS + 50): every line equal."""
  import ctranslate2  # pylint: disable=g-import-not-at-top  # the [test] extra has it

  root, _ = imported
  api.export(None, str(root / "run"), str(tmp_path / "ct2"))
  session = api.load(str(root / "run"), overrides={"decode.method": "greedy"})
  vocab = session.components.tokenizer
  lines = [s for s, _ in demo.make_demo_split("test", 12, 0)]
  translator = ctranslate2.Translator(str(tmp_path / "ct2"))
  for tgt in ("de", "fr"):
    theirs = []
    for line in lines:
      pieces = ["__en__", *(vocab.id_to_piece(i) for i in vocab.encode(line))]
      (result,) = translator.translate_batch(
        [pieces], target_prefix=[[f"__{tgt}__"]], beam_size=1, max_decoding_length=len(pieces) + 51
      )
      theirs.append(vocab.decode([vocab.piece_id(p) for p in result.hypotheses[0]]))
    assert session.translate(lines, target_lang=tgt) == theirs


def test_the_server_compiles_and_serves_both_languages(imported):
  """--mode=serve's side: every precompiled batch shape of the default request (the forced token
  is an input of the same program), then a request naming other languages."""
  from flaxformer_nmt.decoding.session import Session  # pylint: disable=g-import-not-at-top
  from flaxformer_nmt.serving import protocol, service  # pylint: disable=g-import-not-at-top
  from flaxformer_nmt.serving.options import Options  # pylint: disable=g-import-not-at-top

  root, _ = imported
  session = api.load(str(root / "run"), overrides={"decode.method": "greedy"})
  assert isinstance(session, Session)
  allowed = service.limits(session.config.decode, Options(), session.config.data)
  assert (allowed.default_source, allowed.default_target) == ("en", "de")
  served = service.ServedSession(session)
  kinds = service.precompiled(allowed)
  assert service.compile_all(served, kinds[:1]) > 0
  lines = [s for s, _ in demo.make_demo_split("test", 3, 0)]
  body = json.dumps({"text": lines, "source_lang": "fr", "target_lang": "pt"}).encode()
  asked = protocol.parse_request(body, allowed)
  hypotheses, _ = served.translate(asked.kind, asked.lines, list(range(len(lines))))
  assert [h[0].text for h in hypotheses] == session.translate(lines, "pt", source_lang="fr")


@pytest.fixture(scope="module")
def nllb(tmp_path_factory):
  root = tmp_path_factory.mktemp("nllb")
  m2m100_models.handmade_m2m100(root / "model", nllb=True)
  api.import_model(str(root / "model"), str(root / "run"))
  return root


def test_an_nllb_model_is_a_run_with_its_language_codes(nllb):
  """NLLB-200's tokenizer files (no vocab.json; tokenizer.json's dictionary, codes such as
  eng_Latn as the tokens themselves): imported, translated into each language, its codes named
  in a refusal, and exported with the same tokenizer files and weights."""
  from flaxformer_nmt import errors  # pylint: disable=g-import-not-at-top

  root = nllb
  d = json.loads((root / "run" / "config.json").read_text())["data"]
  assert (d["lang_tag_format"], d["src_lang"], d["tgt_lang"]) == ("{}", "eng_Latn", "deu_Latn")
  assert d["languages"] == ",".join(m2m100_models.NLLB_CODES)
  assert sorted(os.listdir(root / "run" / "vocabulary")) == [
    "sentencepiece.bpe.model",
    "tokenizer.json",
    "tokenizer_config.json",
  ]
  session = api.load(str(root / "run"), overrides={"decode.method": "greedy"})
  vocabulary = session.components.tokenizer
  dictionary = json.loads((root / "model" / "tokenizer.json").read_text())["model"]["vocab"]
  for code in m2m100_models.NLLB_CODES:  # our id of each code is tokenizer.json's, renumbered
    ours = vocabulary.language_id(code)
    assert vocabulary.id_to_piece(ours) == code
    added = json.loads((root / "model" / "tokenizer.json").read_text())["added_tokens"]
    theirs = next(a["id"] for a in added if a["content"] == code)
    assert int(vocabulary.fairseq_ids[ours]) == theirs > max(dictionary.values())
  line = "three hundred and forty-two chairs"
  pieces = [vocabulary.id_to_piece(i) for i in vocabulary.encode(line)]
  assert [dictionary[p] for p in pieces] == [
    int(vocabulary.fairseq_ids[i]) for i in vocabulary.encode(line)
  ]
  lines = [s for s, _ in demo.make_demo_split("test", 6, 0)]
  into = {tgt: session.translate(lines, target_lang=tgt) for tgt in ("deu_Latn", "fra_Latn")}
  assert into["deu_Latn"] == session.translate(lines) and into["deu_Latn"] != into["fra_Latn"]
  with pytest.raises(errors.ConfigError, match=r"--target_lang=de: .*\(closest: deu_Latn\)"):
    session.translate(lines, target_lang="de")
  api.export(None, str(root / "run"), str(root / "hf"), fmt="huggingface")
  for name in ("sentencepiece.bpe.model", "tokenizer.json"):
    assert (root / "hf" / name).read_bytes() == (root / "model" / name).read_bytes()
  tok = json.loads((root / "hf" / "tokenizer_config.json").read_text())
  assert (tok["tokenizer_class"], tok["src_lang"], tok["tgt_lang"]) == (
    "NllbTokenizer",
    "eng_Latn",
    "deu_Latn",
  )
  card = (root / "hf" / "README.md").read_text()
  assert 'NllbTokenizer.from_pretrained(PATH, src_lang="eng_Latn")' in card
  assert 'tokenizer.convert_tokens_to_ids("deu_Latn")' in card
  ours, theirs = state_dict(str(root / "hf")), state_dict(str(root / "model"))
  assert sorted(ours) == sorted(theirs)
  for name, value in theirs.items():
    np.testing.assert_array_equal(ours[name], value, err_msg=name)
