r"""The paper's big model on WMT14 English->French (Table 2: 41.8 BLEU on newstest2014).

  python main.py --config=configs/wmt14_enfr_big.py --workdir=runs/enfr_big

As the paper: 32,000 word-pieces, and P_drop = 0.1 (not 0.3) for this pair; 300k steps.
"""

from flaxformer_nmt import config_lib


def get_config():
  c = config_lib.base_config("big")
  c.model.dropout_rate = 0.1
  c.data.source = "tfds"
  c.data.tfds_name = "wmt14_translate/fr-en"
  c.data.src_lang, c.data.tgt_lang = "en", "fr"
  c.data.vocab_size = 32_000
  c.num_train_steps = 300_000
  c.checkpoint_every_secs = 600
  c.checkpoint_every_steps = 5_000
  return c
