"""Exporting a trained model for other inference engines: CTranslate2 (ctranslate2.py) and
transformers' Marian format (huggingface.py); importing a Marian model as a run (importing.py).
Each exporter has `check_output(output, quantization, model)` (before any work) and
`write(loaded, run, output, quantization)`."""
