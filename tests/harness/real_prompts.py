"""The real model's test prompts (smollm2-135m-instruct): the integration tests hold Splice's greedy tokens to HF's
on them (tests/integration/test_real_model.py), and bench/experiments/bf16_vs_hf.py compares bfloat16 on the same."""

PROMPTS = [
    "What is the capital of France?",
    "Name three primary colors.",
    "Write a haiku about the sea.",
    "What is 12 plus 30?",
    "Give me one tip for learning Python.",
    "Who wrote Romeo and Juliet?",
]
