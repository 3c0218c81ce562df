"""Hostile images and tensors through both faces (real gRPC and HTTP, stand-in engine): each is refused with
INVALID_ARGUMENT / 400 naming its part, never INTERNAL / 500, and the service keeps serving."""

from __future__ import annotations

import base64
import dataclasses
import io
import warnings

import grpc
import httpx
import pytest
import pytest_asyncio
import torch
from grpc_health.v1 import health_pb2

from app.models import resolve_model
from preprocessor.http.options import HttpOptions
from preprocessor.limits import Limits
from preprocessor.server import PreprocessorServer
from splice.v1 import common_pb2, preprocessor_pb2, preprocessor_pb2_grpc
from tests.preprocessor.pp_factories import png_bytes
from tests.preprocessor.standin_engine import StandinEngine, start_standin
from tests.preprocessor.test_engine_link import wait_health

pb = preprocessor_pb2
pytestmark = pytest.mark.asyncio(loop_scope="module")
MODEL = "tiny-idefics3"


@dataclasses.dataclass
class Faces:
    stub: preprocessor_pb2_grpc.PreprocessorStub
    http: httpx.AsyncClient
    media: object  # the allowed media dir (a Path)
    server: PreprocessorServer


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def faces(tiny_dirs, tiny, tmp_path_factory):
    _, info = tiny[MODEL]
    media = tmp_path_factory.mktemp("media")
    (media / "pic.png").write_bytes(png_bytes(20, 10))
    engine_server, engine_port = await start_standin(StandinEngine(info, [5, 6]))
    pre = PreprocessorServer(engine=f"127.0.0.1:{engine_port}", model=str(tiny_dirs[MODEL]), poll_interval=0.1,
                             resolve=resolve_model, http=HttpOptions(port=0), limits=Limits(allowed_media_dir=media))
    port = await pre.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    http = httpx.AsyncClient(base_url=f"http://127.0.0.1:{pre.http_port}", timeout=60)
    try:
        await wait_health(channel, health_pb2.HealthCheckResponse.SERVING)
        yield Faces(preprocessor_pb2_grpc.PreprocessorStub(channel), http, media, pre)
    finally:
        await http.aclose()
        await channel.close()
        await pre.stop(0)
        await engine_server.stop(0)


async def grpc_chat(faces: Faces, part: pb.ContentPart) -> grpc.aio.AioRpcError | None:
    """Chat with `part` as the user message's second part (messages[0].content[1]); the error, or None."""
    request = pb.ChatRequest(messages=[pb.ChatMessage(role="user", content=[pb.ContentPart(text="look"), part])],
                             sampling=common_pb2.SamplingParams(max_tokens=2))
    try:
        _ = [r async for r in faces.stub.Chat(request)]
    except grpc.aio.AioRpcError as err:
        return err
    return None


async def http_chat(faces: Faces, part: dict) -> httpx.Response:
    return await faces.http.post("/v1/chat/completions", json={
        "max_tokens": 2, "messages": [{"role": "user", "content": [{"type": "text", "text": "look"}, part]}]})


async def grpc_complete(faces: Faces, embeds: pb.PromptEmbeds) -> grpc.aio.AioRpcError | None:
    """Complete with `embeds` as prompt[0]; the error, or None."""
    request = pb.CompleteRequest(prompt=[pb.PromptPart(prompt_embeds=embeds)],
                                 sampling=common_pb2.SamplingParams(max_tokens=2))
    try:
        _ = [r async for r in faces.stub.Complete(request)]
    except grpc.aio.AioRpcError as err:
        return err
    return None


async def http_complete(faces: Faces, prompt_embeds: str) -> httpx.Response:
    """vLLM's form: /v1/completions with prompt_embeds (prompt_embeds[0])."""
    return await faces.http.post("/v1/completions", json={"max_tokens": 2, "prompt": "",
                                                          "prompt_embeds": prompt_embeds})


def refused_grpc(err: grpc.aio.AioRpcError | None, *needles: str, where: str = "messages[0].content[1]") -> None:
    assert err is not None, "accepted"
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, (err.code(), err.details())
    assert where in err.details(), err.details()
    for needle in needles:
        assert needle in err.details(), err.details()


