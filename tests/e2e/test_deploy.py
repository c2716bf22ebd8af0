"""The Kubernetes manifests (deploy/kubernetes/, issue 20), rendered with the machine's
`kubectl kustomize` (kustomize v5): the objects the issue lists, probes and security settings
on the kvroute Deployment, RBAC limited to reading EndpointSlices, and the ConfigMap's
kvroute.yaml accepted by `kvroute --check`."""
import shutil
import subprocess

import pytest
import yaml

from conftest import KVROUTE_BIN, REPO

DEPLOY = REPO / "deploy" / "kubernetes"


@pytest.fixture(scope="module")
def rendered():
    kubectl = shutil.which("kubectl")
    assert kubectl, "kubectl is not installed (scripts/install-deps.sh)"
    p = subprocess.run([kubectl, "kustomize", str(DEPLOY)], capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0, p.stderr
    docs = [d for d in yaml.safe_load_all(p.stdout) if d]
    return docs


def objs(docs, kind):
    return [d for d in docs if d["kind"] == kind]


def one(docs, kind, name=None):
    found = [d for d in objs(docs, kind) if name is None or d["metadata"]["name"] == name]
    assert len(found) == 1, "%s %s: %d found" % (kind, name, len(found))
    return found[0]


def test_objects_present(rendered):
    kinds = sorted((d["kind"], d["metadata"]["name"]) for d in rendered)
    for kind, name in [("Deployment", "kvroute"), ("Service", "kvroute"),
                       ("PodDisruptionBudget", "kvroute"), ("ServiceAccount", "kvroute"),
                       ("Role", None), ("RoleBinding", None), ("ConfigMap", None),
                       ("Deployment", "kvroute-redis"), ("Service", "kvroute-redis")]:
        assert any(k == kind and (name is None or n == name) for k, n in kinds), (kind, name,
                                                                                  kinds)
    # the worker-side example is commented out, not rendered
    assert not any(d["metadata"]["name"] == "vllm" for d in rendered)
    text = (DEPLOY / "vllm-example.yaml").read_text()
    assert "--kv-events-config" in text
    assert all(not ln.strip() or ln.lstrip().startswith("#") for ln in text.splitlines())


def test_kvroute_deployment(rendered):
    d = one(rendered, "Deployment", "kvroute")
    assert d["spec"]["replicas"] >= 2
    pod = d["spec"]["template"]["spec"]
    c = next(c for c in pod["containers"] if c["name"] == "kvroute")
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert c["resources"]["requests"]["cpu"] and c["resources"]["requests"]["memory"]
    assert "preStop" in c["lifecycle"]
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["serviceAccountName"] == "kvroute"
    # the grace period covers the preStop sleep, the shutdown delay and the drain timeout
    cm = one(rendered, "ConfigMap")
    cfg = yaml.safe_load(cm["data"]["kvroute.yaml"])
    pre = int(c["lifecycle"]["preStop"]["exec"]["command"][-1])
    need = pre + cfg.get("shutdown_delay_ms", 5000) / 1000 + cfg.get("drain_timeout", 30)
    assert pod["terminationGracePeriodSeconds"] > need, (pod["terminationGracePeriodSeconds"],
                                                         need)
    # the config volume is the generated ConfigMap
    vol = next(v for v in pod["volumes"] if v["name"] == "config")
    assert vol["configMap"]["name"] == cm["metadata"]["name"]
    assert "/etc/kvroute/kvroute.yaml" in c["args"]
    # the Service reaches these pods, the PDB covers them
    sel = d["spec"]["selector"]["matchLabels"]
    assert one(rendered, "Service", "kvroute")["spec"]["selector"] == sel
    assert one(rendered, "PodDisruptionBudget")["spec"]["selector"]["matchLabels"] == sel


def test_role_reads_endpointslices_only(rendered):
    role = one(rendered, "Role")
    assert role["rules"] == [{"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"],
                              "verbs": ["get", "list", "watch"]}], role["rules"]
    assert not objs(rendered, "ClusterRole") and not objs(rendered, "ClusterRoleBinding")
    rb = one(rendered, "RoleBinding")
    assert rb["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                             "name": role["metadata"]["name"]}
    sa = one(rendered, "ServiceAccount")
    assert rb["subjects"] == [{"kind": "ServiceAccount", "name": sa["metadata"]["name"],
                               "namespace": sa["metadata"]["namespace"]}]


def test_configmap_config_passes_check(rendered, tmp_path):
    cm = one(rendered, "ConfigMap")
    text = cm["data"]["kvroute.yaml"]
    cfg = yaml.safe_load(text)
    assert cfg["discovery"]["kubernetes"]["service"]
    # the replicas share state through the manifests' Redis Service
    redis = one(rendered, "Service", "kvroute-redis")
    port = redis["spec"]["ports"][0]["port"]
    assert cfg["redis"]["url"] == f"redis://kvroute-redis:{port}"
    f = tmp_path / "kvroute.yaml"
    f.write_text(text)
    p = subprocess.run([str(KVROUTE_BIN), "--check", "--config", str(f)], capture_output=True,
                       text=True, timeout=10)
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.startswith("ok"), p.stdout


def test_redis_service_matches_deployment(rendered):
    d = one(rendered, "Deployment", "kvroute-redis")
    s = one(rendered, "Service", "kvroute-redis")
    assert s["spec"]["selector"] == d["spec"]["selector"]["matchLabels"]
    assert s["spec"]["ports"][0]["port"] == 6379
