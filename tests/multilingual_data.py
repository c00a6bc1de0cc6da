"""A tiny multilingual corpus and run (en from and into de and fr, de-fr zero-shot) that trains in
seconds: tests/e2e/test_multilingual.py trains it as 1 and 2 processes, the `hf` leg exports it.
Each language's sentence i is the same word indices, so every direction is a word-for-word map."""

from __future__ import annotations

import pathlib

import numpy as np

# One word list per language, aligned: sentence i is the same word indices in each.
WORDS = {
  "en": "a dog runs two men talk the red car is fast small big house".split(),
  "de": "ein hund rennt zwei männer reden das rote auto ist schnell klein groß haus".split(),
  "fr": "un chien court deux hommes parlent la rouge voiture est vite petit grand maison".split(),
}


def _corpus(n: int, seed: int) -> list[list[int]]:
  rng = np.random.default_rng(seed)
  return [
    rng.integers(0, len(WORDS["en"]), size=int(rng.integers(2, 7))).tolist() for _ in range(n)
  ]


def _write(folder: pathlib.Path, name: str, lang: str, sentences: list[list[int]]) -> None:
  text = "".join(" ".join(WORDS[lang][i] for i in s) + "\n" for s in sentences)
  (folder / name).write_text(text, encoding="utf-8")


def make_data(folder: pathlib.Path) -> pathlib.Path:
  """en-de (600 pairs) and en-fr (150) in fairseq's names, so the directions differ in size;
  multi-way val and test files for all three languages (de-fr is scored zero-shot)."""
  folder.mkdir(parents=True, exist_ok=True)
  for pair, n, seed in (("en-de", 600, 1), ("en-fr", 150, 2)):
    sentences = _corpus(n, seed)
    for lang in pair.split("-"):
      _write(folder, f"train.{pair}.{lang}", lang, sentences)
  for split, seed in (("val", 3), ("test", 4)):
    sentences = _corpus(12, seed)
    for lang in WORDS:
      _write(folder, f"{split}.{lang}", lang, sentences)
  return folder


def tiny(data_dir: pathlib.Path) -> list[str]:
  return [
    "--config=configs/multi30k_multilingual.py",
    f"--config.data.dir={data_dir}",
    "--config.data.url=",
    "--config.data.test_prefix=test",
    "--config.data.directions=en-de,de-en,en-fr,fr-en",
    "--config.data.zero_shot=de-fr",
    "--config.data.vocab_size=100",
    "--config.data.max_len=16",
    "--config.data.tokens_per_batch=256",  # 16 rows: 2 per device
    "--config.model.size=tiny",
    "--config.model.num_layers=1",
    "--config.model.d_model=32",
    "--config.model.d_ff=64",
    "--config.model.num_heads=2",
    "--config.model.max_len=32",
    "--config.optim.warmup_steps=10",
    "--config.num_train_steps=12",
    "--config.log_every_steps=1",
    "--config.eval_every_steps=12",
    "--config.checkpoint_every_steps=6",
    "--config.eval.dev_bleu_sentences=6",
    "--config.decode.beam_size=2",
    "--config.decode.batch_size=4",
    "--config.decode.max_len_offset=5",
  ]
