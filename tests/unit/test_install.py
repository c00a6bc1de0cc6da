"""A plain (not editable) install: the console script, the installed configs, from any folder."""

from __future__ import annotations

import pytest

from flaxformer_nmt import cli, errors
from flaxformer_nmt.config import loading as config_files
from flaxformer_nmt.runtime import console


def test_config_names_resolve_to_the_installed_files(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)  # no configs/ here
  demo = str(config_files.CONFIGS_DIR / "demo.py")
  assert config_files.resolve("demo") == demo
  assert config_files.resolve("configs/demo.py") == demo  # the clone's spelling, outside it
  assert config_files.resolve("wmt14_ende_base:files").endswith("wmt14_ende_base.py:files")
  (tmp_path / "mine.py").write_text("def get_config():\n  return None\n")
  assert config_files.resolve("mine.py") == str(tmp_path / "mine.py")  # a real path wins
  with pytest.raises(errors.ConfigError, match="--config=nothere: no such file.*installed: demo"):
    config_files.resolve("nothere")
  argv = cli._with_config_path(["prog", "--config", "multi30k", "--workdir=w"])
  assert argv == ["prog", "--config", str(config_files.CONFIGS_DIR / "multi30k.py"), "--workdir=w"]
  assert "demo" in config_files.names() and "__init__" not in config_files.names()


def test_an_unused_gpu_or_tpu_is_one_warning_line(tmp_path):
  assert console.unused_accelerator("cpu", str(tmp_path)) is None
  (tmp_path / "dev").mkdir()
  (tmp_path / "dev" / "nvidia0").touch()
  message = console.unused_accelerator("cpu", str(tmp_path))
  assert "NVIDIA GPU is visible" in message and 'pip install -U "jax[cuda12]"' in message
  assert "\n" not in message
  assert console.unused_accelerator("gpu", str(tmp_path)) is None  # JAX uses it
  (tmp_path / "dev" / "nvidia0").unlink()
  (tmp_path / "dev" / "accel0").touch()
  assert '"jax[tpu]"' in console.unused_accelerator("cpu", str(tmp_path))
  (tmp_path / "dev" / "accel0").unlink()
  (tmp_path / "dev" / "vfio").mkdir()
  (tmp_path / "dev" / "vfio" / "vfio").touch()  # the VFIO control node alone: no TPU
  assert console.unused_accelerator("cpu", str(tmp_path)) is None
  (tmp_path / "dev" / "vfio" / "0").touch()  # a passed-through device, but no TPU beside it
  assert console.unused_accelerator("cpu", str(tmp_path)) is None
  pci = tmp_path / "sys" / "bus" / "pci" / "devices"
  for slot, device in (("0000:00:04.0", "0x0042"), ("0000:00:05.0", "0x0062")):
    (pci / slot).mkdir(parents=True)
    (pci / slot / "vendor").write_text("0x1ae0\n")
    (pci / slot / "device").write_text(f"{device}\n")
  assert "a TPU is visible" in console.unused_accelerator("cpu", str(tmp_path))
  (pci / "0000:00:05.0" / "device").write_text("0x0042\n")  # Google's virtual NIC only
  assert console.unused_accelerator("cpu", str(tmp_path)) is None
