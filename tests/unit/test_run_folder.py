"""A run folder that cannot be misread (issue 52): paths saved absolute, the vocabulary kept in
the run, the training data fingerprinted and checked on resume. These tests run `modes.open_command`
(every command's first step: the saved config and what this command may change of it) on runs
laid out by hand; no training step is run."""

from __future__ import annotations

import os
import pathlib

import pytest

from flaxformer_nmt import errors, modes
from flaxformer_nmt.config import builders
from flaxformer_nmt.data import tokenizer as tokenizer_lib
from flaxformer_nmt.run import identity
from flaxformer_nmt.run.folder import Workdir

_EN = ["a small house", "the red car", "one blue bird", "two old trees"] * 5
_DE = ["ein kleines haus", "das rote auto", "ein blauer vogel", "zwei alte baeume"] * 5


def _begin(config, workdir: str, mode: str):
  """What every mode does first (modes.open_command): the command's config and the run's folder."""
  run = modes.open_command(config, workdir, mode)
  return run.config, run.folder


def _corpus(folder: pathlib.Path, de: list[str]) -> None:
  """train/dev/test of en-de in `folder`; `de` the training targets."""
  folder.mkdir(parents=True)
  for prefix in ("train", "dev", "test"):
    (folder / f"{prefix}.en").write_text("\n".join(_EN) + "\n", encoding="utf-8")
    target = de if prefix == "train" else _DE
    (folder / f"{prefix}.de").write_text("\n".join(target) + "\n", encoding="utf-8")


def _files_config(**data: object):
  c = builders.base_config("tiny")
  c.data.source = "files"
  c.data.train_prefix, c.data.dev_prefix, c.data.test_prefix = "train", "dev", "test"
  c.data.src_lang, c.data.tgt_lang = "en", "de"
  c.data.update(data)
  return c


def _trained(monkeypatch, work: pathlib.Path, config, name: str = "my_config") -> Workdir:
  """A run as a first training command leaves it: config.json as `modes.open_command` made it
  (written by the loop), run.json, and (stood in for) a checkpoint at step 300."""
  config, run = _begin(config, str(work), "train")
  run.keep_vocabulary(config)
  run.write_config(config)
  run.write_run_record(name, identity.training_data(config))
  monkeypatch.setattr(Workdir, "training_steps", lambda self: [300])
  return run


def test_a_relative_data_dir_is_saved_absolute_and_a_resume_elsewhere_reads_it(
  monkeypatch, tmp_path
):
  """Defect 2 of issue 52: data.dir="data" was saved as typed, so a resume started in another
  folder whose data/ held another corpus of the same size trained on it (rc 0)."""
  first, other = tmp_path / "first", tmp_path / "other"
  _corpus(first / "data", _DE)
  _corpus(other / "data", list(reversed(_DE)))  # same lines, same sizes, other pairs
  monkeypatch.chdir(first)
  work = tmp_path / "run"
  _trained(monkeypatch, work, _files_config(dir="data"))
  assert Workdir(str(work)).saved_config()["data"]["dir"] == str(first / "data")
  monkeypatch.chdir(other)
  config, _ = _begin(None, str(work), "train")
  assert config.data.dir == str(first / "data")  # the run's data, from any folder
  # Pointed at the other corpus on purpose: refused in one line naming the file that differs.
  with pytest.raises(
    errors.ConfigError, match=r"trained with `my_config`.* other data: .*train\.de"
  ):
    _begin(_files_config(dir="data"), str(work), "train")


def test_a_resume_is_refused_when_its_data_changed_in_place_and_allowed_once_moved(
  monkeypatch, tmp_path
):
  data = tmp_path / "data"
  _corpus(data, _DE)
  work = tmp_path / "run"
  _trained(monkeypatch, work, _files_config(dir=str(data)))
  # Moved: the same content elsewhere is the run's data, and the new place is taken.
  moved = tmp_path / "moved"
  os.rename(data, moved)
  config, _ = _begin(_files_config(dir=str(moved)), str(work), "train")
  assert config.data.dir == str(moved)
  # Changed in place, same number of lines: refused before any work.
  (moved / "train.de").write_text("\n".join(_DE[1:] + _DE[:1]) + "\n", encoding="utf-8")
  with pytest.raises(errors.ConfigError, match="was trained on other data"):
    _begin(_files_config(dir=str(moved)), str(work), "train")


