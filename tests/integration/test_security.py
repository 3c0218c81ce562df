"""TLS with client certificates (mTLS) on both hops and bearer keys (public API: gRPC and HTTP; engine: its own
key), with certificates made at test time; health stays open."""

from __future__ import annotations

import ssl

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from app.launch import start
from clients import ClientTLS, SpliceClient, SpliceClientError
from splice.v1 import common_pb2, engine_pb2_grpc
from tests.certs import Authority
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
