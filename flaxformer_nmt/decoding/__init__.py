"""Decoding: the searches (greedy and sampling apart from beam search, all model-agnostic), the
Transformer as a step function, translating lines, word alignments, BLEU and chrF, and the
attention pictures. Imports nothing of training/."""
