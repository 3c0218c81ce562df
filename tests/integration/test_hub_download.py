"""`--model ORG/NAME` downloaded from the Hub: real processes against a Hub stand-in on loopback (tests/hub_standin.py)
serving tiny-text's files, each process with HF_ENDPOINT pointing at it and a Hugging Face cache of its own."""

from __future__ import annotations

import collections
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from app.launch import start, start_stack, wait_healthy
from app.tiny import ensure
from clients import SpliceClient
from tests.hub_standin import HubStandin

REPO = "org/tiny-text"
WEIGHTS = "model.safetensors"
ASK = {"temperature": 0.0, "max_tokens": 12, "ignore_eos": True}
MESSAGES = [{"role": "user", "content": "Name a colour."}]
NOT_FOUND = "not found on the Hub (HTTP {code}): check the name, or set HF_TOKEN for a gated/private model"


@pytest.fixture(scope="module")
def folder() -> Path:
    return ensure("tiny-text")


@pytest.fixture
def hub(folder):
    """org/tiny-text (plus a subfolder of another format, never fetched), org/private (seen with the token
    'secret' only) and org/gated (its files fetched with the token 'accepted' only)."""
    standin = HubStandin().start()
    standin.add(REPO, folder, extra={"original/consolidated.pth": b"\0" * 4096})
    standin.add("org/private", folder, token="secret")
    standin.add("org/gated", folder, gated="accepted")
    yield standin
    standin.stop()


def _env(hub: HubStandin, home: Path, **extra: str) -> dict[str, str]:
    """The environment of a process that reaches `hub` and caches under `home`; no token or offline switch of the
    surrounding shell leaks in (an empty HF_TOKEN is none)."""
    return {"HF_ENDPOINT": hub.endpoint, "HF_HOME": str(home), "HF_HUB_CACHE": str(home / "hub"), "HF_TOKEN": "",
            "HF_HUB_OFFLINE": "0", "TRANSFORMERS_OFFLINE": "0", **extra}


def _run(args: list[str], env: dict[str, str], timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "app.cli", *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **env})


def _last_line(done: subprocess.CompletedProcess) -> str:
    assert "Traceback" not in done.stderr, done.stderr
    return done.stderr.strip().splitlines()[-1]


def _answer(address: str) -> list[int]:
    with SpliceClient(address, timeout=120) as client:
        return [t for chunk in client.chat(MESSAGES, **ASK) for t in chunk.token_ids]


def _cached_files(home: Path) -> dict[str, Path]:
    """Repo path -> file of org/tiny-text's snapshot in the cache under `home`."""
    snapshots = list((home / "hub" / "models--org--tiny-text" / "snapshots").glob("*"))
    assert len(snapshots) == 1, snapshots
    return {p.name: p for p in snapshots[0].iterdir()}


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_engine_and_preprocessor_download_their_parts_and_answer_as_the_local_folder(hub, folder, tmp_path):
    engine, pre = start_stack(str(folder))
    try:
        expected = _answer(pre.address)
    finally:
        pre.stop()
        engine.stop()

    engine = start("engine", ["--model", REPO, "--port", "0"], env=_env(hub, tmp_path / "engine"))
    try:  # the preprocessor resolves the model the engine reports, in a cache of its own (another container)
        pre = start("preprocessor", ["--engine", engine.address, "--port", "0"], env=_env(hub, tmp_path / "pre"))
        try:
            assert _answer(pre.address) == expected
        finally:
            pre.stop()
    finally:
        engine.stop()

    engine_files, pre_files = _cached_files(tmp_path / "engine"), _cached_files(tmp_path / "pre")
    assert _sha256(engine_files[WEIGHTS]) == _sha256(folder / WEIGHTS)
    assert set(pre_files) == {p.name for p in folder.iterdir()} - {WEIGHTS}, "config and tokenizer files only"
    assert not list((tmp_path / "pre").rglob("*.safetensors"))
    assert all((tmp_path / "pre" / "hub" / "models--org--tiny-text" / "blobs" / name).stat().st_size < 100_000
               for name in os.listdir(tmp_path / "pre" / "hub" / "models--org--tiny-text" / "blobs"))
    assert len(hub.requests("GET", "cdn:/blobs/")) == 1, "the weights were fetched once, by the engine"
    assert not hub.requests("HEAD", "original/") and not hub.requests("GET", "original/"), "top level only"


