"""The values a config field or a flag may take, in one place: `checks.validate` enforces them, and
the code that acts on a value imports its tuple from here (so the searches, the model and the
evaluation import no validation code, and no two lists can drift apart)."""

DTYPES = ("auto", "float32", "bfloat16", "float16")
# "none": an imported model's (importing/imported_run.py): no data of its own; eval and
# fine-tuning name theirs (data.source=files, data.dir).
SOURCES = ("demo", "tfds", "files", "none")
VOCAB_MODEL_TYPES = ("bpe", "unigram", "char", "word")
# "m2m100": M2M100 / NLLB's table ([sin | cos] halves, positions from 2: model/layers.py).
POSITIONALS = ("sinusoidal", "learned", "m2m100")
# The decoder's first input: "pad" (ours: no BOS, as the flax WMT example), "eos" (fairseq's and
# M2M100's `</s>`, model/transformer.py).
DECODER_STARTS = ("pad", "eos")
# How a multilingual model's language tokens are used (config/directions.py): "" = the target's
# tag in front of the source (ours, Johnson et al. 2017's); "m2m100" = the source's token in front
# of the source, the target's forced as the first output (M2M100 / NLLB-200's).
LANG_TOKENS = ("", "m2m100")
ACTIVATIONS = ("relu", "swish", "silu", "gelu", "gelu_new")  # model/layers.ACTIVATIONS
DROPOUT_RNGS = ("threefry16", "threefry", "rbg")  # model/layers.dropout_keep_mask
# model/attention_choice.py: "auto" (cuDNN's fused kernel where it runs, else ours), ours
# (model/attention.dot_product_attention), jax.nn.dot_product_attention's XLA or cuDNN kernel
ATTENTIONS = ("auto", "ours", "jax", "cudnn")
BEAM_STYLES = ("shrinking", "t2t")  # decoding/beam_search.py's module docstring
DECODE_METHODS = ("beam", "greedy", "sample")  # decoding/decode.SearchConfig
COMPOUND_SPLITS = ("auto", "on", "off")  # decoding/evaluation.splits_compounds
# A published BLEU protocol reported beside the others (decoding/bleu.py protocol_bleu): "" none;
# "multi30k": lowercased, punctuation-normalized, Moses-tokenized BLEU4 (the Multi30k papers').
BLEU_PROTOCOLS = ("", "multi30k")
SCHEDULES = ("paper", "constant")  # training/optim.SCHEDULES
BEST_METRICS = ("", "dev_bleu", "dev_loss")  # training/best.Tracker
# --checkpoint: auto (the newest average unless training went on after it, else latest), latest,
# averaged (the average written last), best (config.best_metric's best evaluation), ema (the
# parameter average kept in the latest training checkpoint). run/selection.resolve reads them.
CHECKPOINTS = ("auto", "latest", "averaged", "best", "ema")
# JAX's default PRNG keys hold 32 bits: a seed outside [0, 2**32) would silently alias another.
SEED_LIMIT = 1 << 32

# config.optim.lora_targets (training/lora.py): the kernels LoRA adapts.
LORA_TARGETS = ("q", "k", "v", "o", "ffn_in", "ffn_out")
