r"""The paper's big model on WMT14 English->German (Table 2: 28.4 BLEU on newstest2014).

  python main.py --config=configs/wmt14_ende_big.py --workdir=runs/big
  python main.py --config=configs/wmt14_ende_big.py --workdir=runs/big \
      --config.data.tokens_per_batch=12500      # half the budget, e.g. on smaller accelerators

300k steps, P_drop = 0.3; checkpoints every 10 minutes and the last 20 averaged, as the paper.
"""

from flaxformer_nmt import config_lib


def get_config():
  c = config_lib.base_config("big")
  c.data.source = "tfds"
  c.data.tfds_name = "wmt14_translate/de-en"
  c.data.src_lang, c.data.tgt_lang = "en", "de"
  c.data.vocab_size = 37_000
  c.num_train_steps = 300_000
  c.checkpoint_every_secs = 600
  c.checkpoint_every_steps = 5_000
  return c
