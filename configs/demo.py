r"""Offline demo: English number expressions to German, generated in code (no download).

  python main.py --config=configs/demo.py --workdir=runs/demo

"three hundred and forty-five" -> "dreihundertfünfundvierzig" needs reordering (units before tens)
and compounding, so the model must learn real attention. A tiny model (2+2 layers, d_model 128)
trains in a few minutes on a 2-core CPU and reports greedy and beam-4 sacreBLEU on held-out data.
"""

from flaxformer_nmt.config import builders


def get_config():
  c = builders.base_config("tiny")
  c.data.source = "demo"
  # 400 pieces split numbers into their parts (fünf|hundert|acht|zig), which the model composes;
  # at 1,000 BPE glues parts together and learning is markedly slower.
  c.data.vocab_size = 400
  c.data.vocab_sample_size = 50_000
  c.data.max_len = 64
  # Small batches, many updates: on 2 CPU cores a step of 2,048 tokens takes ~0.3 s, and within a
  # few minutes the number of updates, not the batch size, limits what the model learns.
  c.data.tokens_per_batch = 2_048
  c.model.max_len = 64
  c.model.dropout_rate = 0.0  # unlimited generated data: nothing to regularise
  c.optim.warmup_steps = 200
  c.optim.lr_scale = 0.5  # peak 3.1e-3 at step 200
  c.num_train_steps = 600
  c.log_every_steps = 50
  c.eval_every_steps = 300
  c.checkpoint_every_steps = 200
  c.keep_checkpoints = 5
  c.eval.dev_bleu_sentences = 200
  return c
