r"""Multi30k English->German (29,000 training pairs), sized for a 2-core CPU.

  flaxformer-nmt --config=multi30k --workdir=runs/m30k --mode=prepare   # download, verify, vocab
  flaxformer-nmt --config=multi30k --workdir=runs/m30k
  python benchmarks/experiments.py --experiment=multi30k --data_dir=data/multi30k --minutes=60

`--mode=prepare` downloads the raw task-1 files (train, val, test_2016_flickr; add
`--config.data.extra_test_sets=all` for the 2017 and 2018 test sets) from `data.url`, the official
Multi30k repository, into `data.dir` (./data/multi30k), each checked against its recorded SHA-256.
Files already in `data.dir` (`--config.data.dir=DIR`) are verified and kept.

Choices, and the experiments behind them (the development machine, 2 CPU cores, trained 6,562
steps of 2,048 tokens in an hour: benchmarks/results/multi30k.json):
- Size "small": 3+3 layers, d_model 256, d_ff 1024, 4 heads (7.6M parameters with the 8k
  vocabulary), the scale published text-only Transformers use on this corpus. Its step on 4,096
  tokens takes about 1 s there (benchmarks/results/train_step_small_cpu.json).
- Dropout 0.1, not the 0.3 common on Multi30k: those runs see ~70 epochs; in a one-hour budget
  regularisation mostly slows learning. An early comparison at 8 minutes of training (same
  settings otherwise, not kept as a record): dev BLEU 13.1 with 0.1 vs 4.2 with 0.3.
- 2,048 tokens per batch (32 packed rows of 64), warmup 400, the paper's schedule (peak 3.1e-3):
  many small updates learn faster per minute than few large ones on a CPU.
- 8,000 shared BPE pieces: fits 29k sentence pairs without splitting words into characters.
- Checkpoints every 100 steps (about a minute there), 10 kept, so the last 5 can be averaged.
"""

from flaxformer_nmt.config import builders
from flaxformer_nmt.data import download


def get_config():
  c = builders.base_config("small")
  c.model.dropout_rate = 0.1
  c.data.source = "files"
  c.data.dir = "data/multi30k"  # relative to the working directory; --mode=prepare fills it
  c.data.url = download.MULTI30K_URL
  c.data.train_prefix, c.data.dev_prefix, c.data.test_prefix = "train", "val", "test_2016_flickr"
  c.data.src_lang, c.data.tgt_lang = "en", "de"
  c.data.vocab_size = 8_000
  c.data.max_len = 64
  c.data.tokens_per_batch = 2_048
  c.model.max_len = 128
  c.optim.warmup_steps = 400
  c.num_train_steps = 20_000
  c.log_every_steps = 100
  c.eval_every_steps = 300
  c.checkpoint_every_steps = 100
  c.keep_checkpoints = 10
  c.eval.dev_bleu_sentences = 1_014  # the whole dev set: the learning curve's y axis
  return c
