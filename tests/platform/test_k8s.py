"""deploy/k8s: every manifest parses; kustomizations name files that exist; each service Deployment has a Service on
its port, /healthz probes and the ConfigMap's environment; the ConfigMap's keys are Settings fields; the dev overlay
resolves every Secret/ConfigMap/PVC a pod refers to. Pure YAML (no kubectl needed)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from scripts.cluster import ALEMBIC_INI, CELERY_APP
from services.cli import build_parser
from shared import DEFAULT_PORTS, SERVICES
from shared.settings import Settings

K8S = Path(__file__).resolve().parents[2] / "deploy" / "k8s"
BASE = K8S / "base"
DEV = K8S / "overlays" / "dev"
CONFIGMAP = "tasmoe-config"

Doc = dict[str, Any]


def _load(path: Path) -> list[Doc]:
    return [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d is not None]


def _kustomization(directory: Path) -> Doc:
    (doc,) = _load(directory / "kustomization.yaml")
    assert doc["kind"] == "Kustomization", directory
    return doc


def build(directory: Path) -> list[Doc]:
    """The resources a kustomization lists (recursively), with the overlay's namespace, generated Secrets and
    patch targets checked. Patches are not applied: the base manifests are what the assertions look at."""
    kust = _kustomization(directory)
    docs: list[Doc] = []
    for entry in kust.get("resources", []):
        target = (directory / entry).resolve()
        assert target.exists(), f"{directory / 'kustomization.yaml'}: resource {entry} does not exist"
        docs += build(target) if target.is_dir() else _load(target)
    for gen in kust.get("secretGenerator", []):
        data = dict(lit.split("=", 1) for lit in gen.get("literals", []))
        for f in gen.get("files", []):  # key = file name (kustomize's rule for a plain entry)
            name, _, rel = f.partition("=") if "=" in f else (Path(f).name, "", f)
            src = directory / (rel or f)
            assert src.is_file(), f"{directory}: secretGenerator file {f} does not exist"
            data[name] = src.read_text(encoding="utf-8")
        docs.append({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": gen["name"]}, "stringData": data})
    for patch in kust.get("patches", []):
        path = directory / patch["path"]
        assert path.is_file(), f"{directory}: patch {patch['path']} does not exist"
        target = patch.get("target")
        if target is None:  # strategic merge: the patch names its target
            (pdoc,) = _load(path)
            key = (pdoc["kind"], pdoc["metadata"]["name"])
        else:
            key = (target["kind"], target.get("name"))
        matches = [d for d in docs if d["kind"] == key[0] and key[1] in {None, d["metadata"]["name"]}]
        assert matches, f"{directory}: patch {patch['path']} matches no resource {key}"
    if "namespace" in kust:
        docs = [{**d, "metadata": {**d["metadata"], "namespace": kust["namespace"]}} for d in docs]
    return docs


def _by(docs: list[Doc], kind: str) -> dict[str, Doc]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def _pod(doc: Doc) -> Doc:
    pod: Doc = doc["spec"]["template"]["spec"]
    return pod


def _app_pods(docs: list[Doc]) -> dict[str, Doc]:
    out = {f"Deployment/{n}": _pod(d) for n, d in _by(docs, "Deployment").items() if n in {*SERVICES, "worker"}}
    out.update({f"Job/{n}": _pod(d) for n, d in _by(docs, "Job").items()})
    return out


@pytest.fixture(scope="module")
def base() -> list[Doc]:
    return build(BASE)


def test_every_manifest_parses_and_is_listed() -> None:
    listed: set[Path] = set()
    for kfile in K8S.rglob("kustomization.yaml"):
        kust = _kustomization(kfile.parent)
        listed |= {(kfile.parent / r).resolve() for r in kust.get("resources", [])}
        listed |= {(kfile.parent / p["path"]).resolve() for p in kust.get("patches", [])}
    for path in sorted(K8S.rglob("*.yaml")):
        docs = _load(path)
        assert docs, f"{path} is empty"
        if path.name != "kustomization.yaml":
            assert path.resolve() in listed, f"{path.relative_to(K8S)} is not referenced by any kustomization"


@pytest.mark.parametrize("name", SERVICES)
def test_service_deployment_and_service(base: list[Doc], name: str) -> None:
    dep, svc = _by(base, "Deployment")[name], _by(base, "Service")[name]
    port = DEFAULT_PORTS[name]
    labels = dep["spec"]["template"]["metadata"]["labels"]
    assert dep["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert svc["spec"]["selector"].items() <= labels.items(), f"Service {name} does not select its pods"

    (container,) = _pod(dep)["containers"]
    args = build_parser().parse_args(container["command"][1:])
    assert container["command"][0] == "tasmoe"
    assert (args.command, args.service, args.host, args.port) == ("serve", name, "0.0.0.0", port)
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert port in ports.values()

    (sport,) = svc["spec"]["ports"]
    assert sport["port"] == port
    target = sport["targetPort"]
    assert (ports.get(target) if isinstance(target, str) else target) == port

    for probe in ("readinessProbe", "livenessProbe"):
        get = container[probe]["httpGet"]
        assert get["path"] == "/healthz", f"{name} {probe}"
        assert (ports.get(get["port"]) if isinstance(get["port"], str) else get["port"]) == port
    assert container["image"] == "tasmoe"
    assert container["resources"]["requests"] and container["resources"]["limits"]


@pytest.mark.parametrize("name", ["thermal", "lowering", "placement"])
def test_services_keeping_window_states_pin_each_client_to_one_replica(base: list[Doc], name: str) -> None:
    """A run names its thermal, physical and replica states by hash; they live in the replica that answered them."""
    assert _by(base, "Service")[name]["spec"].get("sessionAffinity") == "ClientIP"


def test_app_pods_take_env_from_the_configmap_and_run_as_non_root(base: list[Doc]) -> None:
    pods = _app_pods(base)
    assert set(pods) == {*(f"Deployment/{n}" for n in [*SERVICES, "worker"]), "Job/tasmoe-migrate"}
    for where, pod in pods.items():
        assert pod["securityContext"]["runAsNonRoot"] is True, where
        for c in pod["containers"]:
            refs = [e.get("configMapRef", {}).get("name") for e in c.get("envFrom", [])]
            assert CONFIGMAP in refs, f"{where}: no envFrom configMapRef {CONFIGMAP}"


def test_configmap_keys_are_settings_fields_and_urls_name_the_services(base: list[Doc]) -> None:
    data = _by(base, "ConfigMap")[CONFIGMAP]["data"]
    bad = sorted(k for k in data if not k.startswith("TASMOE_") or k[7:].lower() not in Settings.model_fields)
    assert not bad, f"ConfigMap keys that are not Settings fields: {bad}"
    settings = Settings.model_validate({k[7:].lower(): v for k, v in data.items()})
    assert settings.mode == "cluster"
    for name in SERVICES:
        assert settings.service_url(name) == f"http://{name}:{DEFAULT_PORTS[name]}"
    assert "TASMOE_DATABASE_URL" not in data  # the password lives in the Secret


def test_worker_and_migration(base: list[Doc]) -> None:
    (worker,) = _pod(_by(base, "Deployment")["worker"])["containers"]
    assert worker["command"][:4] == ["celery", "-A", CELERY_APP, "worker"]
    assert "inspect ping" in " ".join(worker["livenessProbe"]["exec"]["command"])
    job = _by(base, "Job")["tasmoe-migrate"]
    (mig,) = _pod(job)["containers"]
    assert mig["command"] == ["alembic", "-c", ALEMBIC_INI.as_posix(), "upgrade", "head"]
    assert _pod(job)["restartPolicy"] in {"OnFailure", "Never"}


def test_base_images_are_set_by_the_kustomization() -> None:
    images = {i["name"] for i in _kustomization(BASE).get("images", [])}
    assert images == {"tasmoe"}


def test_dev_overlay_resolves_every_reference() -> None:
    docs = build(DEV)
    kust = _kustomization(DEV)
    assert "../../base" in kust["resources"]
    namespace = kust["namespace"]
    assert all(d["metadata"].get("namespace") == namespace for d in docs)
    assert namespace in _by(docs, "Namespace")
    secrets, configmaps, pvcs = _by(docs, "Secret"), _by(docs, "ConfigMap"), _by(docs, "PersistentVolumeClaim")
    for where, pod in _app_pods(docs).items():
        for c in pod["containers"]:
            for e in c.get("envFrom", []):
                if "secretRef" in e:
                    assert e["secretRef"]["name"] in secrets, f"{where}: Secret {e['secretRef']['name']} missing"
                if "configMapRef" in e:
                    assert e["configMapRef"]["name"] in configmaps, where
        for vol in pod.get("volumes", []):
            if "persistentVolumeClaim" in vol:
                assert vol["persistentVolumeClaim"]["claimName"] in pvcs, where
    # the generated database URL is a valid setting pointing at the in-namespace PostgreSQL Service
    url = secrets["tasmoe-database"]["stringData"]["TASMOE_DATABASE_URL"]
    assert Settings.model_validate({"database_url": url}).effective_database_url.startswith(
        "postgresql+psycopg://")
    host = url.split("@", 1)[1].split(":", 1)[0]
    assert host in _by(docs, "Service")
    redis_host = configmaps[CONFIGMAP]["data"]["TASMOE_REDIS_URL"].split("//", 1)[1].split(":", 1)[0]
    assert redis_host in _by(docs, "Service")


def test_dev_overlay_patches_change_replicas_and_config() -> None:
    kust = _kustomization(DEV)
    ops: dict[str, Any] = {}
    for patch in kust["patches"]:
        for doc in _load(DEV / patch["path"]):
            if isinstance(doc, list):
                ops.update({op["path"]: op["value"] for op in doc})
            elif doc["kind"] == "ConfigMap":
                bad = sorted(k for k in doc["data"] if k[7:].lower() not in Settings.model_fields)
                assert not bad, f"dev ConfigMap patch keys that are not Settings fields: {bad}"
                Settings.model_validate({k[7:].lower(): v for k, v in doc["data"].items()})
    assert ops["/spec/replicas"] == 1
    assert "requests" in ops["/spec/template/spec/containers/0/resources"]


def test_base_holds_no_credentials() -> None:
    for path in BASE.rglob("*.yaml"):
        text = path.read_text(encoding="utf-8")
        assert not re.search(r"://[^/\s:@]+:[^/\s@]+@", text), f"{path}: a URL with a password"
        assert "kind: Secret" not in text, f"{path}: Secrets come from the overlay or the operator"


def test_api_keys_come_from_secrets_and_the_dev_service_key_verifies(base: list[Doc], tmp_path: Path) -> None:
    """Issue 17: the pods run with TASMOE_AUTH=keys, read the key file from the Secret `tasmoe-keys` and present the
    service key of the Secret `tasmoe-service-key`; in the dev overlay that key is one the key file accepts."""
    from shared.auth import KeyStore

    data = _by(base, "ConfigMap")[CONFIGMAP]["data"]
    assert data["TASMOE_AUTH"] == "keys"
    keys_file = Path(data["TASMOE_KEYS_FILE"])
    for where, pod in _app_pods(base).items():
        if where.startswith("Job/"):
            continue  # the migration serves nothing
        (c,) = pod["containers"]
        assert "tasmoe-service-key" in [e.get("secretRef", {}).get("name") for e in c.get("envFrom", [])], where
        vols = {v["name"]: v for v in pod.get("volumes", [])}
        mounts = {m["name"]: m for m in c.get("volumeMounts", [])}
        assert vols["keys"]["secret"]["secretName"] == "tasmoe-keys", where
        assert Path(mounts["keys"]["mountPath"]) == keys_file.parent and mounts["keys"]["readOnly"], where
    docs = build(DEV)
    secrets = _by(docs, "Secret")
    service_key = secrets["tasmoe-service-key"]["stringData"]["TASMOE_SERVICE_KEY"]
    (tmp_path / "keys.json").write_text(secrets["tasmoe-keys"]["stringData"]["keys.json"])
    who = KeyStore(tmp_path / "keys.json").verify(service_key)
    assert who is not None and who.admin
