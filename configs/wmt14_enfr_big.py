r"""The paper's big model on WMT14 English->French (Table 2: 41.8 BLEU on newstest2014).

  python main.py --config=configs/wmt14_enfr_big.py --workdir=runs/enfr_big

As the paper: 32,000 word-pieces, and P_drop = 0.1 (not the big model's 0.3) for this pair.
"""

from flaxformer_nmt import config_lib


def get_config():
  c = config_lib.wmt14_config("big", "en-fr")
  c.model.dropout_rate = 0.1
  return c
