r"""The paper's big model on WMT14 English->German (Table 2: 28.4 BLEU on newstest2014).

  python main.py --config=configs/wmt14_ende_big.py --workdir=runs/big
  python main.py --config=configs/wmt14_ende_big.py --workdir=runs/big \
      --config.data.tokens_per_batch=12500      # half the budget, e.g. on smaller accelerators
  python main.py --config=configs/wmt14_ende_big.py --workdir=runs/big --mode=average \
      --num_checkpoints=20

300k steps, P_drop = 0.3; checkpoints every 10 minutes and the last 20 averaged, as the paper.
"""

from flaxformer_nmt import config_lib


def get_config():
  return config_lib.wmt14_config("big", "en-de")
