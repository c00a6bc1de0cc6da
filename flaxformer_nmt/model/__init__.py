"""The Transformer itself, pure Flax linen: token ids, layers, multi-head attention with its decode
caches, the encoder-decoder stack (`Transformer.encode` / `decode`) and the label-smoothed loss.

Imports nothing else of the package but the config choices, so it reads on its own."""
