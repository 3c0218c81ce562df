"""TLS with client certificates (mTLS) on both hops and bearer keys (public API: gRPC and HTTP; engine: its own
key), with certificates made at test time; health stays open; `splice up` sets all of it up in one command."""

from __future__ import annotations

import os
import signal
import ssl
import time
from pathlib import Path

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from app.launch import start
from clients import ClientTLS, SpliceClient, SpliceClientError
from splice.v1 import common_pb2, engine_pb2_grpc
from tests.certs import Authority
from tests.harness.up import Up, listening_hosts
from tests.integration.conftest import MODEL

PUBLIC_KEY, ENGINE_KEY = "public-key", "engine-key"
HI = [{"role": "user", "content": "Hi"}]


@pytest.fixture(scope="module")
def secure_stack(tiny_dirs, tmp_path_factory):
    folder = tmp_path_factory.mktemp("certs")
    ca = Authority(folder)
    server, client = ca.issue("server", server=True), ca.issue("client", server=False)
    rogue = Authority(folder, "rogue-ca").issue("rogue-client", server=False)
    mtls = ["--tls-cert", str(server.cert), "--tls-key", str(server.key), "--tls-ca", str(ca.pem)]
    engine = start("engine", ["--model", MODEL, "--port", "0", *mtls], env={"SPLICE_ENGINE_API_KEY": ENGINE_KEY})
    try:
        # The ready line needs the engine's ModelInfo: the preprocessor -> engine hop works with TLS and the key.
        pre = start("preprocessor", ["--engine", engine.address, "--port", "0", "--http-port", "0", *mtls,
                                     "--engine-tls-ca", str(ca.pem), "--engine-tls-cert", str(client.cert),
                                     "--engine-tls-key", str(client.key)],
                    env={"SPLICE_API_KEY": PUBLIC_KEY, "SPLICE_ENGINE_API_KEY": ENGINE_KEY})
    except BaseException:
        engine.stop()
        raise
    yield engine, pre, ca, client, rogue
    pre.stop()
    engine.stop()


def _tls(ca, pair) -> ClientTLS:
    return ClientTLS(ca.pem, pair.cert, pair.key)


def test_public_api_needs_tls_a_client_certificate_and_the_key(secure_stack):
    _, pre, ca, client, rogue = secure_stack
    with SpliceClient(pre.address, timeout=60, tls=_tls(ca, client), api_key=PUBLIC_KEY) as ok:
        assert list(ok.chat(HI, max_tokens=2))[-1].finish_reason in ("stop", "length")
    for kwargs, code in (({"tls": _tls(ca, client)}, grpc.StatusCode.UNAUTHENTICATED),
                         ({"tls": _tls(ca, client), "api_key": "wrong"}, grpc.StatusCode.UNAUTHENTICATED),
                         ({"tls": _tls(ca, rogue), "api_key": PUBLIC_KEY}, grpc.StatusCode.UNAVAILABLE),
                         ({"tls": ClientTLS(ca.pem), "api_key": PUBLIC_KEY}, grpc.StatusCode.UNAVAILABLE),
                         ({"api_key": PUBLIC_KEY}, grpc.StatusCode.UNAVAILABLE)):  # plaintext
        with SpliceClient(pre.address, timeout=10, **kwargs) as bad, pytest.raises(SpliceClientError) as err:
            bad.detokenize([1])
        assert err.value.code == code, (kwargs, err.value)
    # Health answers without a key (probes), over the same mTLS.
    with grpc.secure_channel(pre.address, _tls(ca, client).credentials()) as channel:
        status = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10).status
    assert status == health_pb2.HealthCheckResponse.SERVING


def test_engine_takes_only_its_own_key(secure_stack):
    engine, _, ca, client, _ = secure_stack
    with grpc.secure_channel(engine.address, _tls(ca, client).credentials()) as channel:
        stub = engine_pb2_grpc.EngineStub(channel)
        for key in (None, PUBLIC_KEY):
            metadata = (("authorization", f"Bearer {key}"),) if key else ()
            with pytest.raises(grpc.RpcError) as err:
                stub.GetModelInfo(common_pb2.GetModelInfoRequest(), timeout=10, metadata=metadata)
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        info = stub.GetModelInfo(common_pb2.GetModelInfoRequest(), timeout=10,
                                 metadata=(("authorization", f"Bearer {ENGINE_KEY}"),))
        assert info.model == MODEL


