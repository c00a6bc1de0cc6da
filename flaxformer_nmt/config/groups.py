"""The default of every field outside config.model, group by group: config.optim, config.data,
config.decode and config.eval as builders.base_config puts them together (the paper's settings,
and what each field means). A field's comment here is its documentation.
"""

from __future__ import annotations

import ml_collections


def optim_config() -> ml_collections.ConfigDict:
  """config.optim: Adam and the paper's schedule (Sec. 5.3), accumulation, EMA, loss scale."""
  return ml_collections.ConfigDict(
    dict(
      warmup_steps=4_000,
      beta1=0.9,
      beta2=0.98,
      eps=1e-9,
      lr_scale=1.0,  # multiplies the schedule
      # "paper": warmup, then the inverse square root (Sec. 5.3); "constant": the same warmup,
      # then its peak held (lr_scale * d_model^-0.5 * warmup^-0.5), for fine-tuning.
      schedule="paper",
      # Split each device's share of the batch into this many micro-batches, run one after
      # another inside the step, their gradients summed: the same update with 1/k of the
      # activation memory. data.tokens_per_batch stays the batch of one update.
      accumulate_steps=1,
      # > 0: also keep ema <- decay * ema + (1 - decay) * params after every update (float32, in
      # the optimizer state), evaluated beside the raw parameters; --checkpoint=ema reads it.
      # 0.9999 is Marian's smoothing for long runs; shorter runs want 0.999 or less.
      ema_decay=0.0,
      # model.dtype="float16" only: the loss is multiplied by a scale that starts here, halves
      # on a step whose gradient overflows (the update is skipped) and doubles after
      # loss_scale_period finite steps in a row (training/loss_scale.py).
      loss_scale_init=2.0**15,
      loss_scale_period=2000,
      # > 0: fine-tune low-rank adapters of this rank instead of every parameter (LoRA,
      # training/lora.py): each targeted kernel W trains as W0 + (lora_alpha / lora_rank) * A @ B
      # with W0 frozen; needs config.init_from (the model to adapt). lora_targets: which kernels,
      # of q, k, v, o (every attention's projections) and ffn_in, ffn_out. lora_dropout: dropout
      # on the adapters' inputs only (PEFT's lora_dropout; the model's own dropout applies too).
      lora_rank=0,
      lora_alpha=16.0,
      lora_targets="q,k,v,o",
      lora_dropout=0.0,
    )
  )


def data_config() -> ml_collections.ConfigDict:
  """config.data: where the pairs come from, the vocabulary, a batch's token budget."""
  return ml_collections.ConfigDict(
    dict(
      source="demo",  # "demo" | "tfds" | "files"
      # TFDS: the builder's name; its supervised keys are (de, en) / (fr, en).
      tfds_name="wmt14_translate/de-en",
      tfds_data_dir="",  # "" = TFDS default
      train_split="train",
      dev_split="validation",  # newstest2013
      test_split="test",  # newstest2014
      src_lang="en",
      tgt_lang="de",
      # Local files: <dir>/<prefix>.<lang>[.gz], or a .tsv via <prefix>.tsv.
      dir="",
      # Where --mode=prepare downloads the files into `dir` from (Multi30k only: its files'
      # checksums are recorded in data/download.py); "" = the files are already there.
      url="",
      # Multi30k test sets fetched besides test_prefix's: comma-separated names of
      # data/download.py's MULTI30K_EXTRA_TEST_SETS, or "all".
      extra_test_sets="",
      train_prefix="train",
      dev_prefix="val",
      test_prefix="test",
      # Many directions in one model (docs/multilingual.md): "en-de,de-en,en-fr" replaces
      # src_lang/tgt_lang; every source starts with its target language's tag (<2de>).
      directions="",
      # Training corpora of every direction, "PREFIX[:WEIGHT[:TAG]],...", e.g. "train,bt:0.5:<BT>"
      # (tagged back-translation); "" = train_prefix alone. Files: <prefix>.<src>-<tgt>.<lang>
      # (fairseq's names) or the multi-way <prefix>.<lang>.
      corpora="",
      lang_tag_format="<2{}>",  # how a language's tag is spelled; an imported OPUS-MT's ">>{}<<"
      # How language tokens are used: "" = a multilingual run's target tag in front of the
      # source (above); "m2m100" = the source language's token in front of the source and the
      # target language's forced as the first output (an imported M2M100: docs/pretrained.md).
      lang_tokens="",
      # A many-to-many model's languages ("m2m100" tokens), comma-separated: any into any.
      languages="",
      # Directions sampled with p proportional to size^(1/temperature) (1 = as the data is).
      temperature=5.0,
      # Directions scored on the test set but never trained, e.g. "de-fr,fr-de".
      zero_shot="",
      # Vocabulary (SentencePiece, shared by both languages).
      vocab_size=37_000,
      vocab_model_type="bpe",
      vocab_sample_size=1_000_000,  # sentences per language used to train it
      vocab_path="",  # "" = <workdir>/spm.model, trained when absent
      # Batching: a global budget of source tokens and of target tokens per update, over all
      # devices of all processes (and all micro-batches, see optim.accumulate_steps).
      tokens_per_batch=25_000,
      max_len=256,  # pairs with either side longer (in tokens) are dropped and counted
      # Training batches packed ahead in a background thread (data/prefetch.py), while the
      # device computes; 0 = pack each in the training loop.
      prefetch_batches=2,
      # Demo generator sizes.
      demo_train_size=200_000,
      demo_dev_size=500,
      demo_test_size=1_000,
      demo_seed=0,  # the demo corpus's own seed, so runs that differ in `seed` share data
    )
  )


