"""Property-based fuzzing (hypothesis) of the preprocessor's decoders of caller bytes (tests/harness/fuzz_decoders.py):
vLLM's torch.save prompt_embeds, safetensors prompt_embeds, the gRPC-native raw tensor, and images, seeded with valid
and crafted hostile files and mutated at the byte, zip-record, pickle and header level. Passes when every input
decodes or is refused with a client status (a finding is anything else); runs batches until --seconds have passed.

    python -m bench.fuzz_decoders [--seconds 600] [--examples 500] [--seed 0] [--quick]

Runs in this process, no services. Prints counts per decoder and outcome, and the findings.
"""

from __future__ import annotations

import sys
import time
import warnings

from bench.common import bench_parser
from tests.harness.fuzz_decoders import DecoderFuzzer


def main() -> int:
    parser = bench_parser(__doc__, quick={"seconds": 1, "examples": 20}, model=None, repeats=None)
    parser.add_argument("--seconds", type=float, default=600.0, help="run batches until this much time has passed")
    parser.add_argument("--examples", type=int, default=500, help="hypothesis examples per decoder and batch")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    warnings.simplefilter("ignore")  # torch's and Pillow's remarks on odd inputs: the counts are the report
    fuzzer = DecoderFuzzer()
    began, batch = time.monotonic(), 0
    while time.monotonic() - began < args.seconds:
        fuzzer.run(args.examples, args.seed + batch, raise_findings=False)
        batch += 1
    for (decoder, outcome), n in sorted(fuzzer.counts.items()):
        print(f"{decoder:13s} {outcome:20s} {n}")
    print(f"{sum(fuzzer.counts.values())} inputs in {batch} batches, {time.monotonic() - began:.0f} s; findings: "
          f"{len(fuzzer.findings)}")
    for line in fuzzer.findings[:20]:
        print("  " + line)
    return 1 if fuzzer.findings else 0


if __name__ == "__main__":
    sys.exit(main())
