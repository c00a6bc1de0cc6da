"""The table of user mistakes that tests/unit/test_errors.py runs (and tests/e2e/test_errors.py, two
of them, through main.py): each case's set-up (tests/error_setups.py) and the culprit its one line
must name; tests/error_runner.py runs a case as `cli.main` would."""

from __future__ import annotations

import pathlib

from error_cases_pretrained import PRETRAINED_CASES

import helpers
from error_setups import (
  TWO,
  Case,
  bad_corpus,
  busy_port,
  copy_trained,
  data_dir_under_a_file,
  in_trained,
  in_trained_before_config_json,
  kept_none,
  member_with_other_heads,
  member_with_other_vocabulary,
  no_checkpoint,
  translate_bad_utf8,
  translating,
  vocabulary_changed_in_place,
  workdir_is_a_file,
)

CASES = [
  *PRETRAINED_CASES,
  Case("mismatched files", bad_corpus(train_de=TWO), "train.en has 3 lines but"),
  Case(
    "bad UTF-8",
    bad_corpus(val_de=b"Ein Mann .\nZwei \xff Hunde .\nEin Kind .\n"),
    "val.de:2: invalid UTF-8 (byte 0xff at column 6)",
  ),
  Case("empty file", bad_corpus(test_en=b""), "test.en: file is empty"),
  Case("missing file", bad_corpus(val_de=None), "data.dev_prefix='val': missing"),
  Case(
    "over-long line",
    bad_corpus(train_en=b"ok\n" + b"word " * 300_000 + b"\nok\n"),
    "train.en:2: line longer than 1,048,576 bytes",
  ),
  Case(
    "unknown TFDS name",
    in_trained_before_config_json(
      "--config=configs/demo.py",
      "--config.data.source=tfds",
      "--config.data.tfds_name=wmt41_translate/de-en",
    ),
    "data.tfds_name='wmt41_translate/de-en': unknown TFDS dataset",
  ),
  Case(
    "mistyped config field",
    in_trained("--config=configs/demo.py", "--config.modle.d_ff=8"),
    "--config.modle.d_ff: config has no field 'modle'; did you mean --config.model.d_ff?",
  ),
  Case(
    "impossible config value",
    in_trained("--config=configs/demo.py", "--config.model.num_heads=3"),
    "config.model.d_model=16 is not divisible by config.model.num_heads=3",
  ),
  Case(
    "cuDNN attention without an NVIDIA GPU",
    in_trained_before_config_json(
      "--config=configs/demo.py", "--config.model.attention=cudnn", "--config.model.dtype=bfloat16"
    ),
    "config.model.attention='cudnn' runs only on an NVIDIA GPU, and this machine's devices are cpu",
  ),
  Case(
    "cuDNN attention in float32",
    in_trained_before_config_json(
      "--config=configs/demo.py", "--config.model.attention=cudnn", "--config.model.dtype=float32"
    ),
    "config.model.attention='cudnn' computes in bfloat16 or float16 only, but "
    "config.model.dtype='float32'",
  ),
  Case(
    "narrow keys on the jax attention path",
    in_trained("--config=configs/demo.py", "--config.model.d_k=2", "--config.model.attention=jax"),
    "config.model.attention='jax' needs keys as wide as values, but config.model.d_k=2",
  ),
  Case(
    "blocked loss on an untied output layer",
    in_trained_before_config_json(
      "--config=configs/demo.py",
      "--config.model.loss_block_tokens=64",
      "--config.model.share_embeddings=False",
    ),
    "config.model.loss_block_tokens=64 computes the tied output layer in blocks, but "
    "config.model.share_embeddings=False",
  ),
  Case(
    "export of a model CTranslate2 cannot hold",
    in_trained_before_config_json(
      "--config=configs/demo.py", "--mode=export", "--config.model.d_k=2", "--output={base}/ct2"
    ),
    "config.model.d_k=2: CTranslate2's attention splits queries, keys and values",
  ),
  Case(
    "shape-mismatched checkpoint",
    in_trained_before_config_json("--config=configs/demo.py", "--config.model.d_ff=256"),
    "params/decoder_0/ffn/wi/bias has shape (32,) in the checkpoint but (256,) in the model",
  ),
  Case(
    "eval of another model size",
    in_trained_before_config_json(
      "--config=configs/demo.py", "--mode=eval", "--config.model.num_layers=3"
    ),
    "does not match the model",
  ),
  Case(
    "a config that disagrees with the run",
    in_trained("--config=configs/demo.py", "--mode=eval", "--config.model.num_heads=4"),
    "config.model.num_heads=4 disagrees with the run",
  ),
  Case(
    "no --config for a run that saved none",
    in_trained_before_config_json("--mode=eval"),
    "--config is required",
  ),
  Case("translate without a checkpoint", no_checkpoint, "No checkpoint in", trained=False),
  Case(
    "workdir is an existing file",
    workdir_is_a_file,
    "notes.txt exists and is not a directory",
    trained=False,
  ),
  Case(
    "missing translate input",
    in_trained("--config=configs/demo.py", "--mode=translate", "--input={base}/nothere.txt"),
    "nothere.txt: no such file",
  ),
  Case(
    "bad UTF-8 in translate input",
    translate_bad_utf8,
    "in.txt:2: invalid UTF-8 (byte 0xc3 at column 1)",
  ),
  Case(
    "a resume with another vocabulary",
    vocabulary_changed_in_place,
    "has held since its first start, and a run's vocabulary cannot change",
  ),
  Case(
    "unknown learning-rate schedule",
    in_trained("--config=configs/demo.py", "--config.optim.schedule=cosine"),
    "config.optim.schedule must be one of ['paper', 'constant'], got 'cosine'",
  ),
  Case(
    "n-best above the beam",
    translating("--config.decode.beam_size=2", "--nbest=3"),
    "--nbest=3 is more than config.decode.beam_size=2",
  ),
  Case(
    "missing ensemble member",
    translating("--ensemble={base}/nothere"),
    "--ensemble member",
  ),
  Case(
    "n-best list asked of eval",
    in_trained("--config=configs/demo.py", "--mode=eval", "--nbest=2"),
    "--nbest is read by --mode=translate only, not by --mode=eval",
  ),
  Case(
    "a server flag given to another mode",
    in_trained("--config=configs/demo.py", "--mode=eval", "--port=9000"),
    "--port is read by --mode=serve only, not by --mode=eval",
  ),
  Case(
    "serve on a port another program holds",
    lambda base, trained: [
      f"--workdir={copy_trained(base, trained)}",
      "--config=configs/demo.py",
      "--mode=serve",
      f"--port={busy_port()}",
    ],
    "cannot listen there (Address already in use)",
  ),
  Case(
    "serve on a port that cannot be",
    in_trained("--config=configs/demo.py", "--mode=serve", "--port=70000"),
    "--port=70000: give a port number in [1, 65535]",
  ),
  Case(
    "ensemble member with another vocabulary",
    member_with_other_vocabulary,
    "its vocabulary",
  ),
  Case(
    "ensemble member with another head count",
    member_with_other_heads,
    "it was trained with model.num_heads=4 where this config has 2",
  ),
  Case(
    "ema_decay outside [0, 1)",
    in_trained("--config=configs/demo.py", "--config.optim.ema_decay=1.0"),
    "config.optim.ema_decay must be in [0, 1), got 1.0",
  ),
  Case(
    "EMA turned off in a run under way",
    in_trained("--config=configs/demo.py", "--config.optim.ema_decay=0.0"),
    "config.optim.ema_decay=0, but the checkpoints in",
  ),
  Case(
    "unknown best metric",
    in_trained("--config=configs/demo.py", "--config.best_metric=bleu"),
    "config.best_metric must be one of ['', 'dev_bleu', 'dev_loss'], got 'bleu'",
  ),
  Case(
    "negative patience",
    in_trained(
      "--config=configs/demo.py",
      "--config.best_metric=dev_loss",
      "--config.early_stopping_patience=-1",
    ),
    "config.early_stopping_patience must be >= 0, got -1",
  ),
  Case(
    "patience without a best metric",
    in_trained(
      "--config=configs/demo.py", "--config.best_metric=", "--config.early_stopping_patience=3"
    ),
    "config.early_stopping_patience=3 needs config.best_metric",
  ),
  Case(
    "ema of a run that kept none",
    kept_none("ema", "--checkpoint=ema"),
    "was not trained with config.optim.ema_decay > 0",
  ),
  Case(
    "best of a run that kept none",
    kept_none("best", "--checkpoint=best"),
    "--checkpoint=best: no best checkpoint in",
  ),
  Case(
    "negative sampling temperature",
    translating("--config.decode.method=sample", "--config.decode.temperature=-0.5"),
    "config.decode.temperature must be > 0, got -0.5",
  ),
  Case(
    "top_p outside (0, 1]",
    translating("--config.decode.method=sample", "--config.decode.top_p=1.5"),
    "config.decode.top_p must be in (0, 1], got 1.5",
  ),
  Case(
    "more checkpoints to average than saved",
    in_trained("--config=configs/demo.py", "--mode=average", "--num_checkpoints=4"),
    "--num_checkpoints=4, but",
  ),
  Case(
    "missing config file",
    in_trained("--config=configs/nothere.py"),
    "--config=configs/nothere.py: no such file",
  ),
  Case(
    "unknown config variant",
    in_trained("--config=wmt14_table3:Z9"),
    "--config=wmt14_table3:Z9: Unknown Table 3 row 'Z9'",
  ),
  Case(
    "unknown WMT14 data variant",
    in_trained("--config=wmt14_ende_base:bogus"),
    "--config=wmt14_ende_base:bogus: Unknown WMT14 data 'bogus'",
  ),
  Case(
    "a variant of a config that has none",
    in_trained("--config=demo:foo"),
    "--config=demo:foo: demo.py takes no argument after ':'",
  ),
  Case(
    "unknown flag",
    in_trained("--config=configs/demo.py", "--modee=eval"),
    "Unknown command line flag 'modee'",
  ),
  Case(
    "config value of the wrong type",
    in_trained("--config=configs/demo.py", "--config.model.d_ff=big"),
    "flag --config.model.d_ff=big",
  ),
  Case(
    "float16 for a run trained in float32",
    in_trained("--config=configs/demo.py", "--config.model.dtype=float16"),
    "config.model.dtype='float16' disagrees with the run",
  ),
  Case(
    "missing data folder",
    in_trained_before_config_json(
      "--config=configs/demo.py", "--config.data.source=files", "--config.data.dir={base}/m30k"
    ),
    "/m30k': no such folder",
  ),
  Case(
    "translate output is a folder",
    translating("--output={base}"),
    "is a folder; name a file",
  ),
  Case(
    "translate output under a file",
    translating("--output={base}/in.txt/out.txt"),
    "in.txt is a file, not a folder",
  ),
  Case(
    "prepare into a data folder that is a file",
    data_dir_under_a_file(
      "--config=configs/demo.py", "--config.data.source=files", "--config.data.dir={notes}"
    ),
    "notes.txt': is a file, not the folder of the corpus",
  ),
  Case(
    "prepare a download under a file",
    data_dir_under_a_file("--config=configs/multi30k.py", "--config.data.dir={notes}/m30k"),
    "notes.txt/m30k: cannot create the folder",
  ),
  Case(
    "sampling seed beyond 32 bits",
    translating("--config.decode.method=sample", "--config.decode.seed=4294967296"),
    "config.decode.seed must be an integer in [0, 2**32), got 4294967296",
  ),
  Case(
    "half-set multi-process variables",
    in_trained("--config=configs/demo.py", "ENV:JAX_COORDINATOR_ADDRESS=127.0.0.1:1"),
    "JAX_COORDINATOR_ADDRESS is set but JAX_NUM_PROCESSES and JAX_PROCESS_ID not",
  ),
]


# Mistakes in the flags themselves: main.py's flag parsing prints the line and exits.
FLAG_CASES = {
  "no --config for a run that saved none",
  "a transformers model used as a run",
  "n-best list asked of eval",
  "a server flag given to another mode",
  "mistyped config field",
  "missing config file",
  "unknown config variant",
  "unknown WMT14 data variant",
  "a variant of a config that has none",
  "unknown flag",
  "config value of the wrong type",
}


def arguments(case: Case, base: pathlib.Path) -> list[str]:
  """The case's main.py arguments, set up in `base` on a copy of the committed small trained
  workdir (helpers.SAVED_RUN), with that run's config overrides right after
  `--config=configs/demo.py` (the case's own overrides come after them, and win). A flag mistake
  is refused while the flags are parsed, before any work, so it gets none."""
  args = case.setup(base, helpers.SAVED_RUN)
  if case.name in FLAG_CASES or "--config=configs/demo.py" not in args:
    return args
  at = args.index("--config=configs/demo.py") + 1
  return [*args[:at], *helpers.saved_run_flags(), *args[at:]]
