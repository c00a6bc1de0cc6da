"""The pretrained-model family of tests/error_cases.py's table (import, fine-tuning, LoRA, the
transformers formats, many-to-many languages): kept apart so that each file stays one readable
table; error_cases.CASES joins them."""

from __future__ import annotations

from error_setups import (
  Case,
  fine_tuning,
  importing,
  importing_into_a_users_folder,
  in_trained,
  many_to_many,
  transformers_folder_as,
  translating,
)

PRETRAINED_CASES = [
  Case(
    "fine-tuning from a missing workdir",
    fine_tuning("{base}/nothere"),
    "/nothere: not a trained workdir",
    trained=False,
  ),
  Case(
    "fine-tuning from a folder without checkpoints",
    fine_tuning("{base}/not_a_run"),
    "/not_a_run: not a trained workdir",
    trained=False,
  ),
  Case(
    "import of a model with an option this one has not",
    importing(decoder_ffn_dim=1024),
    "the encoder and decoder have different feed-forward widths; this model has no such option",
    trained=False,
  ),
  Case(
    "import of a folder that is neither Marian nor M2M100",
    importing(model_type="bart"),
    "model_type is 'bart'; --mode=import reads Marian and M2M100 models",
    trained=False,
  ),
  Case(
    "import of one of our runs",
    transformers_folder_as("import_run"),
    "is a flaxformer_nmt run, not a transformers model: fine-tune it with --config.init_from=",
    trained=False,
  ),
  Case(
    "a transformers model used as a run",
    transformers_folder_as("workdir"),
    "opus-mt-en-de is a transformers model (model_type 'marian'), not a run: import it first",
    trained=False,
  ),
  Case(
    "fine-tuning from a transformers model",
    transformers_folder_as("init_from"),
    "is a transformers model (model_type 'marian'), not a run: import it first",
    trained=False,
  ),
  Case(
    "import into a folder of other files",
    importing_into_a_users_folder,
    "is not empty and holds no run (vocabulary/glossary.txt)",
    trained=False,
  ),
  Case(
    "export to transformers over a folder",
    in_trained(
      "--config=configs/demo.py", "--mode=export", "--format=huggingface", "--output={base}"
    ),
    "already exists and is not an empty directory",
  ),
  Case(
    "LoRA without a model to adapt",
    lambda base, trained: [
      f"--workdir={base / 'fresh'}",
      "--config=configs/demo.py",
      "--config.optim.lora_rank=8",
      "--config.optim.ema_decay=0.0",  # the saved run's flags (arguments()) keep one
    ],
    "config.optim.lora_rank=8 adapts a trained model, but config.init_from is empty",
    trained=False,
  ),
  Case(
    "unknown LoRA target",
    in_trained(
      "--config=configs/demo.py", "--config.optim.lora_rank=8", "--config.optim.lora_targets=q,wq"
    ),
    "'wq' is not a LoRA target",
  ),
  Case(
    "LoRA dropout without adapters",
    in_trained("--config=configs/demo.py", "--config.optim.lora_dropout=0.1"),
    "config.optim.lora_dropout=0.1 drops out the adapters' inputs, but config.optim.lora_rank=0",
  ),
  Case(
    "LoRA dropout outside [0, 1)",
    in_trained(
      "--config=configs/demo.py", "--config.optim.lora_rank=8", "--config.optim.lora_dropout=1.0"
    ),
    "config.optim.lora_dropout must be in [0, 1), got 1.0.",
  ),
  Case(
    "LoRA with a parameter average",
    fine_tuning("{trained}", "--config.optim.lora_rank=8", "--config.optim.ema_decay=0.9"),
    "a parameter average of the adapters is not the average of the merged models",
    trained=False,
  ),
  Case(
    "LoRA turned on in a run under way",
    in_trained(
      "--config=configs/demo.py",
      "--config.optim.lora_rank=8",
      "--config.init_from={base}/workdir",
      "--config.optim.ema_decay=0.0",  # the trained run keeps one, which LoRA refuses
    ),
    "a run under way keeps what it trains",
  ),
  Case(
    "PEFT export of a run without adapters",
    in_trained("--config=configs/demo.py", "--mode=export", "--format=peft", "--output={base}/o"),
    "was not trained with config.optim.lora_rank > 0, so it has no adapters",
  ),
  Case(
    "import of an M2M100 model with another tokenizer",
    # M2M100's architecture with a tokenizer neither M2M100's nor NLLB-200's.
    importing("m2m100-t5-tokenizer", {"tokenizer_class": "T5Tokenizer"}, model_type="m2m_100"),
    "tokenizer_class 'T5Tokenizer'; --mode=import reads an M2M100 model with M2M100's or "
    "NLLB-200's tokenizer",
    trained=False,
  ),
  Case(
    "import of an M2M100 model with unscaled embeddings",
    importing("m2m100-unscaled", model_type="m2m_100", scale_embedding=False),
    "m2m100-unscaled/config.json: scale_embedding is false (unscaled embeddings); this model has "
    "no such option",
    trained=False,
  ),
  Case(
    "import of an M2M100 model whose encoder and decoder differ in heads",
    importing("m2m100-heads", model_type="m2m_100", decoder_attention_heads=4),
    "the encoder and decoder have different numbers of attention heads",
    trained=False,
  ),
  Case(
    "import of an M2M100 model with an untied output projection",
    importing("m2m100-untied", model_type="m2m_100", tie_word_embeddings=False),
    "its output projection is not the embedding (tie_word_embeddings is false)",
    trained=False,
  ),
  Case(
    "import of an NLLB-200 model in its old token layout",
    # Refused from tokenizer_config.json alone, before config.json's sizes are read.
    importing(
      "nllb-legacy",
      {"tokenizer_class": "NllbTokenizer", "legacy_behaviour": True},
      model_type="m2m_100",
    ),
    "legacy_behaviour is true (NLLB's old layout, the language code after </s>)",
    trained=False,
  ),
  Case(
    "a language an M2M100 model lacks",
    many_to_many("--target_lang=deu"),
    "--target_lang=deu: this model has no such language (closest: de)",
  ),
  Case(
    "a source language the model does not read",
    translating("--source_lang=fr"),
    "--source_lang=fr: this model reads en only",
  ),
]
