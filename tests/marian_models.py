"""Tiny transformers Marian models built in the test, as OPUS-MT's are laid out (the `hf` extra).

Each is a `MarianMTModel` of a few layers with random weights, saved with `save_pretrained`, plus
MarianTokenizer's files: a source and a target SentencePiece model trained on the demo corpus's
English and German sides, and one vocab.json holding both models' pieces (`</s>` 0, `<unk>` 1,
`<pad>` last, as OPUS-MT's conversion orders them). Weights are drawn wider than transformers'
init (and every layer norm and bias perturbed), so that a wrong activation, bias, epsilon or
permutation changes the scores well beyond the 1e-4 the tests allow.
"""

from __future__ import annotations

import io
import json
import pathlib
from typing import Any

import sentencepiece as spm

from flaxformer_nmt.data import demo


def demo_pairs(split: str, size: int, seed: int = 0) -> list[tuple[str, str]]:
  return demo.make_demo_split(split, size, seed)


def _train_spm(lines: list[str], path: pathlib.Path, vocab_size: int) -> None:
  model = io.BytesIO()
  spm.SentencePieceTrainer.train(
    sentence_iterator=iter(lines),
    model_writer=model,
    vocab_size=vocab_size,
    model_type="unigram",
    hard_vocab_limit=False,
    minloglevel=2,
  )
  path.write_bytes(model.getvalue())


def marian_vocabulary(folder: pathlib.Path, vocab_size: int = 120, **langs: str) -> dict[str, int]:
  """source.spm, target.spm, vocab.json and tokenizer_config.json in `folder`, trained on 3,000
  demo pairs; returns vocab.json's map."""
  folder.mkdir(parents=True, exist_ok=True)
  pairs = demo_pairs("train", 3000)
  _train_spm([s for s, _ in pairs], folder / "source.spm", vocab_size)
  _train_spm([t for _, t in pairs], folder / "target.spm", vocab_size)
  vocab: dict[str, int] = {"</s>": 0, "<unk>": 1}
  for name in ("source.spm", "target.spm"):
    sp = spm.SentencePieceProcessor(model_file=str(folder / name))
    for i in range(sp.get_piece_size()):
      if not (sp.is_control(i) or sp.is_unknown(i)):
        vocab.setdefault(sp.id_to_piece(i), len(vocab))
  for code in langs.get("codes", "").split(","):
    if code:
      vocab.setdefault(f">>{code}<<", len(vocab))
  vocab["<pad>"] = len(vocab)
  (folder / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False))
  (folder / "tokenizer_config.json").write_text(
    json.dumps({"source_lang": langs.get("src", "en"), "target_lang": langs.get("tgt", "de")})
  )
  return vocab


def tiny_marian(
  folder: pathlib.Path,
  *,
  activation: str = "swish",
  encoder_layers: int = 2,
  decoder_layers: int = 2,
  seed: int = 0,
  codes: str = "",
) -> Any:
  """A random MarianMTModel (float32, eval mode) saved in `folder` with its tokenizer files."""
  import torch  # pylint: disable=g-import-not-at-top
  from transformers import MarianConfig, MarianMTModel  # pylint: disable=g-import-not-at-top

  vocab = marian_vocabulary(folder, codes=codes)
  pad = vocab["<pad>"]
  config = MarianConfig(
    vocab_size=len(vocab),
    decoder_vocab_size=len(vocab),
    d_model=32,
    encoder_layers=encoder_layers,
    decoder_layers=decoder_layers,
    encoder_attention_heads=4,
    decoder_attention_heads=4,
    encoder_ffn_dim=64,
    decoder_ffn_dim=64,
    activation_function=activation,
    max_position_embeddings=128,
    pad_token_id=pad,
    eos_token_id=0,
    forced_eos_token_id=0,
    decoder_start_token_id=pad,
    scale_embedding=True,
    init_std=0.3,
  )
  torch.manual_seed(seed)
  model = MarianMTModel(config)
  with torch.no_grad():
    for name, p in model.named_parameters():
      if "embed_positions" not in name:
        p.add_(0.2 * torch.randn_like(p))
    model.final_logits_bias.copy_(torch.randn_like(model.final_logits_bias))
  model.eval()
  model.save_pretrained(folder)
  return model


def teacher_forced_log_probs(
  folder: pathlib.Path, sources: list[str], targets: list[str]
) -> list[float]:
  """transformers' own sum of log-probabilities of each target (EOS included), one pair at a
  time, the model and tokenizer loaded from `folder`."""
  import torch  # pylint: disable=g-import-not-at-top
  from transformers import MarianMTModel, MarianTokenizer  # pylint: disable=g-import-not-at-top

  model = MarianMTModel.from_pretrained(folder).eval()
  tokenizer = MarianTokenizer.from_pretrained(folder)
  out = []
  with torch.no_grad():
    for src, tgt in zip(sources, targets, strict=True):
      batch = tokenizer([src], text_target=[tgt], return_tensors="pt")
      logits = model(**batch).logits  # labels shifted right inside, from the decoder start
      logp = torch.log_softmax(logits.double(), dim=-1)
      labels = batch["labels"]
      out.append(float(logp[0].gather(-1, labels[0][:, None]).sum()))
  return out


class Server:
  """`main.py --mode=serve --workdir=RUN` on a free port, stopped on leaving the `with`."""

  def __init__(self, workdir: pathlib.Path, log: pathlib.Path) -> None:
    self.workdir, self.log = workdir, log

  def __enter__(self) -> Server:
    import subprocess  # pylint: disable=g-import-not-at-top
    import sys  # pylint: disable=g-import-not-at-top
    import time  # pylint: disable=g-import-not-at-top
    import urllib.request  # pylint: disable=g-import-not-at-top

    import helpers  # pylint: disable=g-import-not-at-top
    from cluster import free_port  # pylint: disable=g-import-not-at-top

    port = free_port()
    self.url = f"http://127.0.0.1:{port}"
    self.proc = subprocess.Popen(
      [sys.executable, "main.py", "--mode=serve", f"--workdir={self.workdir}", f"--port={port}"],
      cwd=helpers.REPO,
      stdout=open(self.log, "w"),  # noqa: SIM115 (closed with the process)
      stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
      assert self.proc.poll() is None, self.log.read_text()[-4000:]
      try:
        with urllib.request.urlopen(self.url + "/health", timeout=10) as response:
          if json.loads(response.read())["status"] == "ok":
            return self
      except OSError:
        pass
      time.sleep(0.5)
    raise AssertionError(f"the server was not ready: {self.log.read_text()[-4000:]}")

  def translate(self, lines: list[str]) -> list[str]:
    import urllib.request  # pylint: disable=g-import-not-at-top

    request = urllib.request.Request(
      self.url + "/translate",
      data=json.dumps({"text": lines}).encode(),
      headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=120) as response:
      return json.loads(response.read())["translations"]

  def __exit__(self, *exc_info: object) -> None:
    self.proc.kill()
    self.proc.wait(60)
