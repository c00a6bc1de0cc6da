r"""Multi30k English->German (29,000 training pairs) from local files.

  python main.py --config=configs/multi30k.py --workdir=runs/m30k \
      --config.data.dir=../shared/data/multi30k

A first cut sized for the corpus and a 2-core CPU (tuned in issue 6): the "small" size (3+3
layers, d_model 256, P_drop 0.3, as published text-only Transformers on this task use), an 8k
shared BPE vocabulary, and ~4k-token batches.
"""

from flaxformer_nmt import config_lib


def get_config():
  c = config_lib.base_config("small")
  c.data.source = "files"
  c.data.dir = ""  # --config.data.dir=../shared/data/multi30k
  c.data.train_prefix, c.data.dev_prefix, c.data.test_prefix = "train", "val", "test_2016_flickr"
  c.data.src_lang, c.data.tgt_lang = "en", "de"
  c.data.vocab_size = 8_000
  c.data.max_len = 64
  c.data.tokens_per_batch = 4_096
  c.model.max_len = 128
  c.optim.warmup_steps = 1_000
  c.num_train_steps = 10_000
  c.log_every_steps = 100
  c.eval_every_steps = 1_000
  c.checkpoint_every_steps = 1_000
  c.keep_checkpoints = 10
  return c
