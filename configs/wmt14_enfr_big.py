r"""The paper's big model on WMT14 English->French (Table 2: 41.8 BLEU on newstest2014).

  python main.py --config=configs/wmt14_enfr_big.py --workdir=runs/enfr_big --mode=prepare
  python main.py --config=configs/wmt14_enfr_big.py --workdir=runs/enfr_big
  python main.py --config=configs/wmt14_enfr_big.py --workdir=runs/enfr_big --mode=average \
      --num_checkpoints=20
  python main.py --config=configs/wmt14_enfr_big.py --workdir=runs/enfr_big --mode=eval

As the paper: 32,000 word-pieces, and P_drop = 0.1 (not the big model's 0.3) for this pair;
300k updates, checkpoints every 600 steps, the last 20 averaged. Its tokenized BLEU is Moses +
multi-bleu *without* the ##AT## compound split, which belongs to t2t's EN-DE script.
`:files` reads your own text files (train.en/.fr, newstest2013.*, newstest2014.*).
"""

from flaxformer_nmt.config import builders


def get_config(data: str = "tfds"):
  c = builders.wmt14_config("big", "en-fr", data)
  c.model.dropout_rate = 0.1
  return c
