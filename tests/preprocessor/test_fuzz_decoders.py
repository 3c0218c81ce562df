"""The short CI version of bench/fuzz_decoders.py: hypothesis inputs for the torch.save, safetensors, raw tensor and
image decoders, seeded with crafted hostile files; each must decode or be refused cleanly (a client status)."""

from __future__ import annotations

from tests.harness.fuzz_decoders import DecoderFuzzer


def test_every_decoder_answers_success_or_a_clean_refusal():
    fuzzer = DecoderFuzzer()
    fuzzer.run(examples=800, seed=1)  # raises the (shrunk) input's exception on a finding
    decoders = {decoder for decoder, _ in fuzzer.counts}
    assert decoders == set(fuzzer.decoders)
    # Both outcomes were reached for every decoder: the mutations reach past the first check.
    for decoder in ("torch_base64", "safetensors", "image", "tensor"):
        assert fuzzer.counts[(decoder, "OK")] > 0 and fuzzer.counts[(decoder, "INVALID_ARGUMENT")] > 0, fuzzer.counts
