"""What replicas rely on: the ORCA load report's wire format, the model fingerprint, the channel's service config."""

from __future__ import annotations

import dataclasses
import json

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from splice.grpc_options import replica_options, service_config
from splice.load_report import CallRate, encode_load_report
from splice.model_info import IMAGE, PROMPT_EMBEDS, TEXT, ModelInfo


def _orca_report_class():
    """xds.data.orca.v3.OrcaLoadReport's two fields Splice sets, declared as gRPC's policy reads them."""
    file = descriptor_pb2.FileDescriptorProto(name="orca_test.proto", package="xds.data.orca.v3", syntax="proto3")
    msg = file.message_type.add(name="OrcaLoadReport")
    double = descriptor_pb2.FieldDescriptorProto.TYPE_DOUBLE
    optional = descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL
    msg.field.add(name="rps_fractional", number=6, type=double, label=optional)
    msg.field.add(name="application_utilization", number=9, type=double, label=optional)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("xds.data.orca.v3.OrcaLoadReport"))


def test_load_report_is_an_orca_report():
    report = _orca_report_class().FromString(encode_load_report(0.75, 12.5))
    assert report.application_utilization == 0.75 and report.rps_fractional == 12.5


def test_call_rate_counts_recent_calls():
    rate = CallRate(window=60.0)
    assert rate.per_second() == 0
    for _ in range(5):
        rate.finished()
    assert rate.per_second() > 0


INFO = ModelInfo(model="m", architecture="LlamaForCausalLM", vocab_rows=100, hidden_size=64, dtype="float32",
                 max_model_len=2048, input_kinds=(TEXT, PROMPT_EMBEDS))


def test_fingerprint_follows_what_validation_depends_on():
    assert INFO.fingerprint == dataclasses.replace(INFO, model="same weights, another name").fingerprint
    for change in ({"vocab_rows": 101}, {"hidden_size": 32}, {"dtype": "bfloat16"}, {"max_model_len": 1024},
                   {"image_token_id": 7, "input_kinds": (TEXT, PROMPT_EMBEDS, IMAGE)}):
        assert dataclasses.replace(INFO, **change).fingerprint != INFO.fingerprint, change


def test_service_config_balances_checks_health_and_retries_unavailable():
    config = json.loads(service_config("splice.v1.Engine", weighted=True, health_check=True))
    assert list(config["loadBalancingConfig"][0]) == ["weighted_round_robin"]
    assert config["healthCheckConfig"] == {"serviceName": "splice.v1.Engine"}
    assert config["methodConfig"][0]["retryPolicy"]["retryableStatusCodes"] == ["UNAVAILABLE"]
    plain = json.loads(service_config("splice.v1.Preprocessor", weighted=False, health_check=False))
    assert list(plain["loadBalancingConfig"][0]) == ["round_robin"] and "healthCheckConfig" not in plain


def test_grpc_accepts_the_options_for_a_multi_address_target():
    """An invalid service config makes gRPC fail every call with UNAVAILABLE naming the config; a valid one
    fails here only because nothing listens."""
    with grpc.insecure_channel("ipv4:127.0.0.1:1,127.0.0.1:2", options=replica_options("x.Y", True, True)) as ch:
        try:
            ch.unary_unary("/x.Y/Z")(b"", timeout=2)
        except grpc.RpcError as exc:
            assert exc.code() != grpc.StatusCode.INVALID_ARGUMENT, exc.details()
            assert "service config" not in (exc.details() or "").lower(), exc.details()
