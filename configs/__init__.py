"""The experiment configs, installed with the package as `flaxformer_nmt.configs`.

Each file's `get_config()` picks a size and the data (see flaxformer_nmt/config/builders.py). Name
one by its file name: `flaxformer-nmt --config=demo`, `api.load_config("wmt14_ende_base:files")`.
"""
