r"""`--mode=import` at the sizes users import: time, peak memory, and scores equal to transformers'.

  python benchmarks/import_sizes.py  # needs the hf extra: pip install -e ".[hf]"
  python benchmarks/import_sizes.py --models=opus-mt-tc-big --sentences=5

For each model shape a random model is built with transformers' own config and class (float32)
and saved as `save_pretrained` saves it, with tokenizer files of the real vocabulary size (a
SentencePiece model trained on the demo corpus, vocab.json filled up with made-up pieces). Each
step runs in its own process, so each peak RSS is that step's alone:
- build: the random transformers model saved (not timed as part of the import);
- import: `python main.py --mode=import --input=FOLDER --workdir=RUN` (seconds, peak RSS);
- ours: `python main.py --mode=score` of a few demo pairs in the imported run (seconds, peak RSS);
- theirs: transformers' teacher-forced log-probabilities of the same pairs (float32).
The record's `max_abs_difference` is the largest |ours - theirs| of a pair's total log-probability.
For M2M100 shapes ours counts the forced target-language token as 0 (as our search scores it),
so theirs leaves that token's log-probability out too.

The shapes (transformers' configs of these models, parameters counted with the tied embedding
once): opus-mt-tc-big (Marian, d 1024, 16 heads, FFN 4096, 6+6, ReLU, 57,059 pieces),
m2m100-418m (d 1024, 16 heads, FFN 4096, 12+12, 128,112 ids) and nllb-600m (NLLB-200 distilled
600M's shape: M2M100's with 256,206 ids; its tokenizer here is M2M100's, recorded before
--mode=import read NLLB's). Last line: JSON.
"""

from __future__ import annotations

import json
import os
import pathlib
import resource
import subprocess
import sys
import tempfile
import time
from typing import Any

from absl import app, flags

REPO = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from flaxformer_nmt.benchmarking import record  # noqa: E402

SHAPES: dict[str, dict[str, Any]] = {
  "opus-mt-tc-big": dict(
    family="marian", vocab=57_059, d=1024, heads=16, ffn=4096, layers=(6, 6), act="relu"
  ),
  "m2m100-418m": dict(
    family="m2m100", vocab=128_112, d=1024, heads=16, ffn=4096, layers=(12, 12), act="relu"
  ),
  "nllb-600m": dict(
    family="m2m100", vocab=256_206, d=1024, heads=16, ffn=4096, layers=(12, 12), act="relu"
  ),
  # Small ones, to try the script in seconds (not in the default list).
  "tiny-marian": dict(
    family="marian", vocab=3000, d=32, heads=4, ffn=64, layers=(2, 1), act="relu"
  ),
  "tiny-m2m100": dict(
    family="m2m100", vocab=3000, d=32, heads=4, ffn=64, layers=(1, 2), act="relu"
  ),
}

FLAGS = flags.FLAGS
flags.DEFINE_list("models", list(SHAPES)[:3], f"Which shapes: {', '.join(SHAPES)}.")
flags.DEFINE_integer("sentences", 5, "Demo pairs scored by both.")
flags.DEFINE_string("step", "", "Internal: one step of one model in this process.")
flags.DEFINE_string("model", "", "Internal: the shape of --step.")
flags.DEFINE_string("folder", "", "Internal: the model folder of --step.")


def _spm(lines: list[str], path: pathlib.Path) -> list[str]:
  """A SentencePiece model of `lines` at `path`; its pieces (no control pieces)."""
  import io  # pylint: disable=g-import-not-at-top

  import sentencepiece as spm  # pylint: disable=g-import-not-at-top

  model = io.BytesIO()
  spm.SentencePieceTrainer.train(
    sentence_iterator=iter(lines),
    model_writer=model,
    vocab_size=400,
    hard_vocab_limit=False,
    minloglevel=2,
  )
  path.write_bytes(model.getvalue())
  sp = spm.SentencePieceProcessor(model_file=str(path))
  return [
    sp.id_to_piece(i)
    for i in range(sp.get_piece_size())
    if not (sp.is_control(i) or sp.is_unknown(i))
  ]


def _pairs(n: int, split: str = "test") -> list[tuple[str, str]]:
  from flaxformer_nmt.data import demo  # pylint: disable=g-import-not-at-top

  return demo.make_demo_split(split, n, 0)


