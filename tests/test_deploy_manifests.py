"""deploy/kubernetes/ cannot rot: every manifest validates strictly against Kubernetes' own schemas (offline,
kubernetes-validate), every container command parses with Splice's own CLI, and the pieces point at each other:
selectors, the headless engine Service the preprocessor's dns:/// target names, gRPC probes on the real services,
the NetworkPolicy that lets only preprocessors reach the engine, and the engine key's one Secret."""

from __future__ import annotations

from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from app.cli import build_parser
from splice.security import ENGINE_KEY_ENV
from splice.v1 import engine_pb2, preprocessor_pb2

DEPLOY = Path(__file__).resolve().parents[1] / "deploy" / "kubernetes"
VERSIONS = ("1.30.0", "1.33.0", kubernetes_validate.utils.latest_version())
SERVICES = {engine_pb2.DESCRIPTOR.services_by_name["Engine"].full_name,
            preprocessor_pb2.DESCRIPTOR.services_by_name["Preprocessor"].full_name}


def _documents() -> list[tuple[str, dict]]:
    docs = []
    for path in sorted(DEPLOY.glob("*.yaml")):
        docs += [(f"{path.name}#{i}", d) for i, d in enumerate(yaml.safe_load_all(path.read_text())) if d]
    return docs


DOCS = _documents()


def _kind(kind: str) -> dict[str, dict]:
    return {d["metadata"]["name"]: d for _, d in DOCS if d["kind"] == kind}


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize(("where", "doc"), DOCS, ids=[w for w, _ in DOCS])
def test_manifest_is_valid_kubernetes(where, doc, version):
    kubernetes_validate.validate(doc, version, strict=True)


def test_strict_validation_catches_a_typo():
    deployment = yaml.safe_load((DEPLOY / "engine.yaml").read_text().split("\n---\n")[0])
    deployment["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {"grpc": {"port": 50061}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, VERSIONS[-1], strict=True)


def _containers():
    for name, dep in _kind("Deployment").items():
        for container in dep["spec"]["template"]["spec"]["containers"]:
            yield name, dep, container


def _args(container: dict):
    command = container["command"]
    assert command[0] == "splice"
    return command[1], build_parser().parse_args(command[1:])


def test_every_command_is_a_splice_command_with_flags_it_accepts():
    for _, _, container in _containers():
        service, args = _args(container)
        assert service in ("engine", "preprocessor")
        ports = {p["containerPort"] for p in container["ports"]}
        assert args.port in ports and args.metrics_port in ports and args.host == "0.0.0.0"


def test_selectors_match_their_pods_and_autoscalers_their_deployments():
    deployments = _kind("Deployment")
    for dep in deployments.values():
        labels = dep["spec"]["template"]["metadata"]["labels"]
        assert dep["spec"]["selector"]["matchLabels"].items() <= labels.items()
    for svc in _kind("Service").values():
        assert any(svc["spec"]["selector"].items() <= d["spec"]["template"]["metadata"]["labels"].items()
                   for d in deployments.values()), svc["metadata"]["name"]
    for hpa in _kind("HorizontalPodAutoscaler").values():
        assert hpa["spec"]["scaleTargetRef"]["name"] in deployments


def test_the_preprocessor_reaches_every_engine_pod_through_a_headless_service():
    services = _kind("Service")
    engine_ports = set()
    for _, _, container in _containers():
        service, args = _args(container)
        if service == "engine":
            engine_ports.add(args.port)
            continue
        assert args.engine.startswith("dns:///"), "one address would pin every call to one engine pod"
        name, port = args.engine.removeprefix("dns:///").split(":")
        target = services[name]
        assert target["spec"]["clusterIP"] == "None"
        assert int(port) in {p["port"] for p in target["spec"]["ports"]}
    assert engine_ports == {int(port)}


def test_probes_ask_grpc_health_of_the_real_services():
    for name, _, container in _containers():
        readiness = container["readinessProbe"]["grpc"]
        assert readiness["service"] in SERVICES, name
        assert readiness["port"] == _args(container)[1].port


def _pod_labels(component: str) -> list[dict]:
    return [d["spec"]["template"]["metadata"]["labels"] for d in _kind("Deployment").values()
            if d["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"] == component]


def _selects(selector: dict, labels: dict) -> bool:
    assert set(selector) <= {"matchLabels"}, selector  # matchExpressions would need evaluating
    return selector.get("matchLabels", {}).items() <= labels.items()


def test_only_preprocessor_pods_reach_the_engine():
    engines, preprocessors = _pod_labels("engine"), _pod_labels("preprocessor")
    engine_port = _args(next(c for _, _, c in _containers() if _args(c)[0] == "engine"))[1].port
    policies = [p for p in _kind("NetworkPolicy").values()
                if all(_selects(p["spec"]["podSelector"], labels) for labels in engines)]
    assert policies, "no NetworkPolicy selects every engine pod (CPU and GPU)"
    for policy in policies:
        assert "Ingress" in policy["spec"]["policyTypes"]
        for rule in policy["spec"].get("ingress", []):
            ports = {p["port"] for p in rule.get("ports", [])}
            if ports and engine_port not in ports:
                continue  # e.g. metrics
            peers = rule.get("from")
            assert peers, f"{policy['metadata']['name']}: the engine port is open to every pod"
            for peer in peers:  # a pod selector alone: this namespace's pods that it selects
                assert set(peer) == {"podSelector"}, peer
                assert all(_selects(peer["podSelector"], labels) for labels in preprocessors)
                assert not any(_selects(peer["podSelector"], labels) for labels in engines)


def test_the_engine_key_comes_from_one_secret_in_both_deployments():
    refs = {}
    for name, _, container in _containers():
        env = {e["name"]: e for e in container.get("env", [])}
        assert ENGINE_KEY_ENV in env, name
        refs[name] = env[ENGINE_KEY_ENV]["valueFrom"]["secretKeyRef"]
        assert not any("api-key" in arg for arg in container["command"]), name  # argv is readable by `ps`
    assert {_args(c)[0] for _, _, c in _containers()} == {"engine", "preprocessor"}
    assert len({(r["name"], r["key"]) for r in refs.values()}) == 1, refs
    assert not any(r.get("optional") for r in refs.values())  # no key, no pod: never an open engine


def test_the_preprocessors_serve_the_model_under_a_name_clients_send():
    """vLLM's --served-model-name, as a vLLM deployment's clients are configured for (docker-compose.yml too:
    SPLICE_SERVED_MODEL_NAME, tests/integration/test_compose.py)."""
    named = [args.served_model_name for _, _, c in _containers() for service, args in [_args(c)]
             if service == "preprocessor"]
    assert named and all(names for names in named)
    compose = (DEPLOY.parents[1] / "docker-compose.yml").read_text()
    assert compose.count('"--served-model-name", "${SPLICE_SERVED_MODEL_NAME:-${SPLICE_MODEL:-') == 2