def test_up_downloads_once_then_both_services_load_it_from_the_cache(hub, folder, tmp_path):
    up = subprocess.Popen([sys.executable, "-m", "app.cli", "up", "--model", REPO, "--port", "0",
                           "--engine-port", "0", "--http-port", "0"], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, env={**os.environ, **_env(hub, tmp_path)})
    try:
        lines = []
        deadline = time.monotonic() + 240
        for line in up.stdout:
            lines.append(line)
            if line.startswith("splice up:"):
                break
            assert time.monotonic() < deadline, "".join(lines)
        assert "Ctrl-C stops both" in lines[-1], "".join(lines)
        http = next(line.split()[-1] for line in lines if line.startswith("http serving on"))
        with urllib.request.urlopen(f"http://{http}/v1/models", timeout=30) as resp:
            assert json.load(resp)["data"][0]["id"] == REPO
        up.send_signal(signal.SIGINT)
        assert up.wait(60) == 0
    finally:
        if up.poll() is None:
            up.kill()
            up.wait()
    assert any(f"{REPO}: downloading its weights" in line for line in lines), "".join(lines)
    # one look-up of the repo and one download of each file: the services found it all in the cache
    assert len(hub.requests("GET", f"/api/models/{REPO}/revision/")) == 1
    downloads = collections.Counter(hub.requests("GET", "/resolve/") + hub.requests("GET", "cdn:/blobs/"))
    assert set(downloads.values()) == {1} and len(downloads) == len(list(folder.iterdir())), downloads


@pytest.mark.parametrize("command", ["engine", "preprocessor", "up"])
def test_a_model_not_on_the_hub_is_one_line_and_exit_2(hub, tmp_path, command):
    flags = {"engine": ["--port", "0"], "preprocessor": ["--engine", "127.0.0.1:9", "--port", "0"],
             "up": ["--port", "0", "--engine-port", "0", "--http-port", "0"]}[command]
    done = _run([command, "--model", "org/missing", *flags], _env(hub, tmp_path))
    assert done.returncode == 2, done.stderr
    assert _last_line(done) == f"splice {command}: model 'org/missing' " + NOT_FOUND.format(code=401)


def _resolve(hub: HubStandin, home: Path, model: str, weights: bool, **env: str) -> subprocess.CompletedProcess:
    """resolve_model in a process of its own: stdout the folder, or exit 1 with the SpliceError's one line."""
    code = ("import sys; from app.models import resolve_model; from splice.errors import SpliceError\n"
            f"try: print(resolve_model({model!r}, weights={weights}))\n"
            "except SpliceError as exc: sys.exit(exc.message)")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **_env(hub, home, **env)})


def test_private_and_gated_models_are_fetched_with_hf_token_only(hub, tmp_path):
    anonymous, wrong, right = (_resolve(hub, tmp_path, "org/private", False, HF_TOKEN=token)
                               for token in ("", "other", "secret"))
    assert anonymous.returncode == 1 and _last_line(anonymous).endswith(NOT_FOUND.format(code=401))
    assert wrong.returncode == 1 and _last_line(wrong).endswith(NOT_FOUND.format(code=404))
    assert right.returncode == 0, right.stderr
    assert (Path(right.stdout.strip()) / "tokenizer.json").is_file()

    anonymous, wrong, right = (_resolve(hub, tmp_path, "org/gated", False, HF_TOKEN=token)
                               for token in ("", "other", "accepted"))
    for refused, code in ((anonymous, 401), (wrong, 403)):
        assert refused.returncode == 1
        assert _last_line(refused) == (f"model 'org/gated' is gated on the Hub (HTTP {code}): accept its terms on "
                                       f"{hub.endpoint}/org/gated, then set HF_TOKEN to a token of that account")
    assert right.returncode == 0, right.stderr