def build(name: str, folder: pathlib.Path) -> dict[str, Any]:
  """The random transformers model of shape `name`, saved in `folder` with tokenizer files."""
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top

  s = SHAPES[name]
  folder.mkdir(parents=True)
  text = [x for pair in _pairs(3000, "train") for x in pair]
  sizes = dict(
    d_model=s["d"],
    encoder_layers=s["layers"][0],
    decoder_layers=s["layers"][1],
    encoder_attention_heads=s["heads"],
    decoder_attention_heads=s["heads"],
    encoder_ffn_dim=s["ffn"],
    decoder_ffn_dim=s["ffn"],
    activation_function=s["act"],
  )
  torch.manual_seed(0)
  if s["family"] == "marian":
    pieces = _spm(text, folder / "source.spm")
    (folder / "target.spm").write_bytes((folder / "source.spm").read_bytes())
    vocab = {"</s>": 0, "<unk>": 1}
    for p in pieces:
      vocab.setdefault(p, len(vocab))
    while len(vocab) < s["vocab"] - 1:
      vocab[f"made{len(vocab)}"] = len(vocab)
    vocab["<pad>"] = len(vocab)
    (folder / "tokenizer_config.json").write_text(
      json.dumps({"source_lang": "en", "target_lang": "de"})
    )
    config = transformers.MarianConfig(
      vocab_size=len(vocab),
      decoder_vocab_size=len(vocab),
      max_position_embeddings=1024,
      pad_token_id=vocab["<pad>"],
      eos_token_id=0,
      forced_eos_token_id=0,
      decoder_start_token_id=vocab["<pad>"],
      scale_embedding=True,
      **sizes,
    )
    model = transformers.MarianMTModel(config)
  else:
    pieces = _spm(text, folder / "sentencepiece.bpe.model")
    vocab = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3}
    for p in pieces:
      vocab.setdefault(p, len(vocab))
    while len(vocab) < s["vocab"] - 100:  # the 100 language tokens come after
      vocab[f"made{len(vocab)}"] = len(vocab)
    tok = {"tokenizer_class": "M2M100Tokenizer", "src_lang": "en", "tgt_lang": "de"}
    (folder / "tokenizer_config.json").write_text(json.dumps(tok))
    config = transformers.M2M100Config(vocab_size=s["vocab"], **sizes)
    model = transformers.M2M100ForConditionalGeneration(config)
  (folder / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False))
  model.eval().save_pretrained(folder)
  return {"parameters": int(sum(p.numel() for p in model.parameters()))}


def theirs(name: str, folder: pathlib.Path, n: int) -> dict[str, Any]:
  """transformers' teacher-forced total log-probability of each pair (float32 model)."""
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top

  marian = SHAPES[name]["family"] == "marian"
  cls = transformers.MarianMTModel if marian else transformers.M2M100ForConditionalGeneration
  model = cls.from_pretrained(folder).eval()
  if marian:
    tokenizer = transformers.MarianTokenizer.from_pretrained(folder)
  else:
    tokenizer = transformers.M2M100Tokenizer.from_pretrained(folder, src_lang="en", tgt_lang="de")
  out = []
  with torch.no_grad():
    for src, tgt in _pairs(n):
      batch = tokenizer([src], text_target=[tgt], return_tensors="pt")
      logp = torch.log_softmax(model(**batch).logits.double(), dim=-1)[0]
      labels = batch["labels"][0]
      picked = logp.gather(-1, labels[:, None])[:, 0]
      out.append(float(picked.sum() - (0 if marian else picked[0])))  # M2M100: forced token
  return {"log_probs": out}


