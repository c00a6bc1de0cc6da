"""`main.py` in an interpreter where TensorFlow cannot be imported, whether or not it is installed:
what a user without the `[prepare]` extra has (an import raises ModuleNotFoundError, as when the
package is absent)."""

import os
import runpy
import sys


class _NoTensorFlow:
  def find_spec(self, name, path=None, target=None):
    del path, target
    if name == "tensorflow" or name.startswith("tensorflow."):
      raise ModuleNotFoundError(f"No module named {name!r}", name=name)
    return None


sys.meta_path.insert(0, _NoTensorFlow())
for name in [n for n in sys.modules if n == "tensorflow" or n.startswith("tensorflow.")]:
  del sys.modules[name]
main = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "main.py")
sys.argv[0] = main
runpy.run_path(main, run_name="__main__")
