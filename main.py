r"""flaxformer_nmt command line, for a clone: the same as the installed `flaxformer-nmt` command.

  python main.py --config=configs/demo.py --workdir=runs/demo
  python main.py --config=configs/wmt14_ende_base.py --workdir=runs/base --mode=prepare
  python main.py --config=configs/wmt14_ende_base.py --workdir=runs/base
  python main.py --config=... --workdir=... --mode=eval
  python main.py --config=... --workdir=... --mode=translate --input=in.txt --output=out.txt
  python main.py --config=... --workdir=... --mode=average --num_checkpoints=5
  python main.py --config=... --workdir=... --mode=attention --text="a sentence"

See flaxformer_nmt/cli.py (`--helpfull` lists every flag).
"""

from flaxformer_nmt import cli

if __name__ == "__main__":
  cli.run()
