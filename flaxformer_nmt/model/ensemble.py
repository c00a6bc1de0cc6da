"""The parameters of several models decoded as one: a type of the model's, so that loading
(run/) can build one without importing the searches (decoding/model_step.py decodes it)."""

from __future__ import annotations

from typing import Any, NamedTuple


class Ensemble(NamedTuple):
  """The parameters of several models of one configuration, decoded as one
  (decoding/model_step.ensemble_step_fn: their probabilities averaged at every step).

  Wherever a decode function takes `params`, an Ensemble may stand instead.
  """

  members: tuple[Any, ...]
