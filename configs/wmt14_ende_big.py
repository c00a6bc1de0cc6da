r"""The paper's big model on WMT14 English->German (Table 2: 28.4 BLEU on newstest2014).

  python main.py --config=configs/wmt14_ende_big.py --workdir=runs/big --mode=prepare
  python main.py --config=configs/wmt14_ende_big.py --workdir=runs/big
  python main.py --config=configs/wmt14_ende_big.py --workdir=runs/big \
      --config.optim.accumulate_steps=2      # the same 25k-token update on a 16 GB TPU chip
  python main.py --config=configs/wmt14_ende_big.py --workdir=runs/big --mode=average \
      --num_checkpoints=20
  python main.py --config=configs/wmt14_ende_big.py --workdir=runs/big --mode=eval

300k updates of ~25k tokens, P_drop = 0.3, a checkpoint every 600 steps (the paper's 10 minutes)
and the last 20 averaged; t2t's beam search. `:files` reads your own text files, as in
wmt14_ende_base.py.
"""

from flaxformer_nmt.config import builders


def get_config(data: str = "tfds"):
  return builders.wmt14_config("big", "en-de", data)
