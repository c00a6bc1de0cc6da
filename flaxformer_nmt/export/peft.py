"""`--mode=export --format=peft`: a LoRA run's adapters as a PEFT adapter folder.

`peft.PeftModel.from_pretrained(base, DIR)` loads it onto `base`, the transformers export of the
run's frozen weights W0: its `config.init_from` source exported with `--format=huggingface` (the
source's parameters are W0 bit for bit, training/lora.py). The folder holds:

- adapter_config.json: LoRA's rank, alpha and targets under transformers' module names (q_proj,
  k_proj, v_proj, out_proj, fc1, fc2: PEFT has no default target list for Marian or M2M100), the
  run's `lora_dropout` (which PEFT, like us, applies in training only),
  `base_model_name_or_path` the source as the run recorded it;
- adapter_model.safetensors: lora_A.weight [r, in] and lora_B.weight [out, r] per adapted module,
  under PEFT's saved names (`base_model.model.` + the module's name in the model's state dict).
  Our A [in, r] and B [r, out] are transposed, and their residual-stream side reordered exactly as
  export/marian.py reorders the kernels they adapt, so PEFT's scaling * B @ A is the transposed
  s * A @ B of our merged kernel;
- README.md: how to load it.

Only a training checkpoint holds adapters: an average or best/ holds merged parameters (a mean of
products B.A has no rank-r factors), so --checkpoint must resolve to `latest`. Exporting the
merged model for transformers or CTranslate2 is --format=huggingface or ctranslate2, as for any run.
"""

from __future__ import annotations

import json
import os
from typing import Any

import jax
import ml_collections
import numpy as np
from flax import traverse_util

from flaxformer_nmt import errors
from flaxformer_nmt.checkpoints import reader
from flaxformer_nmt.config import run_config
from flaxformer_nmt.export import huggingface, marian
from flaxformer_nmt.run import selection
from flaxformer_nmt.runtime import files
from flaxformer_nmt.training import lora

# Ours -> transformers' module of the same matrix, per layer (export/marian.py's names).
_ENCODER_MODULES = {"self_attention": "self_attn"}
_DECODER_MODULES = {"self_attention": "self_attn", "cross_attention": "encoder_attn"}
_PROJECTION_MODULES = {"query": "q_proj", "key": "k_proj", "value": "v_proj", "out": "out_proj"}
_FFN_MODULES = {"wi": "fc1", "wo": "fc2"}
# Which of a kernel's sides is the residual stream (reordered for Marian): its input side for
# q, k, v and fc1, its output side for out_proj and fc2.
_OUTPUT_IS_RESIDUAL = {"out_proj", "fc2"}


def check_output(output: str, quantization: str, model: ml_collections.ConfigDict) -> None:
  """As --format=huggingface's: the adapters fit only that export of the base (M2M100's for a
  model of M2M100's layout, export/m2m100_folder.py; else Marian's)."""
  from flaxformer_nmt.export import m2m100_folder  # pylint: disable=g-import-not-at-top

  if _m2m100_layout(model):
    m2m100_folder.check_output(output, quantization, model)
  else:
    huggingface.check_output(output, quantization, model)


def _m2m100_layout(model: ml_collections.ConfigDict) -> bool:
  """Whether the base exports as M2M100 (its features in our order), not as Marian (permuted)."""
  return str(model.get("positional", "")) == "m2m100"


def lora_fields(folder: Any) -> ml_collections.ConfigDict:
  """The run's own config.optim as it trained (its config.json; the defaults' if it saved none):
  a --config given to the export command describes decoding, not what the checkpoints hold."""
  text = folder.saved_config_text()
  saved = run_config.from_json(text, folder.config_path) if text else None
  return saved.optim if saved is not None else ml_collections.ConfigDict({"lora_rank": 0})


def check_run(folder: Any, which: str) -> None:
  """ConfigError, before anything loads, for a run without adapters or parameters that are not a
  training checkpoint's."""
  if not int(lora_fields(folder).get("lora_rank", 0)):
    raise errors.ConfigError(
      f"--format=peft: {folder.path} was not trained with config.optim.lora_rank > 0, so it has "
      "no adapters; export the model itself with --format=huggingface."
    )
  location = selection.resolve(folder, which)
  if location.kind != "latest":
    raise errors.ConfigError(
      f"--format=peft --checkpoint={which}: that is the run's {location.kind} parameters, "
      "merged (an average or best/ keeps no rank-r adapters); use --checkpoint=latest."
    )


def _module(path: tuple[str, ...]) -> str:
  """Our kernel's path -> transformers' module name (model.encoder.layers.0.self_attn.q_proj)."""
  stack, index = path[0].split("_")
  names = _ENCODER_MODULES if stack == "encoder" else _DECODER_MODULES
  if path[1] == "ffn":
    return f"model.{stack}.layers.{index}.{_FFN_MODULES[path[2]]}"
  return f"model.{stack}.layers.{index}.{names[path[1]]}.{_PROJECTION_MODULES[path[2]]}"


