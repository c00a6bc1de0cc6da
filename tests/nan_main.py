"""`main.py` whose training loss is NaN: the non-finite guard, tested end to end.

Fault injection lives here, in the tests, not in the library: the loss function is replaced
before main.py runs (steps.train_step calls it through the `losses` module).
"""

import os
import runpy
import sys

import jax.numpy as jnp

from flaxformer_nmt.model import losses

_real = losses.label_smoothed_cross_entropy


def _nan_loss(*args, **kwargs):
  loss_sum, nll_sum, count = _real(*args, **kwargs)
  return loss_sum * jnp.nan, nll_sum, count


losses.label_smoothed_cross_entropy = _nan_loss
main = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "main.py")
sys.argv[0] = main
runpy.run_path(main, run_name="__main__")