def refused_http(resp: httpx.Response, *needles: str, where: str = "messages[0].content[1]") -> None:
    assert resp.status_code == 400, (resp.status_code, resp.text)
    message = resp.json()["error"]["message"]
    assert where in message, message
    for needle in needles:
        assert needle in message, message


def image_url(url: str) -> dict:
    return {"type": "image_url", "image_url": {"url": url}}


async def test_a_good_image_is_served_on_both_faces(faces):
    assert await grpc_chat(faces, pb.ContentPart(image=pb.ImageInput(path="pic.png"))) is None
    resp = await http_chat(faces, image_url(f"file://{faces.media}/pic.png"))
    assert resp.status_code == 200, resp.text
    data = base64.b64encode(png_bytes(20, 10)).decode()
    assert (await http_chat(faces, image_url(f"data:image/png;base64,{data}"))).status_code == 200


async def test_a_nul_in_an_image_path_is_refused(faces):
    refused_grpc(await grpc_chat(faces, pb.ContentPart(image=pb.ImageInput(path="pic.png\x00.txt"))), "NUL")
    refused_http(await http_chat(faces, image_url(f"file://{faces.media}/pic.png%00.txt")), "NUL")
    long_name = "a" * 300 + ".png"  # longer than a file name may be: the OS refuses it (not a missing file)
    refused_grpc(await grpc_chat(faces, pb.ContentPart(image=pb.ImageInput(path=long_name))), "cannot be opened")
    refused_http(await http_chat(faces, image_url(f"file://{faces.media}/{long_name}")), "cannot be opened")


async def test_only_the_accepted_image_formats_are_decoded(faces):
    from tests.preprocessor.test_image_inputs import EPS

    refused_grpc(await grpc_chat(faces, pb.ContentPart(image=pb.ImageInput(data=EPS))), "not a PNG, JPEG")
    data = base64.b64encode(EPS).decode()
    refused_http(await http_chat(faces, image_url(f"data:image/png;base64,{data}")), "not a PNG, JPEG")


def torch_b64(obj) -> str:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return base64.b64encode(buf.getvalue()).decode()


async def refused_as_embeds(faces: Faces, b64: str, *needles: str) -> None:
    """`b64` (vLLM's torch.save encoding) refused on every face that takes it: gRPC Chat and Complete, HTTP chat
    parts and /v1/completions."""
    refused_grpc(await grpc_chat(faces, pb.ContentPart(prompt_embeds=pb.PromptEmbeds(torch_base64=b64))), *needles)
    refused_grpc(await grpc_complete(faces, pb.PromptEmbeds(torch_base64=b64)), *needles, where="prompt[0]")
    refused_http(await http_chat(faces, {"type": "prompt_embeds", "data": b64}), *needles)
    refused_http(await http_complete(faces, b64), *needles, where="prompt_embeds[0]")


async def test_good_embeds_are_served_on_both_faces(faces, tiny):
    b64 = torch_b64(torch.randn(4, tiny[MODEL][1].hidden_size))
    assert await grpc_chat(faces, pb.ContentPart(prompt_embeds=pb.PromptEmbeds(torch_base64=b64))) is None
    assert await grpc_complete(faces, pb.PromptEmbeds(torch_base64=b64)) is None
    assert (await http_chat(faces, {"type": "prompt_embeds", "data": b64})).status_code == 200
    assert (await http_complete(faces, b64)).status_code == 200


async def test_meta_and_nested_tensors_are_refused(faces, tiny):
    hidden = tiny[MODEL][1].hidden_size
    await refused_as_embeds(faces, torch_b64(torch.empty(4, hidden, device="meta")), "device 'meta'")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # (nested tensors are a prototype)
        strided = torch.nested.nested_tensor([torch.ones(2, hidden), torch.ones(3, hidden)])
        jagged = torch.nested.nested_tensor([torch.ones(2, hidden), torch.ones(3, hidden)], layout=torch.jagged)
    await refused_as_embeds(faces, torch_b64(strided), "dense tensor")
    await refused_as_embeds(faces, torch_b64(jagged), "dense tensor")


