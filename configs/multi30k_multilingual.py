r"""One model for English from and into German, French and Czech (Multi30k), sized for a 2-core CPU.

  flaxformer-nmt --config=multi30k_multilingual --workdir=runs/m30k_multi --mode=prepare
  flaxformer-nmt --config=multi30k_multilingual --workdir=runs/m30k_multi
  flaxformer-nmt --workdir=runs/m30k_multi --mode=translate --target_lang=fr --input=captions.de
  python benchmarks/experiments.py --experiment=multi30k_multilingual --data_dir=data/multi30k \
      --minutes=30

Six trained directions (en-de, de-en, en-fr, fr-en, en-cs, cs-en) from Multi30k's multi-way files
(`<prefix>.<lang>`: the same 29,000 captions in each language), each source starting with its
target language's tag (<2de>: Johnson et al. 2017); de-fr and fr-de are scored zero-shot on
test_2016_flickr, with their off-target rate (docs/multilingual.md). `--mode=prepare` downloads all
four languages.

Everything else is configs/multi30k.py's (the "small" Transformer, the batch, the schedule),
except: a 10,000-piece vocabulary for four languages (trained on a temperature-balanced sample),
and 200 dev sentences per direction for the dev BLEU (6 x 200 greedy translations per evaluation,
about the cost of the bilingual config's 1,014).
"""

from flaxformer_nmt.config import loading


def get_config():
  c = loading.load("multi30k")  # configs/multi30k.py, by name: installed or beside this file
  c.data.directions = "en-de,de-en,en-fr,fr-en,en-cs,cs-en"
  c.data.zero_shot = "de-fr,fr-de"
  c.data.temperature = 5.0
  c.data.vocab_size = 10_000
  c.eval.dev_bleu_sentences = 200
  return c
