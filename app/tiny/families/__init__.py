"""One tiny builder per model family, in the file named as splice/families.py names the family: each writes a real HF
architecture with random weights and the tokenizer and processor its family serves; app/tiny/builder.py lists them
(TINY_MODELS)."""