async def test_a_compressed_storage_is_refused_before_it_is_inflated(faces):
    from tests.harness.hostile_files import deflated_torch_save

    # Row 2 of issue 27: 1.4 MB of base64 declaring a 1 GiB storage under a [4, 64] view (tiny-idefics3's hidden).
    b64 = base64.b64encode(deflated_torch_save((4, 64))).decode()
    await refused_as_embeds(faces, b64, "'archive/data/0' is compressed")


def png_url(blob: bytes) -> dict:
    return image_url("data:image/png;base64," + base64.b64encode(blob).decode())


async def test_images_too_long_or_too_thin_are_refused_from_the_header(faces):
    from tests.harness.hostile_files import png_header_only

    # Row 5 of issue 27: 16,000,000 x 1 (2 KB; within --max-image-pixels) took seconds of CPU to decode.
    long = png_header_only(16_000_000, 1)
    refused_grpc(await grpc_chat(faces, pb.ContentPart(image=pb.ImageInput(data=long))), "16000000x1",
                 "--max-image-side")
    refused_http(await http_chat(faces, png_url(long)), "16000000x1", "--max-image-side")
    thin = png_header_only(8000, 20)  # within the side cap, 400 times as long as wide
    refused_grpc(await grpc_chat(faces, pb.ContentPart(image=pb.ImageInput(data=thin))), "--max-image-aspect-ratio")
    refused_http(await http_chat(faces, png_url(thin)), "--max-image-aspect-ratio")


async def grpc_images(faces: Faces, blobs: list[bytes]) -> grpc.aio.AioRpcError | None:
    content = [pb.ContentPart(text="look")] + [pb.ContentPart(image=pb.ImageInput(data=b)) for b in blobs]
    request = pb.ChatRequest(messages=[pb.ChatMessage(role="user", content=content)],
                             sampling=common_pb2.SamplingParams(max_tokens=2))
    try:
        _ = [r async for r in faces.stub.Chat(request)]
    except grpc.aio.AioRpcError as err:
        return err
    return None


async def http_images(faces: Faces, blobs: list[bytes]) -> httpx.Response:
    content = [{"type": "text", "text": "look"}] + [png_url(b) for b in blobs]
    return await faces.http.post("/v1/chat/completions", json={
        "max_tokens": 2, "messages": [{"role": "user", "content": content}]})


async def test_a_requests_pixels_are_capped_together_and_held_in_admission(faces):
    from tests.harness.hostile_files import png_header_only

    # Row 5 of issue 27: 16 images of 4096 x 4096 (a few KB each) were accepted, seconds of CPU each.
    big = png_header_only(4096, 4096)
    err = await grpc_images(faces, [big] * 16)
    assert err is not None and err.code() == grpc.StatusCode.INVALID_ARGUMENT, err
    assert "16 images have 268435456 pixels together" in err.details() and "--max-request-image-pixels" in err.details()
    resp = await http_images(faces, [big] * 16)
    assert resp.status_code == 400 and "--max-request-image-pixels" in resp.text, resp.text
    # Within the request's cap, what decoding holds counts in admission: refused when it does not fit beside
    # what others hold (429, retry), served when it does; held only while the request runs.
    small = png_header_only(512, 512)  # two decode to 8 x 3 x 512 x 512 bytes (6 MiB) by image_cost
    admission = faces.server.admission
    saved = admission.max_bytes
    admission.max_bytes = 10 << 20
    other = admission.enter(5 << 20)  # another request holding 5 MiB
    try:
        err = await grpc_images(faces, [small] * 2)
        assert err is not None and err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, err
        assert "decoding the request's 2 images" in err.details() and "retry later" in err.details()
        resp = await http_images(faces, [small] * 2)
        assert resp.status_code == 429 and "decoding the request's 2 images" in resp.text, resp.text
        other.release()
        assert await grpc_images(faces, [small] * 2) is None
        assert (await http_images(faces, [small] * 2)).status_code == 200
    finally:
        other.release()
        admission.max_bytes = saved
    assert admission.held == 0 and admission.running == 0