def test_a_vocabulary_given_by_a_relative_path_is_kept_in_the_run(monkeypatch, tmp_path):
  """Defect 3 of issue 52: data.vocab_path="spm/v.model" was saved as typed, so translate
  started in another folder used the other folder's spm/v.model and wrote nonsense (rc 0); and
  the absolute path to the same file was refused, the field being fixed."""
  first, other = tmp_path / "first", tmp_path / "other"
  for folder, lines in ((first, _EN + _DE), (other, _DE)):
    (folder / "spm").mkdir(parents=True)
    tokenizer_lib.train_tokenizer(lines, str(folder / "spm" / "v"), 40)
  _corpus(first / "data", _DE)
  monkeypatch.chdir(first)
  work = tmp_path / "run"
  run = _trained(monkeypatch, work, _files_config(dir="data", vocab_path="spm/v.model"))
  monkeypatch.chdir(other)
  own = run.vocabulary()
  assert own == str(work / "spm.model")
  assert (work / "spm.model").read_bytes() == (first / "spm" / "v.model").read_bytes()
  config, _ = _begin(None, str(work), "translate")
  assert Workdir(str(work)).vocabulary(config) == own
  # The same file by its absolute path: allowed. Another vocabulary: one line.
  same = _files_config(dir=str(first / "data"), vocab_path=str(first / "spm" / "v.model"))
  _begin(same, str(work), "translate")
  with pytest.raises(errors.ConfigError, match=r"vocab_path=.*other/spm/v.model is not the voc"):
    _begin(_files_config(dir=str(first / "data"), vocab_path="spm/v.model"), str(work), "translate")


def test_a_run_saved_with_relative_paths_is_read_from_the_current_folder(
  monkeypatch, tmp_path, caplog
):
  """A run from before (docs/runs.md): its relative paths mean what they meant, with one
  warning; a resume records its data from then on."""
  _corpus(tmp_path / "data", _DE)
  monkeypatch.chdir(tmp_path)
  work = tmp_path / "old"
  Workdir(str(work)).create()
  Workdir(str(work)).write_config(_files_config(dir="data"))
  monkeypatch.setattr(Workdir, "training_steps", lambda self: [300])
  config, _ = _begin(None, str(work), "train")
  assert config.data.dir == str(tmp_path / "data")
  said = " ".join(r.getMessage() for r in caplog.records if r.levelname == "WARNING")
  assert "saved with relative paths" in said and "no record of its training data" in said


def test_a_result_ends_in_its_json_line_then_a_summary_for_a_person(capsys):
  """Issue 52: after the final JSON (stdout's last line), a table of the figures on stderr; one
  row per direction (and their mean) for a multilingual run."""
  from flaxformer_nmt.runtime import files  # pylint: disable=g-import-not-at-top

  one = {"mode": "eval", "test_set": "newstest2014", "test_sentences": 3003}
  one |= {"test_sacrebleu_greedy": 26.1, "test_sacrebleu_beam4": 27.3, "test_chrf_beam4": 56.0}
  files.print_result(one)
  out, err = capsys.readouterr()
  assert out.splitlines()[-1].startswith("{") and '"test_sacrebleu_beam4": 27.3' in out
  assert err.splitlines()[0] == "Summary (eval, 3003 sentences):"
  assert [line.split() for line in err.splitlines()[2:]] == [
    ["newstest2014", "greedy", "26.10", "-", "-"],
    ["newstest2014", "beam4", "27.30", "-", "56.00"],
  ]
  many = {"mode": "train", "step": 9, "mean": {"test_sacrebleu_greedy": 2.0}}
  many["directions"] = {
    "en-de": {"test_sacrebleu_greedy": 1.0},
    "de-en": {"test_sacrebleu_greedy": 3.0},
  }
  files.print_result(many)
  err = capsys.readouterr().err.splitlines()
  assert err[0] == "Summary (train at step 9):" and err[1].split()[0] == "direction"
  assert [line.split()[:3] for line in err[2:]] == [
    ["en-de", "greedy", "1.00"],
    ["de-en", "greedy", "3.00"],
    ["mean", "greedy", "2.00"],
  ]


