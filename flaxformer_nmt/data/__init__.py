"""The input side: sources -> tokenized arrays -> packed batches with a restorable position.
Most callers need only `pipeline.make_data`; the training streams and their positions are in
streams.py. Nothing is imported here: a decoding command that needs only the vocabulary
(`data.tokenizer`) does not load the training input pipeline with it.
"""
