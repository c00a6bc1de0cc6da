r"""The paper's base model on WMT14 English->German (Table 2: 27.3 BLEU on newstest2014).

  python main.py --config=configs/wmt14_ende_base.py --workdir=runs/base --mode=prepare
  python main.py --config=configs/wmt14_ende_base.py --workdir=runs/base
  python main.py --config=configs/wmt14_ende_base.py --workdir=runs/base --mode=average \
      --num_checkpoints=5
  python main.py --config=configs/wmt14_ende_base.py --workdir=runs/base --mode=eval

100k updates of ~25k source + 25k target tokens, a checkpoint every 1,500 steps (the paper's 10
minutes on its hardware) and the last 5 averaged; t2t's beam search (beam 4, alpha 0.6). Data from
tensorflow-datasets (`wmt14_translate/de-en`, run EN->DE; `--mode=prepare` builds it once), or
your own text files with `--config=configs/wmt14_ende_base.py:files --config.data.dir=DIR`
(train.en/.de, newstest2013.en/.de, newstest2014.en/.de). See "WMT14 (Table 2)" in README.md and
docs/wmt14.md.
"""

from flaxformer_nmt.config import builders


def get_config(data: str = "tfds"):
  return builders.wmt14_config("base", "en-de", data)