def test_urls_stay_and_an_old_finished_run_still_counts_as_finished(monkeypatch, tmp_path):
  """A gs:// TFDS folder is no relative path; a finished run saved with a relative data.dir is
  the same config as the command that now reads it absolute (no retraining on rerun)."""
  from flaxformer_nmt.run import command  # pylint: disable=g-import-not-at-top
  from flaxformer_nmt.training import loop  # pylint: disable=g-import-not-at-top

  assert command.absolute_path("data.tfds_data_dir", "gs://bucket/tfds") is None
  assert command.absolute_path("data.dir", "/abs/data") is None
  monkeypatch.chdir(tmp_path)
  assert command.absolute_path("data.dir", "data") == str(tmp_path / "data")
  old = _files_config(dir="data")
  now = old.copy_and_resolve_references()
  command.absolute_paths(now)
  assert now.data.dir == str(tmp_path / "data")
  assert loop._same_config(old.to_json_best_effort(indent=2), now)  # pylint: disable=protected-access
  now.data.dir = str(tmp_path / "elsewhere")
  assert not loop._same_config(old.to_json_best_effort(indent=2), now)  # pylint: disable=protected-access


def test_only_an_empty_new_folder_is_removed(tmp_path):
  held = tmp_path / "held"
  held.mkdir()
  (held / "train.lock").write_text("{}")  # another job's
  Workdir(str(held)).remove_if_empty()
  assert (held / "train.lock").is_file()
  empty = tmp_path / "empty"
  (empty / "data_cache").mkdir(parents=True)
  Workdir(str(empty)).remove_if_empty()
  assert not empty.exists()


@pytest.mark.parametrize("how", ["changed_in_place", "another_path_after_a_kill"])
def test_a_runs_vocabulary_is_fixed_at_its_first_start(monkeypatch, tmp_path, how):
  """Issue 60, defect 1 (a silent wrong result): a resume whose data.vocab_path file had been
  replaced in place copied the new file over the run's spm.model (the parameters trained on the
  old ids), and so did a restart with another vocab_path after a kill before the first
  checkpoint. The run's copy is made once; a differing file is refused by content, in one line,
  and the copy is left as it was."""
  spm = tmp_path / "spm"
  spm.mkdir()
  tokenizer_lib.train_tokenizer(_EN + _DE, str(spm / "vx"), 40)
  tokenizer_lib.train_tokenizer(_DE, str(spm / "vy"), 40)
  _corpus(tmp_path / "data", _DE)
  work = tmp_path / "run"
  config = _files_config(dir=str(tmp_path / "data"), vocab_path=str(spm / "vx.model"))
  run = _trained(monkeypatch, work, config)
  first = (work / "spm.model").read_bytes()
  if how == "changed_in_place":
    (spm / "vx.model").write_bytes((spm / "vy.model").read_bytes())
    again = config
  else:
    monkeypatch.setattr(Workdir, "training_steps", lambda self: [])  # no checkpoint yet
    again = _files_config(dir=str(tmp_path / "data"), vocab_path=str(spm / "vy.model"))
  with pytest.raises(errors.ConfigError, match=r"its content differs from .*spm\.model, the voc"):
    _begin(again, str(work), "train")
  with pytest.raises(errors.ConfigError, match="has held since its first start"):
    run.keep_vocabulary(again)  # the loop's own guard, had the check been passed
  assert (work / "spm.model").read_bytes() == first
  # Naming the run's own copy is fine; so is the unchanged file in a fresh run.
  own = _files_config(dir=str(tmp_path / "data"), vocab_path=str(work / "spm.model"))
  if how == "another_path_after_a_kill":
    _begin(own, str(work), "train")


