"""The command line's flags but --config (absl), defined when cli.py imports this module, and the
modes that read each; --mode=serve's own are in serving/flags.py. Listed as cli.py's own (in
--helpfull, and by flags.FLAGS.get_flags_for_module), as they are flags of `main.py`."""

from __future__ import annotations

from absl import flags

from flaxformer_nmt.config.choices import CHECKPOINTS

_CLI = "flaxformer_nmt.cli"

flags.DEFINE_string(
  "workdir", None, "Directory for checkpoints, vocabulary, logs and outputs.", module_name=_CLI
)
flags.DEFINE_enum(
  "mode",
  "train",
  [
    "prepare",
    "train",
    "eval",
    "translate",
    "score",
    "average",
    "export",
    "import",
    "attention",
    "serve",
  ],
  "What to do. prepare: build the dataset (TFDS) and the vocabulary, once, before training.",
  module_name=_CLI,
)
flags.DEFINE_string(
  "input",
  "-",
  "translate, score: source file, one sentence per line ('-' = stdin); import: a transformers "
  "Marian model folder or Hub id (Helsinki-NLP/opus-mt-en-de).",
  module_name=_CLI,
)
flags.DEFINE_string(
  "reference",
  "",
  "score: the translations to score, one per --input line (the output: per line the score the "
  "n-best list prints, the log-probability and the token count, tab-separated).",
  module_name=_CLI,
)
flags.DEFINE_string(
  "constraints",
  "",
  "translate/eval: a file of terms each translation must contain, one line per input line (or "
  "test sentence), the terms separated by tabs, an empty line for none. Beam search only; each "
  "line's beam widens to the power of two above its terms' pieces.",
  module_name=_CLI,
)
flags.DEFINE_string(
  "output",
  "-",
  "translate, score: output file ('-' = stdout); export: the model directory to write; attention: "
  "the folder of the pictures ('-' = <workdir>/attention).",
  module_name=_CLI,
)
flags.DEFINE_string(
  "text", "", "attention: the sentence to translate and draw attention for.", module_name=_CLI
)
flags.DEFINE_enum(
  "format",
  "ctranslate2",
  ["ctranslate2", "huggingface", "peft"],
  "export: the target engine: CTranslate2, or transformers' Marian format (MarianMTModel); peft: "
  "a LoRA run's adapters, for peft.PeftModel.from_pretrained.",
  module_name=_CLI,
)
flags.DEFINE_string(
  "quantization",
  "float32",
  "export: weight type of the exported model, one of CTranslate2's: float32, int8, "
  "int8_float32, int8_float16, int8_bfloat16, int16, float16, bfloat16.",
  module_name=_CLI,
)
flags.DEFINE_integer(
  "num_checkpoints", 5, "average: how many of the latest checkpoints.", module_name=_CLI
)
flags.DEFINE_integer(
  "nbest",
  1,
  "translate: hypotheses per input line. 1 writes one translation per line; more writes TSV "
  "rows: line number (0-based), rank, score, hypothesis (beam: nbest <= beam_size; sample: that "
  "many samples).",
  module_name=_CLI,
)
flags.DEFINE_string(
  "target_lang",
  "",
  "translate/score/attention/serve: the language a multilingual model translates into (its tag, "
  "<2fr>, starts every source; the source language needs no flag); serve: the default of "
  'requests without "target_lang". A bilingual model needs none. An imported M2M100 model: '
  "its target-language token is forced as the first output (default: the import's).",
  module_name=_CLI,
)
flags.DEFINE_string(
  "source_lang",
  "",
  "translate/score/attention/serve: the language of the input, for a many-to-many model (an "
  "imported M2M100: its token starts every source; default: the import's source language); "
  'serve: the default of requests without "source_lang". Other models read their own.',
  module_name=_CLI,
)
flags.DEFINE_list(
  "ensemble",
  [],
  "eval/translate/score: other workdirs whose models decode together with --workdir's, their "
  "probabilities averaged at each step (same size and vocabulary; each by --checkpoint's rule).",
  module_name=_CLI,
)
flags.DEFINE_bool(
  "alignments",
  False,
  "translate: add word alignments (Pharaoh i-j, 0-based) from the cross-attention of "
  "config.decode.alignment_layer: after ' ||| ' on each line, or as a fifth TSV column.",
  module_name=_CLI,
)
flags.DEFINE_enum(
  "checkpoint",
  "auto",
  list(CHECKPOINTS),
  "eval/translate/export/attention/average: which parameters. auto = the average written last "
  "unless training saved a newer checkpoint since, else latest; averaged = the average written "
  "last; best = config.best_metric's best evaluation (<workdir>/best); ema = the parameter "
  "average of the latest checkpoint (config.optim.ema_decay > 0). average: the K checkpoints up "
  "to the best step (best), or their parameter averages (ema).",
  module_name=_CLI,
)
flags.DEFINE_enum(
  "distributed",
  "auto",
  ["auto", "on", "off"],
  "Multi-process runs (jax.distributed): 'auto' joins one where JAX detects a "
  "cluster of several processes (TPU pod slice, SLURM, Open MPI, Kubernetes) or "
  "JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES and JAX_PROCESS_ID are set; 'on' "
  "always calls jax.distributed.initialize(); 'off' never.",
  module_name=_CLI,
)


# Flags that only some modes read: given with another mode they would be ignored without a word.
MODE_ONLY_FLAGS = {
  "nbest": ("translate",),
  "alignments": ("translate",),
  "target_lang": ("translate", "score", "attention", "serve"),
  "source_lang": ("translate", "score", "attention", "serve"),
  "ensemble": ("eval", "translate", "score", "serve"),
  "reference": ("score",),
  "constraints": ("translate", "eval"),
  **{
    name: ("serve",)
    for name in (
      "host",
      "port",
      "max_wait_ms",
      "max_request_bytes",
      "max_request_lines",
      "queue_size",
      "queue_lines",
      "grace_s",
      "allowed_hosts",
      "allowed_origins",
      "token",
    )
  },
}


def mode_only_flag_misused() -> str | None:
  """The one-line error for a flag given to a mode that does not read it, or None."""
  mode = flags.FLAGS.mode
  for name, modes in MODE_ONLY_FLAGS.items():
    if flags.FLAGS[name].present and mode not in modes:
      used = " and ".join(f"--mode={m}" for m in modes)
      return f"--{name} is read by {used} only, not by --mode={mode}."
  return None
