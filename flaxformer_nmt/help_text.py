"""`--help` and `--version`: one short text for `flaxformer-nmt` and `python main.py` alike.

`--help` says what the program does, its modes, this project's flags with one line each, the
configs and three examples, in one screen; `--helpfull` (cli.py) lists every flag with its full
help, absl's too. tests/unit/test_cli_help.py checks that a new mode or flag gets its line here.
"""

from __future__ import annotations

import textwrap

from flaxformer_nmt.config import loading as config_files

MODES = {
  "prepare": "build the dataset (TFDS) and the shared SentencePiece vocabulary, once",
  "train": "train, or resume the workdir's run; ends with dev and test BLEU (the default)",
  "eval": "dev loss and test BLEU (sacreBLEU and tokenized) of --checkpoint",
  "translate": "translate --input to --output (n-best, sampling, ensembles, alignments)",
  "score": "the model's score of each given translation (--input, --reference)",
  "average": "average the parameters of the last --num_checkpoints checkpoints",
  "export": "write a CTranslate2 or transformers (Marian) model to --output",
  "import": "make a run of a transformers Marian model (OPUS-MT): --input=DIR or Hub id",
  "attention": "draw the attention of every layer and head for --text",
  "serve": "keep the model loaded and translate over HTTP, with a page at / (--port)",
}


def version() -> str:
  """The installed package's version (from its metadata; a clone run without an install has none
  and says so)."""
  from importlib import metadata  # pylint: disable=g-import-not-at-top

  try:
    return metadata.version("flaxformer_nmt")
  except metadata.PackageNotFoundError:
    return "unknown (not installed; pip install -e .)"


# One line per flag for `--help` (the flags' own help, longer, is what `--helpfull` shows).
FLAG_LINES = {
  "config": "experiment config: a name or a file (default: a trained workdir's own)",
  "workdir": "the run's folder: checkpoints, vocabulary, records, results",
  "mode": "what to do (above; default train)",
  "checkpoint": "which parameters: auto, latest, averaged, best or ema (default auto)",
  "input": "translate, score: source file (- = stdin); import: Marian folder or Hub id",
  "output": "translate, score: output file (- = stdout); export, attention: the folder",
  "reference": "score: the translations to score, one per --input line",
  "constraints": "translate/eval: terms each translation must contain (tab-separated)",
  "nbest": "translate: hypotheses per line (more than 1: TSV rows with scores)",
  "alignments": "translate: add word alignments (Pharaoh i-j) from the cross-attention",
  "target_lang": "translate, score, serve: a multilingual model's output language (fr)",
  "source_lang": "translate, score, serve: an imported M2M100's input language (en)",
  "ensemble": "eval/translate/score: other workdirs decoding together with --workdir's",
  "num_checkpoints": "average: how many checkpoints (default 5)",
  "text": "attention: the sentence to draw",
  "format": "export: the target engine (ctranslate2, huggingface)",
  "quantization": "export: weight type (float32, int8, float16, ...)",
  "host": "serve: the address (default 127.0.0.1, this machine; others need --token)",
  "port": "serve: the port (default 8080)",
  "max_wait_ms": "serve: how long a request waits for others to share its batch (default 5)",
  "max_request_bytes": "serve: the largest request body (default 1 MB; larger: 413)",
  "max_request_lines": "serve: the most lines in one request (default 10000; more: 413)",
  "queue_size": "serve: requests that may wait; one more gets 503 (default 256)",
  "queue_lines": "serve: lines that may wait, all requests together (default 50000)",
  "grace_s": "serve: seconds the decoding in flight may take after SIGTERM (default 25)",
  "allowed_hosts": "serve: Host names accepted besides localhost, 127.0.0.1, [::1]",
  "allowed_origins": "serve: web pages (scheme://host[:port]) that may call it (CORS)",
  "token": "serve: the token requests carry (generated on a non-loopback --host)",
  "distributed": "multi-process runs: auto (default), on or off",
}


def usage(program: str) -> str:
  """`--help`: what the program does, its modes, this project's flags with one line each, and
  examples. The same text for `flaxformer-nmt` and `python main.py` (each names itself);
  `--helpfull` lists absl's flags too, with each flag's full help."""
  rows = [(f"--{name}", text) for name, text in FLAG_LINES.items()]
  rows += [
    ("--config.FIELD=VALUE", "override a config field, e.g. --config.num_train_steps=1000"),
    ("--version", "print the version and exit"),
    ("--helpfull", "every flag with its full help, absl's included"),
  ]
  width = max(len(flag) for flag, _ in rows) + 2
  return "\n".join(
    [
      f"{program}: the Transformer of 'Attention Is All You Need' (Vaswani et al., 2017) in",
      "JAX/Flax for machine translation: prepare data, train and resume, evaluate with BLEU,",
      "average checkpoints, translate, export.",
      "",
      f"usage: {program} [--config=CONFIG] --workdir=DIR [--mode=MODE] [--config.FIELD=VALUE ...]",
      "",
      "modes:",
      *(f"  {name:<11}{text}" for name, text in MODES.items()),
      "",
      "flags:",
      *(f"  {flag:<{width}}{text}" for flag, text in rows),
      "",
      *textwrap.wrap(
        f"configs: {', '.join(config_files.names())},", width=100, subsequent_indent="  "
      ),
      "  or a config file's path; a variant after ':' (wmt14_ende_base:files, wmt14_table3:C1)",
      "",
      "examples:",
      f"  {program} --config=demo --workdir=runs/demo",
      f"  {program} --workdir=runs/demo --mode=translate --input=in.txt --output=out.txt",
      f"  {program} --workdir=runs/base --mode=average --num_checkpoints=5",
      "",
      "Rerunning a training command on its workdir resumes it; a trained workdir needs no "
      "--config.",
      "Guides: README.md and docs/.",
    ]
  )
