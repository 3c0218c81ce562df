# One image for both services; docker-compose.yml picks the command.
FROM python:3.11-slim
WORKDIR /app
ENV PYTHONUNBUFFERED=1 SPLICE_CACHE=/cache
# torch pinned; the default index gives a build that runs on CPU and CUDA alike. Set TORCH_INDEX to
# PyTorch's CPU-only wheel index for a smaller CPU image.
# gcc builds the engine's CPU kernels on the host at first use (engine/kernels/); without it torch's ops run instead
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev && rm -rf /var/lib/apt/lists/*
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX=""
RUN pip install --no-cache-dir "torch==${TORCH_VERSION}" ${TORCH_INDEX:+--index-url "$TORCH_INDEX"}
COPY pyproject.toml README.md ./
COPY splice ./splice
COPY engine ./engine
COPY preprocessor ./preprocessor
COPY clients ./clients
COPY app ./app
RUN pip install --no-cache-dir .
# xgrammar asks for triton; only a CUDA torch uses it (a CPU torch's image goes without it, as scripts/setup.sh)
RUN python -c "import sys, torch; sys.exit(torch.version.cuda is not None)" && pip uninstall -y triton || true
# gRPC public API, OpenAI-compatible HTTP API (`splice up`'s --http-port), engine
EXPOSE 50051 8000 50061
CMD ["splice", "up", "--host", "0.0.0.0"]
