r"""The paper's base model on WMT14 English->German (Table 2: 27.3 BLEU on newstest2014).

  python main.py --config=configs/wmt14_ende_base.py --workdir=runs/base
  python main.py --config=configs/wmt14_ende_base.py --workdir=runs/base --mode=average \
      --num_checkpoints=5
  python main.py --config=configs/wmt14_ende_base.py --workdir=runs/base --mode=eval

100k steps of ~25k source + 25k target tokens; checkpoints every 10 minutes, as the paper, so the
last 5 can be averaged. Data from tensorflow-datasets (`wmt14_translate/de-en`, run EN->DE).
"""

from flaxformer_nmt import config_lib


def get_config():
  return config_lib.wmt14_config("base", "en-de")