def test_http_face_uses_the_same_certificate_and_key(secure_stack):
    _, pre, ca, client, _ = secure_stack
    url = f"https://{pre.http_address}/v1/models"
    context = ssl.create_default_context(cafile=str(ca.pem))
    context.load_cert_chain(str(client.cert), str(client.key))
    with httpx.Client(verify=context, timeout=30) as http:
        got = http.get(url, headers={"Authorization": f"Bearer {PUBLIC_KEY}"})
        assert got.status_code == 200, (got.text, pre.output[-10:])
        assert got.json()["data"][0]["id"] == MODEL
        assert http.get(url).status_code == 401
    bare = ssl.create_default_context(cafile=str(ca.pem))
    with httpx.Client(verify=bare, timeout=30) as no_cert, pytest.raises(httpx.HTTPError):
        no_cert.get(url, headers={"Authorization": f"Bearer {PUBLIC_KEY}"})


def test_splice_chat_with_tls_and_key(secure_stack, capsys):
    from app.cli import main

    _, pre, ca, client, _ = secure_stack
    args = ["chat", "Hi", "--target", pre.address, "--max-tokens", "2", "--tls-ca", str(ca.pem),
            "--tls-cert", str(client.cert), "--tls-key", str(client.key)]
    assert main([*args, "--api-key", PUBLIC_KEY]) == 0
    assert "finish_reason=" in capsys.readouterr().err
    assert main(args) == 1
    assert "UNAUTHENTICATED" in capsys.readouterr().err


def test_splice_up_runs_both_hops_over_mtls_with_keys_and_restarts_them_so(tiny_dirs, tmp_path):
    """One `splice up` command secures the whole stack; a killed engine comes back with its TLS and key."""
    ca = Authority(tmp_path)
    server, engine_cert, client = (ca.issue("server", server=True), ca.issue("engine", server=True),
                                   ca.issue("client", server=False))
    link = ca.issue("preprocessor", server=False)
    up = Up("--port", "0", "--engine-port", "0", "--http-port", "0",
            "--tls-cert", str(server.cert), "--tls-key", str(server.key), "--tls-ca", str(ca.pem),
            "--engine-server-cert", str(engine_cert.cert), "--engine-server-key", str(engine_cert.key),
            "--engine-tls-ca", str(ca.pem), "--engine-tls-cert", str(link.cert), "--engine-tls-key", str(link.key),
            "--api-key", PUBLIC_KEY, "--engine-api-key", ENGINE_KEY, model=MODEL)
    try:
        line = up.wait_ready()
        assert "https://" in line and "(public API mTLS, public API key, engine link mTLS, engine key)" in line, line
        for service in ("engine", "preprocessor"):  # keys reach the services through their environment
            assert PUBLIC_KEY not in up.child(service)[1] and ENGINE_KEY not in up.child(service)[1]
        _served_only_with_tls_and_key(up.address, ca, client)
        with grpc.secure_channel(up.engine_address, _tls(ca, link).credentials()) as channel:
            with pytest.raises(grpc.RpcError) as err:
                engine_pb2_grpc.EngineStub(channel).GetModelInfo(common_pb2.GetModelInfoRequest(), timeout=10)
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        with grpc.insecure_channel(up.engine_address) as channel, pytest.raises(grpc.RpcError) as err:
            engine_pb2_grpc.EngineStub(channel).GetModelInfo(common_pb2.GetModelInfoRequest(), timeout=10)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE

        os.kill(up.child("engine")[0], signal.SIGKILL)
        up.read_until("splice up: engine serving again", timeout=120)
        with SpliceClient(up.address, timeout=30, tls=_tls(ca, client), api_key=PUBLIC_KEY) as ok:
            deadline = time.monotonic() + 60
            while True:  # the preprocessor finds the engine again within its poll interval
                try:
                    assert list(ok.chat(HI, max_tokens=2))[-1].finish_reason in ("stop", "length")
                    break
                except SpliceClientError as exc:
                    assert exc.code == grpc.StatusCode.UNAVAILABLE and time.monotonic() < deadline, exc
                    time.sleep(0.2)
        assert up.stop() == 0
    finally:
        up.kill()


def _environ(pid: int) -> dict[str, str]:
    pairs = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(p.decode().split("=", 1) for p in pairs if b"=" in p)


def _template_workers(parent: int, timeout: float = 60) -> list[int]:
    """The request-template worker processes of `parent`, once it has started some."""
    deadline = time.monotonic() + timeout
    while True:
        found = []
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
                cmdline = (stat.parent / "cmdline").read_bytes()
            except (OSError, ValueError, IndexError):
                continue
            if ppid == parent and b"preprocessor.template_sandbox" in cmdline:
                found.append(int(stat.parent.name))
        if found or time.monotonic() > deadline:
            return found
        time.sleep(0.2)


