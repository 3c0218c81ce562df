"""Fixed text the tiny tokenizers are trained on; changing it changes every tiny model (bump
BUILDER_VERSION)."""

CORPUS = """\
The quick brown fox jumps over the lazy dog. A picture is worth a thousand words.
Describe the image in one sentence. What is shown in this picture? The cat sat on the mat.
You are a helpful assistant. Answer the question briefly and precisely.
Hello! How can I help you today? Please summarize the following text.
Splice serves chat models that accept text, images and prompt embeddings in one conversation.
The engine looks up embeddings, merges supplied rows and image features, and decodes in batches.
Numbers: 0 1 2 3 4 5 6 7 8 9 10 11 12 100 1000 2024 3.14159.
Punctuation, quotes "like this", 'and this', (parentheses), [brackets], {braces}; colons: dashes - and slashes /.
Red green blue yellow black white orange purple. Left right top bottom centre corner edge.
def main(): return 0  # code also appears in conversations
Unicode: café naïve résumé über straße 東京 こんにちは 你好 🙂 ✓ → ∑ π.
"""
