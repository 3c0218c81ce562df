"""Issue 40 row 11: `cache_salt` keys the encoder cache as it keys the prefix cache, so tenants never share an entry.
The same picture under three salts (tiny-qwen2-vl, through the real services): no salt finds another's entry (the
engine's hit counter does not move; before, B and C hit A's), and the same salt again finds its own."""

from __future__ import annotations

import pytest

from app.demo import sample_picture
from app.launch import start_stack
from app.scrape import metrics_address
from clients import SpliceClient
from tests.integration.test_encoder_cache import encoder_cache_counts

MODEL = "tiny-qwen2-vl"


@pytest.fixture(scope="module")
def salted_stack(tiny_dirs):
    # no prefix cache: a prompt served from cached blocks would not ask the encoder cache at all
    engine, pre = start_stack(MODEL, engine_args=["--metrics-port", "0", "--encoder-cache-mb", "64",
                                                  "--no-enable-prefix-caching"])
    yield engine, pre
    pre.stop()
    engine.stop()


def _ask(client: SpliceClient, salt: str) -> None:
    messages = [{"role": "user", "content": ["What is this?", sample_picture(56, 56)]}]
    chunks = list(client.chat(messages, temperature=0.0, max_tokens=2, cache_salt=salt))
    assert chunks[-1].finish_reason is not None


def test_tenants_never_share_an_encoder_cache_entry(salted_stack):
    engine, pre = salted_stack
    address = metrics_address(engine)
    with SpliceClient(pre.address, timeout=120) as client:
        before = encoder_cache_counts(address)
        for salt in ("tenant-a", "tenant-b", "tenant-c"):
            _ask(client, salt)
        after = encoder_cache_counts(address)
        assert after[0] - before[0] >= 3  # each picture asked the cache
        assert after[1] == before[1], "a tenant hit another tenant's encoder-cache entry"
        _ask(client, "tenant-b")
        again = encoder_cache_counts(address)
    assert again[0] > after[0] and again[1] - after[1] == again[0] - after[0]  # its own entry, every piece
