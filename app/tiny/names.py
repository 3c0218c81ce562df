"""The built-in tiny models' names, without the builder: `splice --help` lists them without importing torch."""

DEFAULT_MODEL = "tiny-idefics3-colors"
TINY_NAMES = ("tiny-text", "tiny-text-bos", "tiny-llava", "tiny-idefics3", "tiny-idefics3-colors", "tiny-gemma3",
              "tiny-gemma4", "tiny-qwen2-vl", "tiny-qwen2.5-vl", "tiny-qwen3.5", "tiny-lfm2-vl", "tiny-llava-onevision",
              "tiny-smolvlm", "tiny-nemotron-omni")
