"""Exporting a trained model for other inference engines: CTranslate2 (ctranslate2.py) and
transformers' Marian format (huggingface.py), and the Marian weight map both ways (marian.py:
importing/ reads models with it). Each exporter has `check_output(output, quantization, model)`
(before any work) and `write(session, folder, output, quantization)`."""