def test_sharded_weights_are_the_shards_the_index_lists(hub, folder, tmp_path):
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(folder / WEIGHTS))
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    sharded = tmp_path / "sharded"
    sharded.mkdir()
    for p in folder.iterdir():
        if p.name != WEIGHTS:
            (sharded / p.name).write_bytes(p.read_bytes())
    for shard, keys in shards.items():
        save_file({k: tensors[k] for k in keys}, str(sharded / shard))
    (sharded / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {k: shard for shard, keys in shards.items() for k in keys}}))
    # a consolidated copy beside the shards (as some repos ship one): not what the index names, never fetched
    hub.add("org/sharded", sharded, extra={"consolidated.safetensors": (folder / WEIGHTS).read_bytes()})

    done = _resolve(hub, tmp_path / "home", "org/sharded", True)
    assert done.returncode == 0, done.stderr
    got = Path(done.stdout.strip())
    assert sorted(p.name for p in got.glob("*.safetensors")) == sorted(shards)
    for shard in shards:
        assert _sha256(got / shard) == _sha256(sharded / shard)
    consolidated = hub.repos["org/sharded"].files["consolidated.safetensors"].sha256
    assert not [path for path in hub.requests("GET") + hub.requests("HEAD") if "consolidated" in path
                or consolidated in path]


def test_offline_with_nothing_cached_is_one_line_and_asks_nothing_of_the_hub(hub, tmp_path):
    done = _run(["engine", "--model", REPO, "--port", "0"], _env(hub, tmp_path, HF_HUB_OFFLINE="1"))
    assert done.returncode == 2
    line = _last_line(done)
    assert line.startswith(f"splice engine: model '{REPO}': its config and tokenizer files are not in the Hugging "
                           f"Face cache ({tmp_path / 'hub'})"), line
    assert "HF_HUB_OFFLINE=1 forbids downloading" in line and f"`hf download {REPO}`" in line, line
    assert not hub.requests("GET", REPO) and not hub.requests("HEAD", REPO)


def test_a_connection_dropped_mid_file_is_resumed(hub, folder, tmp_path):
    size = (folder / WEIGHTS).stat().st_size
    hub.cut(REPO, WEIGHTS, [size // 2])
    done = _resolve(hub, tmp_path, REPO, True)
    assert done.returncode == 0, done.stderr
    assert _sha256(Path(done.stdout.strip()) / WEIGHTS) == _sha256(folder / WEIGHTS)
    assert len(hub.requests("GET", "cdn:/blobs/")) == 2, "one cut short, one retried"


def test_a_download_that_keeps_failing_is_one_line_leaves_nothing_half_written_and_a_rerun_completes(
        hub, folder, tmp_path):
    size = (folder / WEIGHTS).stat().st_size
    hub.cut(REPO, WEIGHTS, [size // 2] + [0] * 20)  # half, then every resume fails before its first byte
    done = _run(["engine", "--model", REPO, "--port", "0"], _env(hub, tmp_path))
    assert done.returncode == 2
    line = _last_line(done)
    assert line.startswith(f"splice engine: downloading model '{REPO}' from {hub.endpoint} failed ("), line
    assert line.endswith("run again to fetch the rest"), line
    assert not list(tmp_path.rglob("*.incomplete")), "no partial file is left in the cache"
    assert WEIGHTS not in _cached_files(tmp_path)
    blobs = tmp_path / "hub" / "models--org--tiny-text" / "blobs"
    assert _sha256(folder / WEIGHTS) not in os.listdir(blobs)

    # the incomplete snapshot is not taken as a model ...
    offline = _run(["engine", "--model", REPO, "--port", "0"], _env(hub, tmp_path, HF_HUB_OFFLINE="1"))
    assert offline.returncode == 2
    assert "its weights are only partly in the Hugging Face cache" in _last_line(offline)

    # ... and a run against a healthy Hub completes it and serves
    hub.cuts.clear()
    engine = start("engine", ["--model", REPO, "--port", "0"], env=_env(hub, tmp_path))
    try:
        wait_healthy(engine.address)
    finally:
        engine.stop()
    assert _sha256(_cached_files(tmp_path)[WEIGHTS]) == _sha256(folder / WEIGHTS)
