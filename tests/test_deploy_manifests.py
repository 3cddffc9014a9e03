"""The Kubernetes manifests (deploy/k8s) against the code they deploy: every
file parses, every MILLM_* variable is one the processes read, ports and
probes point at what the engine and bridge serve (gRPC health service names,
HTTP routes), Services select the pods, Secrets hold the keys referenced, the
autoscaler reads a metric the engine exports. `make deploy-check` adds the
Kubernetes schemas and a policy scanner on the rendered overlays; this test
needs neither, so it runs everywhere.
"""

from __future__ import annotations

import pathlib
import re

import pytest
import yaml

from service.server import ROUTABLE_HEALTH, SERVICE_NAMES

ROOT = pathlib.Path(__file__).resolve().parent.parent
K8S = ROOT / "deploy" / "k8s"


def documents() -> list[dict]:
    found = []
    for path in sorted(K8S.rglob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") != "Kustomization" and "apiVersion" in doc:
                found.append(doc)
    return found


def by_kind(kind: str) -> dict[str, dict]:
    # Overlays patch the base's objects: the base's (the first) is the whole one.
    out: dict[str, dict] = {}
    for doc in documents():
        if doc["kind"] == kind:
            out.setdefault(doc["metadata"]["name"], doc)
    return out


def container(deployment: str) -> dict:
    return by_kind("Deployment")[deployment]["spec"]["template"]["spec"]["containers"][0]


def env(c: dict) -> dict[str, dict]:
    return {e["name"]: e for e in c.get("env", [])}


def variables_read_by(*files: str) -> set[str]:
    names = set()
    for f in files:
        names |= set(re.findall(r'"(MILLM_[A-Z0-9_]+)"', (ROOT / f).read_text()))
    return names


def test_every_file_parses_and_every_kustomization_points_at_files():
    for path in K8S.rglob("kustomization.yaml"):
        k = yaml.safe_load(path.read_text())
        for item in (k.get("resources", []) + k.get("bases", [])
                     + k.get("patchesStrategicMerge", [])):
            assert (path.parent / item).exists(), f"{path}: {item}"
    kinds = {d["kind"] for d in documents()}
    assert {"Deployment", "Service", "Secret", "PodDisruptionBudget",
            "HorizontalPodAutoscaler", "StatefulSet"} <= kinds


@pytest.mark.parametrize(("deployment", "sources"), [
    ("millm-engine", ("service/config.py", "common/api_keys.py")),
    ("millm-bridge", ("rest_bridge/config.py", "common/api_keys.py")),
])
def test_every_variable_is_one_the_process_reads(deployment, sources):
    known = variables_read_by(*sources)
    used = set(env(container(deployment)))
    for path in K8S.rglob("*.yaml"):  # overlays' patches too
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") == "Deployment" and doc["metadata"]["name"] == deployment:
                for c in doc["spec"]["template"]["spec"].get("containers", []):
                    used |= {e["name"] for e in c.get("env", [])}
    assert used and used <= known, used - known


def test_engine_ports_and_probes_match_what_it_serves():
    c = container("millm-engine")
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    variables = env(c)
    assert ports["grpc"] == int(variables["MILLM_GRPC_PORT"]["value"])
    assert ports["metrics"] == int(variables["MILLM_METRICS_PORT"]["value"])
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert c[probe]["grpc"]["port"] == ports["grpc"], probe
    # Readiness is the entry a model change turns NOT_SERVING; liveness a
    # service that stays SERVING through one.
    assert c["readinessProbe"]["grpc"]["service"] == ROUTABLE_HEALTH
    assert c["livenessProbe"]["grpc"]["service"] in SERVICE_NAMES
    assert c["command"] == ["python", "-m", "service"]
    database = next(m for m in c["volumeMounts"]
                    if variables["MILLM_DATABASE_URL_FILE"]["value"].startswith(m["mountPath"]))
    volume = next(v for v in by_kind("Deployment")["millm-engine"]["spec"]["template"]["spec"][
        "volumes"] if v["name"] == database["name"])
    assert volume["secret"]["secretName"] == "millm-database"
    pod = by_kind("Deployment")["millm-engine"]["spec"]["template"]
    assert pod["metadata"]["labels"]["llm-d.ai/engine-type"] == "vllm"
    assert pod["spec"]["terminationGracePeriodSeconds"] > \
        float(variables["MILLM_DRAIN_SECONDS"]["value"])


def test_bridge_ports_probes_and_engine_target():
    c = container("millm-bridge")
    variables = env(c)
    port = c["ports"][0]
    assert port["containerPort"] == int(variables["MILLM_HTTP_PORT"]["value"])
    routes = (ROOT / "rest_bridge" / "routes.py").read_text()
    for probe in ("readinessProbe", "livenessProbe"):
        assert c[probe]["httpGet"]["port"] == port["name"]
        assert f'@router.get("{c[probe]["httpGet"]["path"]}")' in routes
    engine_service = by_kind("Service")["millm-engine"]
    grpc_port = next(p["port"] for p in engine_service["spec"]["ports"] if p["name"] == "grpc")
    assert variables["MILLM_ENGINE_TARGETS"]["value"] == f"dns:///millm-engine:{grpc_port}"
    assert c["command"] == ["python", "-m", "rest_bridge"]


def test_services_budgets_and_the_autoscaler_select_real_pods():
    deployments = by_kind("Deployment")
    pods = {name: d["spec"]["template"]["metadata"]["labels"] for name, d in deployments.items()}
    for stateful in by_kind("StatefulSet").values():
        pods[stateful["metadata"]["name"]] = stateful["spec"]["template"]["metadata"]["labels"]
    for name, service in by_kind("Service").items():
        selector = service["spec"]["selector"]
        target = next(p for p, labels in pods.items() if selector.items() <= labels.items())
        spec = (deployments[target]["spec"] if target in deployments else
                by_kind("StatefulSet")[target]["spec"])
        named = {p["name"] for c in spec["template"]["spec"]["containers"] for p in c["ports"]}
        assert {p["targetPort"] for p in service["spec"]["ports"]} <= named, name
    assert by_kind("Service")["millm-engine"]["spec"]["clusterIP"] == "None"  # headless
    for budget in by_kind("PodDisruptionBudget").values():
        labels = budget["spec"]["selector"]["matchLabels"]
        assert any(labels.items() <= p.items() for p in pods.values())
    hpa = by_kind("HorizontalPodAutoscaler")["millm-engine"]
    assert hpa["spec"]["scaleTargetRef"]["name"] in deployments
    metric = hpa["spec"]["metrics"][0]["pods"]["metric"]["name"]
    assert f'"{metric}"' in (ROOT / "service" / "metrics.py").read_text()


def test_secrets_hold_what_is_referenced():
    secrets = {name: s["stringData"] for name, s in by_kind("Secret").items()}
    for name in ("millm-engine", "millm-bridge"):
        spec = by_kind("Deployment")[name]["spec"]["template"]["spec"]
        for v in spec.get("volumes", []):
            if "secret" in v:
                assert v["secret"]["secretName"] in secrets
        for e in spec["containers"][0].get("env", []):
            ref = e.get("valueFrom", {}).get("secretKeyRef")
            if ref:
                assert ref["key"] in secrets[ref["name"]]
        keys_file = env(spec["containers"][0])["MILLM_API_KEYS_FILE"]["value"]
        mount = next(m for m in spec["containers"][0]["volumeMounts"]
                     if keys_file.startswith(m["mountPath"] + "/"))
        assert keys_file.rsplit("/", 1)[1] in secrets["millm-api-keys"]
        assert mount["readOnly"] is True
    assert secrets["millm-database"]["url"].startswith("postgresql://")


def test_the_containerfile_builds_one_image_for_both_commands():
    text = (ROOT / "deploy" / "Containerfile").read_text()
    assert 'CMD ["python", "-m", "service"]' in text
    exposed = set(re.search(r"^EXPOSE (.+)$", text, re.M).group(1).split())
    assert exposed == {"50051", "9464", "8000"}
    assert re.search(r"^USER \d+", text, re.M)