def decode_config() -> ml_collections.ConfigDict:
  """config.decode: the search (the paper's beam 4, alpha 0.6; greedy; sampling), batches."""
  return ml_collections.ConfigDict(
    dict(
      beam_size=4,
      alpha=0.6,  # length penalty ((5 + len) / 6) ** alpha
      # "t2t": K live hypotheses from the top 2K plus the K best finished, as tensor2tensor (which
      # gave the paper's BLEU); "shrinking": a finished hypothesis keeps its slot, so the live
      # beam shrinks (beam 1 is then exactly greedy). See decoding/beam_search.py.
      beam_style="shrinking",
      max_len_offset=50,  # maximum output length = input length + this
      batch_size=64,  # sentences per device in a decoding batch (all devices decode)
      # --mode=translate's search: "beam" (beam_size; 1 = greedy), "greedy", or "sample" (each
      # token drawn from the model's distribution; for back-translation). Eval and the dev BLEU
      # during training always score greedy and beam output.
      method="beam",
      # Sampling (decoding/sampling.py): log-probabilities divided by temperature (> 0), then only
      # the top_k most likely tokens (0 = all), then the smallest set reaching top_p (1.0 = all).
      temperature=1.0,
      top_k=0,
      top_p=1.0,
      seed=0,  # sampling's seed: the same seed and input give the same samples on any devices
      # --alignments: the decoder layer whose cross-attention (averaged over heads) aligns words;
      # negative counts from the top. The last one aligned best on the demo and Multi30k models
      # (docs/decoding.md shows both layers' alignments).
      alignment_layer=-1,
    )
  )


def eval_config() -> ml_collections.ConfigDict:
  """config.eval: what dev and test evaluation score; tokenized BLEU's compound split."""
  return ml_collections.ConfigDict(
    dict(
      dev_bleu_sentences=256,  # dev sentences decoded at each eval during training
      dev_bleu_beam_size=1,  # greedy during training to keep evals cheap
      # The final test (and --mode=eval) scores the first N test sentences of each direction;
      # 0 = all. For short experiments: decoding a whole test set can take longer than training.
      max_test_sentences=0,
      # Tokenized BLEU's ##AT## compound split (t2t's EN-DE script): "auto" = for German targets
      # only (EN-FR's tokenized BLEU is Moses + multi-bleu without it), "on", "off".
      compound_split="auto",
      # Also report BLEU by a published protocol, beside the others, in dev and test figures
      # (decoding/bleu.py): "multi30k" = the Multi30k papers' BLEU4 on lowercased,
      # punctuation-normalized, Moses-tokenized text (task1-tokenize.sh; no compound split).
      bleu_protocol="",
    )
  )
