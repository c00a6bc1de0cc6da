r"""Fine-tuning a pretrained model (an imported OPUS-MT model, or any run) on your own text.

  flaxformer-nmt --mode=import --input=Helsinki-NLP/opus-mt-en-de --workdir=runs/opus_ende
  flaxformer-nmt --config=finetune --workdir=runs/opus_ft --config.init_from=runs/opus_ende \
      --config.data.dir=DIR --config.data.test_prefix=NAME

DIR holds `train.<src>`/`train.<tgt>`, `val.*` and `test.*` (name others with
`--config.data.{train,dev,test}_prefix`; Multi30k's test set is `test_2016_flickr`). The model's
architecture and its vocabulary come from `config.init_from` (run/selection.py ADOPTED;
docs/pretrained.md), so nothing here restates them, and a model field typed on the command line
that differs from the source's is refused in one line. The languages are the data's: en-de here,
`--config.data.src_lang=fr --config.data.tgt_lang=en` for another pair.

The settings, and why (docs/pretrained.md, "Fine-tune"):
- The constant schedule: 500 warmup steps up to the rate, then that rate. A pretrained model needs
  no decay from a high rate; the paper's schedule would start it from its peak.
- `optim.lr_scale=0.05`: a rate of 0.05 * d_model^-0.5 * 500^-0.5 = 1e-4 for d_model 512
  (OPUS-MT), 7e-5 for 1024 (opus-mt-tc-big): the range fine-tuning Marian models is done at.
- dropout 0.1 (the pretrained models' own), label smoothing 0.1, batches of 4,096 target tokens,
  sentences of up to 128 pieces.
- Evaluation every 250 steps; `best_metric="dev_bleu"` keeps the best one in best/ and stops
  after 4 evaluations without a better one (1,000 steps); 2,000 steps at most; beam 4.
"""

from flaxformer_nmt.config import builders


def get_config():
  c = builders.base_config("base")  # its model fields are replaced by init_from's
  c.model.dropout_rate = 0.1
  c.data.source = "files"
  c.data.dir = ""  # yours: --config.data.dir=DIR
  c.data.train_prefix, c.data.dev_prefix, c.data.test_prefix = "train", "val", "test"
  c.data.max_len = 128
  c.data.tokens_per_batch = 4_096
  c.optim.schedule = "constant"
  c.optim.warmup_steps = 500
  c.optim.lr_scale = 0.05
  c.num_train_steps = 2_000
  c.log_every_steps = 50
  c.eval_every_steps = 250
  c.checkpoint_every_steps = 250
  c.keep_checkpoints = 4
  c.best_metric = "dev_bleu"
  c.early_stopping_patience = 4
  c.decode.beam_size = 4
  return c
