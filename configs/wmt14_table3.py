r"""Table 3 of the paper: one variation of the base EN->DE model per run, scored on newstest2013.

  python main.py --config=configs/wmt14_table3.py:C1 --workdir=runs/table3_C1      # N = 2
  python main.py --config=configs/wmt14_table3.py:C1 --workdir=runs/table3_C1 --mode=eval \
      --checkpoint=latest
  python main.py --config=configs/wmt14_table3.py:E,files --config.data.dir=DIR ...  # own files

Rows (builders.TABLE3): A1-A4 heads 1/4/16/32; B1, B2 d_k 16/32 (d_v stays 64); C1-C3 N = 2/4/8;
C4, C5 d_model 256/1024; C6, C7 d_ff 1024/4096; D1, D2 P_drop 0.0/0.2; D3, D4 eps_ls 0.0/0.2;
E learned positions. As the paper's table: 100k steps of the base recipe, beam 4, no checkpoint
averaging (evaluate with --checkpoint=latest), BLEU on newstest2013.
"""

from flaxformer_nmt.config import builders


def get_config(arg: str = "A1"):
  row, _, data = arg.partition(",")
  return builders.wmt14_table3_config(row, data or "tfds")
