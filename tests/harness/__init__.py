"""Harnesses shared by the tests and bench/'s long runs: `splice up` as a child process (up.py), the mixed soak
workload (soak.py), the gRPC, HTTP and decoder fuzzers (fuzz_grpc.py, fuzz_http.py, fuzz_decoders.py), crafted
hostile files (hostile_files.py) and the fault scenarios under `splice up` (faults.py). The tests run short
versions and assert the outcomes; bench/soak.py, bench/fuzz.py, bench/fuzz_decoders.py and bench/faults.py run
long ones and print the figures."""
