"""CPU kernels the engine compiles on its host (C, gcc -march=native) where torch's own ops leave most of the
machine's speed unused: each is optional, the engine runs torch's ops where one cannot be built or does not serve
the tensors at hand."""