def test_import_never_writes_into_a_folder_that_holds_a_users_files(tmp_path):
  """Issue 60, defect 2 (data loss): --mode=import into an existing folder without config.json
  replaced its vocabulary/ (a user's glossary.txt there was deleted) and its run.json, and took
  over a run folder whose config.json was lost. Refused in one line before the input is read;
  nothing in the folder changes."""
  from flaxformer_nmt.importing import imported_run  # pylint: disable=g-import-not-at-top

  user = tmp_path / "userdir"
  (user / "vocabulary").mkdir(parents=True)
  (user / "vocabulary" / "glossary.txt").write_text("g\n")
  with pytest.raises(errors.ConfigError) as info:
    imported_run.import_run(str(tmp_path / "no_such_model"), str(user))
  assert str(info.value) == (
    f"--workdir={user} is not empty and holds no run (vocabulary/glossary.txt); --mode=import "
    "makes a run only in a new or empty folder: choose another --workdir."
  )
  assert (user / "vocabulary" / "glossary.txt").read_text() == "g\n"
  # A trained run's folder whose config.json was lost: still a run, still refused.
  lost = tmp_path / "lost"
  (lost / "checkpoints" / "300").mkdir(parents=True)
  with pytest.raises(errors.ConfigError, match="already holds a run"):
    imported_run.import_run(str(tmp_path / "no_such_model"), str(lost))
  # A run.json of a training run (no config.json): not an import's leftover.
  other = tmp_path / "other"
  other.mkdir()
  (other / "run.json").write_text('{"config": "demo", "training_data": {"kind": "files"}}')
  with pytest.raises(errors.ConfigError, match=r"holds no run \(run\.json\)"):
    imported_run.import_run(str(tmp_path / "no_such_model"), str(other))
  # What a killed import leaves is taken up again (the input is then looked for).
  killed = tmp_path / "killed"
  (killed / "vocabulary").mkdir(parents=True)
  for name in ("source.spm", "target.spm", "vocab.json"):
    (killed / "vocabulary" / name).write_text("x")
  (killed / "import.json").write_text("{}")
  (killed / "run.json").write_text('{"training_data": {"kind": "imported"}}')
  with pytest.raises(errors.ConfigError, match="no such folder, nor a Hub id"):
    imported_run.import_run(str(tmp_path / "no_such_model"), str(killed))


def test_training_never_starts_in_a_folder_that_holds_a_users_files(tmp_path):
  """The same rule for train: a new run starts in a missing or empty folder, or one holding only
  what a start killed before config.json left (its lock, vocabulary, tokenized data, events)."""
  _corpus(tmp_path / "data", _DE)
  config = _files_config(dir=str(tmp_path / "data"))
  notes = tmp_path / "notes"
  notes.mkdir()
  (notes / "todo.txt").write_text("x")
  with pytest.raises(errors.ConfigError) as info:
    _begin(config, str(notes), "train")
  assert str(info.value).startswith(f"--workdir={notes} is not empty and holds no run (todo.txt)")
  killed = tmp_path / "killed"
  (killed / "data_cache").mkdir(parents=True)
  for name in ("train.lock", "spm.model", "events.out.tfevents.1.host"):
    (killed / name).write_text("")
  _begin(config, str(killed), "train")
  # What --mode=prepare leaves for training (docs/wmt14.md: prepare, then train there).
  prepared = tmp_path / "prepared"
  (prepared / "data_cache").mkdir(parents=True)
  for name in ("prepare_result.json", "results.jsonl", "spm.model"):
    (prepared / name).write_text("")
  _begin(config, str(prepared), "train")


def test_a_refused_new_workdir_leaves_no_parent_it_made(tmp_path):
  """Issue 60, defect 6: a refused fresh --workdir=newA/newB removed newB but left newA."""
  run = Workdir(str(tmp_path / "newA" / "newB"))
  run.create()
  run.remove_if_empty()
  assert not (tmp_path / "newA").exists() and tmp_path.exists()
  kept = tmp_path / "kept"
  (kept / "mine").mkdir(parents=True)
  inner = Workdir(str(kept / "mine" / "x" / "y"))
  inner.create()
  inner.remove_if_empty()
  assert (kept / "mine").is_dir() and not (kept / "mine" / "x").exists()
  # Through the command: a start refused after its folder was made (no corpus there).
  missing = _files_config(dir=str(tmp_path / "no_corpus"))
  with pytest.raises(errors.DataError):
    modes.train(missing, str(tmp_path / "newC" / "newD"))
  assert not (tmp_path / "newC").exists()


def test_a_resume_after_the_vocabulary_file_moved_reads_the_runs_copy(monkeypatch, tmp_path):
  """The run keeps its copy so that data.vocab_path may move or vanish: a resume whose saved
  vocab_path no longer exists goes on with the copy (only a differing file is refused)."""
  spm = tmp_path / "spm"
  spm.mkdir()
  tokenizer_lib.train_tokenizer(_EN + _DE, str(spm / "vx"), 40)
  _corpus(tmp_path / "data", _DE)
  work = tmp_path / "run"
  config = _files_config(dir=str(tmp_path / "data"), vocab_path=str(spm / "vx.model"))
  run = _trained(monkeypatch, work, config)
  (spm / "vx.model").unlink()
  resumed, _ = _begin(None, str(work), "train")
  run.keep_vocabulary(resumed)  # nothing to copy, nothing refused
  assert Workdir(str(work)).vocabulary(resumed) == str(work / "spm.model")
