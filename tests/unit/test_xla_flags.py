"""The GPU defaults runtime/xla_flags.py adds to XLA_FLAGS, and a user's own settings winning."""

from __future__ import annotations

import os

from flaxformer_nmt.runtime import xla_flags


def test_defaults_are_added_after_the_users_flags():
  flags = xla_flags.with_defaults("--xla_force_host_platform_device_count=8")
  assert flags == (
    "--xla_force_host_platform_device_count=8 --xla_gpu_enable_triton_gemm=false "
    "--xla_gpu_enable_command_buffer="
  )
  assert xla_flags.with_defaults("") == (
    "--xla_gpu_enable_triton_gemm=false --xla_gpu_enable_command_buffer="
  )


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


def test_importing_the_device_code_applies_them_where_cuda_is_installed():
  from flaxformer_nmt.runtime import parallel  # noqa: F401  (the import applies them)

  added = [f"--{name}=" in os.environ.get("XLA_FLAGS", "") for name in xla_flags.GPU_DEFAULTS]
  wanted = xla_flags.cuda_plugin_installed() and os.environ.get(xla_flags.OPT_OUT) != "0"
  assert added == [wanted] * len(added)
