"""One tiny builder per model family, named as engine/models/ names them: each writes a real HF architecture with
random weights and the tokenizer and processor its family serves; app/tiny/builder.py lists them (TINY_MODELS)."""