def adapter_state_dict(adapters: Any, d_model: int, permuted: bool = True) -> dict[str, np.ndarray]:
  """PEFT's saved tensors for our adapters ({path: {"a", "b"}}, numpy): lora_A.weight = A^T and
  lora_B.weight = B^T, the residual side in Marian's feature order (`permuted`; an M2M100 model's
  features are in ours: export/m2m100.py)."""
  inv = np.argsort(marian.feature_order(d_model)) if permuted else np.arange(d_model)
  flat = {k: np.asarray(v) for k, v in traverse_util.flatten_dict(adapters).items()}
  out = {}
  for path in sorted({k[:-1] for k in flat}):
    a, b = flat[path + ("a",)], flat[path + ("b",)]  # [in, r], [r, out]
    module = _module(path if path[-1] != "kernel" else path[:-1])
    if module.rsplit(".", 1)[1] in _OUTPUT_IS_RESIDUAL:
      b = b[:, inv]
    else:
      a = a[inv, :]
    out[f"base_model.model.{module}.lora_A.weight"] = a.T
    out[f"base_model.model.{module}.lora_B.weight"] = b.T
  return {k: np.ascontiguousarray(v, np.float32) for k, v in out.items()}


def adapter_config(o: ml_collections.ConfigDict, base: str) -> dict[str, Any]:
  """PEFT's LoraConfig as adapter_config.json (the fields its from_pretrained reads), from the
  run's config.optim."""
  targets = lora.parse_targets(o.lora_targets)
  return {
    "peft_type": "LORA",
    "task_type": "SEQ_2_SEQ_LM",
    "base_model_name_or_path": base,
    "r": int(o.lora_rank),
    "lora_alpha": float(o.lora_alpha),
    "lora_dropout": float(o.get("lora_dropout", 0.0)),  # PEFT's, as ours: training only
    "target_modules": sorted(lora.HF_MODULES[t] for t in targets),
    "bias": "none",
    "fan_in_fan_out": False,
    "use_rslora": False,
    "inference_mode": True,
    "init_lora_weights": True,
    "modules_to_save": None,
  }


def write(session: Any, folder: Any, output: str, quantization: str) -> dict[str, Any]:
  """--mode=export's call (modes.export): the adapters of the checkpoint `session` loaded."""
  del quantization  # float32: check_output
  from safetensors.numpy import save_file  # pylint: disable=g-import-not-at-top

  c = session.components
  o = lora_fields(folder)
  targets = lora.parse_targets(o.lora_targets)
  template = jax.eval_shape(
    lambda p: lora.init(p, int(o.lora_rank), targets, jax.random.PRNGKey(0)), c.abstract_params
  )
  state, _ = reader.CheckpointDir(folder.checkpoints).read(
    session.step, {"lora": {"adapters": reader.state_dict(template.adapters)}}
  )
  permuted = not _m2m100_layout(c.config.model)  # M2M100's export keeps our feature order
  tensors = adapter_state_dict(state["lora"]["adapters"], c.model_cfg.d_model, permuted)
  base = folder.saved_config().get("init_from", "")
  with files.staged_folder(output) as staging:
    save_file(tensors, os.path.join(staging, "adapter_model.safetensors"), {"format": "pt"})
    with open(os.path.join(staging, "adapter_config.json"), "w", encoding="utf-8") as f:
      json.dump(adapter_config(o, base), f, indent=2)
      f.write("\n")
    with open(os.path.join(staging, "README.md"), "w", encoding="utf-8") as f:
      f.write(_card(o, base, session.step))
  return {
    "format": "peft",
    "output": os.path.abspath(output),
    "adapter_parameters": int(sum(v.size for v in tensors.values())),
    "step": session.step,
  }


def _card(o: ml_collections.ConfigDict, base: str, step: int) -> str:
  name = os.path.basename(os.path.normpath(base)) or base
  return (
    f"# LoRA adapters (rank {o.lora_rank}, alpha {o.lora_alpha:g}, on {o.lora_targets})\n\n"
    f"Step {step} of a flaxformer_nmt LoRA run fine-tuned from `{name}`. They load onto that "
    "run's transformers export:\n\n"
    "```python\n"
    "from peft import PeftModel\n"
    "from transformers import AutoModelForSeq2SeqLM\n\n"
    f'base = AutoModelForSeq2SeqLM.from_pretrained("{name}-hf")  # flaxformer-nmt --mode=export '
    f"--format=huggingface --workdir={name} --output={name}-hf\n"
    'model = PeftModel.from_pretrained(base, "THIS_FOLDER")\n'
    "```\n"
  )
