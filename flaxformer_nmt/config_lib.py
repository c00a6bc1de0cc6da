"""The config builders under their old name, for experiment files written before the package was
split into stages (`from flaxformer_nmt import config_lib`). New files import
`flaxformer_nmt.config.builders`; both name the same functions."""

from flaxformer_nmt.config.builders import *  # noqa: F403
from flaxformer_nmt.config.builders import __all__  # noqa: F401
