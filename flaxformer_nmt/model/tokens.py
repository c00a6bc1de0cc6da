"""The token ids every stage relies on, fixed by the vocabulary's training (data/tokenizer.py).

Here, apart from SentencePiece, so that the model, the searches and the batcher use them without
importing a tokenizer: PAD_ID = 0 (padding, and the decoder's start symbol, as in the flax wmt
example: there is no BOS), EOS_ID = 1 (ends every sequence), UNK_ID = 2.
"""

PAD_ID: int = 0
EOS_ID: int = 1
UNK_ID: int = 2
