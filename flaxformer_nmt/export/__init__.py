"""Exporting a trained model for other inference engines (CTranslate2)."""