def test_splice_up_keeps_its_engine_on_loopback_behind_a_generated_key(tiny_dirs, monkeypatch):
    """`--host 0.0.0.0 --api-key K`: the public API on every interface with K; the engine on 127.0.0.1 only, and
    a direct call to it without a key (or with K) is refused: the public key cannot be bypassed. The
    preprocessor's template workers get neither key."""
    monkeypatch.delenv("SPLICE_ENGINE_API_KEY", raising=False)
    monkeypatch.delenv("SPLICE_API_KEY", raising=False)
    up = Up("--host", "0.0.0.0", "--port", "0", "--engine-port", "0", "--http-port", "0", "--api-key", PUBLIC_KEY,
            "--preprocessor-args=--trust-request-chat-template", model=MODEL)
    try:
        line = up.wait_ready()
        assert "(public API key, engine key (generated))" in line, line
        public_port, engine_port = (int(a.rsplit(":", 1)[1]) for a in (up.address, up.engine_address))
        assert listening_hosts(public_port) & {"0.0.0.0", "::"}  # every interface (gRPC may bind it dual-stack)
        assert listening_hosts(engine_port) == {"127.0.0.1"}
        (engine_pid, engine_argv), (pre_pid, pre_argv) = up.child("engine"), up.child("preprocessor")
        generated = _environ(engine_pid).get("SPLICE_ENGINE_API_KEY", "")
        assert len(generated) >= 32 and generated != PUBLIC_KEY
        assert _environ(pre_pid)["SPLICE_ENGINE_API_KEY"] == generated  # through the environment, not argv
        assert generated not in engine_argv and generated not in pre_argv
        workers = _template_workers(pre_pid)
        assert workers
        for pid in workers:
            environ = _environ(pid)
            assert not {"SPLICE_API_KEY", "SPLICE_ENGINE_API_KEY"} & environ.keys(), sorted(environ)
            assert generated not in str(environ) and PUBLIC_KEY not in str(environ)

        with grpc.insecure_channel(f"127.0.0.1:{engine_port}") as channel:
            stub = engine_pb2_grpc.EngineStub(channel)
            for metadata in ((), (("authorization", f"Bearer {PUBLIC_KEY}"),)):
                with pytest.raises(grpc.RpcError) as err:
                    stub.GetModelInfo(common_pb2.GetModelInfoRequest(), timeout=10, metadata=metadata)
                assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
            health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
            assert health.status == health_pb2.HealthCheckResponse.SERVING  # probes carry no key
        public = f"127.0.0.1:{public_port}"
        with SpliceClient(public, timeout=60, api_key=PUBLIC_KEY) as ok:
            assert list(ok.chat(HI, max_tokens=2))[-1].finish_reason in ("stop", "length")
        with SpliceClient(public, timeout=10) as bad, pytest.raises(SpliceClientError) as err:
            bad.detokenize([1])
        assert err.value.code == grpc.StatusCode.UNAUTHENTICATED
        assert up.stop() == 0
    finally:
        up.kill()


def _served_only_with_tls_and_key(address: str, ca: Authority, client) -> None:
    with SpliceClient(address, timeout=60, tls=_tls(ca, client), api_key=PUBLIC_KEY) as ok:
        chunks = list(ok.chat(HI, max_tokens=3))
    assert chunks[-1].finish_reason in ("stop", "length")
    assert sum(len(c.token_ids) for c in chunks) == chunks[-1].usage.completion_tokens
    for kwargs, code in (({"tls": _tls(ca, client)}, grpc.StatusCode.UNAUTHENTICATED),
                         ({"api_key": PUBLIC_KEY}, grpc.StatusCode.UNAVAILABLE)):  # plaintext
        with SpliceClient(address, timeout=10, **kwargs) as bad, pytest.raises(SpliceClientError) as err:
            list(bad.chat(HI, max_tokens=1))
        assert err.value.code == code, (kwargs, err.value)


@pytest.mark.parametrize("flags, says", [
    (["--engine-server-cert", "e.pem", "--engine-server-key", "e.key"], "needs --engine-tls-ca"),
    (["--engine-tls-ca", "ca.pem"], "needs --engine-server-cert"),
    (["--engine-server-cert", "e.pem"], "both --engine-server-cert and --engine-server-key"),
    (["--engine-server-cert", "e.pem", "--engine-server-key", "e.key", "--engine-tls-ca", "system",
      "--engine-tls-cert", "c.pem", "--engine-tls-key", "c.key"], "not 'system'"),
])
def test_splice_up_refuses_an_engine_link_that_cannot_work_in_one_line(flags, says, capsys):
    from app.cli import main

    assert main(["up", *flags]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and says in err, err
