"""The GPU defaults runtime/xla_flags.py adds to XLA_FLAGS, and a user's own settings winning."""

from __future__ import annotations

from flaxformer_nmt.runtime import xla_flags


def test_defaults_are_added_after_the_users_flags():
  flags = xla_flags.with_defaults("--xla_force_host_platform_device_count=8")
  assert flags == "--xla_force_host_platform_device_count=8 --xla_gpu_enable_triton_gemm=false"
  assert xla_flags.with_defaults("") == "--xla_gpu_enable_triton_gemm=false"
  # Command buffers stay XLA's own: turned off, they halved beam search's speed on an H200.
  assert "command_buffer" not in xla_flags.with_defaults("")


def test_a_flag_the_user_sets_is_left_as_set():
  mine = "--xla_gpu_enable_triton_gemm=true --xla_gpu_enable_command_buffer=FUSION"
  assert xla_flags.with_defaults(mine) == mine
  assert xla_flags.with_defaults(xla_flags.with_defaults("")) == xla_flags.with_defaults("")


def test_opting_out_adds_nothing():
  env = {"XLA_FLAGS": "--xla_dump_to=/tmp/x", xla_flags.OPT_OUT: "0"}
  xla_flags.apply_defaults(env, cuda=True)
  assert env["XLA_FLAGS"] == "--xla_dump_to=/tmp/x"
  env = {}
  xla_flags.apply_defaults(env, cuda=True)
  assert env["XLA_FLAGS"] == xla_flags.with_defaults("")


def test_nothing_is_added_without_jax_cuda_plugin():
  env = {"XLA_FLAGS": "--xla_dump_to=/tmp/x"}
  xla_flags.apply_defaults(env, cuda=False)
  assert env == {"XLA_FLAGS": "--xla_dump_to=/tmp/x"}


def test_the_device_code_applies_them_when_imported():
  """runtime/parallel.py calls apply_defaults at module level: when it is imported, before any
  command touches a device (checked in its source, since this process imported it long ago)."""
  import ast  # pylint: disable=g-import-not-at-top
  import inspect  # pylint: disable=g-import-not-at-top

  from flaxformer_nmt.runtime import parallel  # pylint: disable=g-import-not-at-top

  calls = [
    ast.unparse(node.value.func)
    for node in ast.parse(inspect.getsource(parallel)).body
    if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)
  ]
  assert "xla_flags.apply_defaults" in calls


def test_nothing_is_changed_once_jax_has_started(monkeypatch):
  import jax  # pylint: disable=g-import-not-at-top

  jax.devices()  # this process's backend is started
  assert xla_flags.jax_started()
  monkeypatch.setattr(xla_flags, "cuda_plugin_installed", lambda: True)
  env = {"XLA_FLAGS": "--xla_dump_to=/tmp/x"}
  xla_flags.apply_defaults(env)
  assert env == {"XLA_FLAGS": "--xla_dump_to=/tmp/x"}
