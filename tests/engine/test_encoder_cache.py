"""The encoder cache's keys and budget (engine/encoder_cache.py); its use by every vision family, tokens equal to
the uncached ones, is in tests/engine/test_families.py."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from engine.encoder_cache import EncoderCache, content_key


def _picture(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"pixel_values": torch.rand(16, 12, generator=g), "image_grid_thw": torch.tensor([[1, 4, 4]])}


def test_keys_are_made_of_content_and_geometry():
    a = _picture(0)
    assert content_key(a) == content_key({k: v.clone() for k, v in a.items()})
    one_value = a["pixel_values"].clone()
    one_value[7, 3] += 1e-6
    variants = [
        {**a, "pixel_values": one_value},  # one pixel value apart
        {**a, "image_grid_thw": torch.tensor([[1, 2, 8]])},  # the same pixels on another grid
        {**a, "pixel_values": a["pixel_values"].reshape(12, 16)},  # the same bytes, another shape
        {**a, "pixel_values": a["pixel_values"].double()},  # the same values, another dtype
        {"pixel_values": a["pixel_values"], "image_grid_hw": a["image_grid_thw"]},  # another tensor name
    ]
    keys = {content_key(v) for v in variants}
    assert len(keys) == len(variants) and content_key(a) not in keys
    # a slice is keyed by its own values (a piece of a request's pixel_values is a view into it)
    both = torch.cat([a["pixel_values"], _picture(1)["pixel_values"]])
    assert content_key({**a, "pixel_values": both[:16]}) == content_key(a)


def _rows(n: int, fill: float = 0.0) -> torch.Tensor:
    return torch.full((n, 4), fill)  # n * 16 bytes


def test_least_recently_used_entries_leave_first_within_the_budget():
    cache = EncoderCache(3 * 16 * 10)  # three entries of 10 rows
    for k in "abc":
        cache.put(k, _rows(10))
    assert cache.bytes == 480 and len(cache) == 3
    assert cache.get("a") is not None  # a is now the most recent: b leaves first
    cache.put("d", _rows(10))
    assert cache.get("b") is None and len(cache) == 3 and cache.bytes == 480
    cache.put("e", _rows(20))  # needs two entries' room: c and a leave, d stays
    assert [k for k in "acde" if cache.get(k) is not None] == ["d", "e"] and cache.bytes == 480


def test_an_entry_over_the_whole_budget_is_not_kept():
    cache = EncoderCache(100)
    cache.put("small", _rows(2))
    cache.put("big", _rows(10))
    assert cache.get("big") is None and cache.get("small") is not None and cache.bytes == 32


def test_counts_are_taken_once():
    cache = EncoderCache(100)
    cache.count(3, 2)
    cache.count(1, 0)
    assert cache.take_counts() == (4, 2) and cache.take_counts() == (0, 0)


def test_a_budget_below_one_byte_is_refused():
    with pytest.raises(ValueError, match="budget"):
        EncoderCache(0)


def test_the_flag_is_stated_in_help():
    done = subprocess.run([sys.executable, "-m", "app.cli", "engine", "--help"], capture_output=True, text=True,
                          timeout=60)
    flat = " ".join(done.stdout.split())
    assert "--encoder-cache-mb" in flat and "0: off (default: 512)" in flat


def test_the_flag_reaches_the_config_and_zero_turns_it_off(tiny_dirs):
    import argparse

    from engine.cli import add_arguments, config_from_args
    from engine.loader import load

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert config_from_args(parser.parse_args([]), "m").encoder_cache_mb == 512
    off = config_from_args(parser.parse_args(["--encoder-cache-mb", "0"]), str(tiny_dirs["tiny-llava"]))
    assert load(off).family.encoder_cache is None
    on = config_from_args(parser.parse_args(["--encoder-cache-mb", "3"]), str(tiny_dirs["tiny-llava"]))
    assert load(on).family.encoder_cache.budget == 3 << 20