def _timed(args: list[str]) -> tuple[subprocess.CompletedProcess, float, float]:
  """(the finished process, its seconds, its peak RSS in GiB): one child at a time, so
  RUSAGE_CHILDREN's maximum is this child's once it exceeds every earlier one; os.wait4 gives it
  exactly."""
  start = time.perf_counter()
  proc = subprocess.Popen(args, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  out, err = proc.communicate()
  seconds = time.perf_counter() - start
  rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2**20  # KiB -> GiB
  done = subprocess.CompletedProcess(args, proc.returncode, out, err)
  if proc.returncode:
    raise RuntimeError(f"{' '.join(args[:4])} failed: {err[-2000:]}")
  return done, seconds, rss


def _rss_of(args: list[str]) -> tuple[subprocess.CompletedProcess, float, float]:
  """`_timed` in a fresh process tree, so the peak is this step's alone."""
  wrapper = [sys.executable, __file__, "--step=measure", "--", *args]
  done, seconds, _ = _timed(wrapper)
  *own, last = done.stdout.strip().splitlines()
  done.stdout = "\n".join(own)  # the step's own output; the wrapper's line is the peak
  return done, seconds, json.loads(last)["peak_rss_gib"]


def measure(args: list[str]) -> None:
  """--step=measure: runs `args` as the only child and prints its peak RSS (GiB)."""
  done, _, rss = _timed(args)
  sys.stdout.write(done.stdout)
  print(json.dumps({"peak_rss_gib": rss}))


def one(name: str, root: pathlib.Path) -> dict[str, Any]:
  me = [sys.executable, __file__]
  folder, run = root / name, root / f"{name}_run"
  built, build_s, build_rss = _rss_of(
    [*me, "--step=build", f"--model={name}", f"--folder={folder}"]
  )
  row: dict[str, Any] = {**json.loads(built.stdout.strip().splitlines()[-1])}
  row.update(build_seconds=round(build_s, 1), build_peak_rss_gib=round(build_rss, 2))
  main = [sys.executable, "main.py"]
  _, import_s, import_rss = _rss_of(
    [*main, "--mode=import", f"--input={folder}", f"--workdir={run}"]
  )
  row.update(import_seconds=round(import_s, 1), import_peak_rss_gib=round(import_rss, 2))
  pairs = _pairs(FLAGS.sentences)
  (root / "src.txt").write_text("\n".join(s for s, _ in pairs) + "\n")
  (root / "tgt.txt").write_text("\n".join(t for _, t in pairs) + "\n")
  score = [
    *main,
    f"--workdir={run}",
    "--mode=score",
    f"--input={root / 'src.txt'}",
    f"--reference={root / 'tgt.txt'}",
    f"--output={root / 'ours.tsv'}",
  ]
  _, score_s, score_rss = _rss_of(score)
  ours = [float(line.split("\t")[1]) for line in (root / "ours.tsv").read_text().splitlines()]
  done, _, _ = _rss_of(
    [
      *me,
      "--step=theirs",
      f"--model={name}",
      f"--folder={folder}",
      f"--sentences={FLAGS.sentences}",
    ]
  )
  their = json.loads(done.stdout.strip().splitlines()[-1])["log_probs"]
  diff = max(abs(a - b) for a, b in zip(ours, their, strict=True))
  row.update(
    score_seconds=round(score_s, 1),
    score_peak_rss_gib=round(score_rss, 2),
    pairs=len(ours),
    max_abs_difference=diff,
    mean_log_prob=sum(their) / len(their),
  )
  print(f"{name}: {json.dumps(row)}", flush=True)
  return row


def main(argv: list[str]) -> None:
  if FLAGS.step == "measure":
    measure(argv[1:])
    return
  if FLAGS.step == "build":
    print(json.dumps(build(FLAGS.model, pathlib.Path(FLAGS.folder))))
    return
  if FLAGS.step == "theirs":
    print(json.dumps(theirs(FLAGS.model, pathlib.Path(FLAGS.folder), FLAGS.sentences)))
    return
  unknown = [m for m in FLAGS.models if m not in SHAPES]
  if unknown:
    raise app.UsageError(f"--models: unknown {unknown[0]!r}; choose from {', '.join(SHAPES)}.")
  rows = {}
  with tempfile.TemporaryDirectory(dir=os.environ.get("TMPDIR")) as root:
    for name in FLAGS.models:
      rows[name] = one(name, pathlib.Path(root))
      for leftover in pathlib.Path(root).iterdir():  # the next model needs the disk
        if leftover.is_dir():
          subprocess.run(["rm", "-rf", str(leftover)], check=True)
  record.report({"sentences": FLAGS.sentences, "models": rows})


if __name__ == "__main__":
  app.run(main)
