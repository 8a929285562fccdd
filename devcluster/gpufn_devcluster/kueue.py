"""A real Kueue for the test control plane: the controller built by tools/k8s/build.sh from its
pinned Go module, its CRDs, their conversion webhooks and its webhook configuration copied from
the same module.

Kueue runs as a process beside the API server, as the other components do, and manages its own
certificates as in a real install (`internalCertManagement`): it reads its CA and serving
certificate from the `kueue-webhook-server-cert` Secret and injects the CA into its webhook
configurations and CRDs. This control plane has no service network, so the API server reaches
the webhooks by URL on 127.0.0.1; the Secret is therefore made here beforehand, with a serving
certificate valid for 127.0.0.1 as well as for the Service name Kueue checks. Only the webhooks
of what Kueue serves here are registered -- its own objects and batch Jobs -- and the Job
webhooks only in namespaces labelled `gpufn.dev/kueue=true`, so a stopped Kueue cannot refuse the
Jobs of every other test. The visibility API is off: it wants a fixed certificate directory
(/visibility) and an aggregated-API setup this control plane does not have; positions in a
ClusterQueue are read from the Workloads instead (see `gpufn_dagster.run.kueue`).
"""

from __future__ import annotations

import base64
import re
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .cluster import DevCluster
from .pki import webhook_pki
from .processes import ClusterError, free_port, spawn, stop_all, wait_ready

KUEUE_NAMESPACE_LABEL = "gpufn.dev/kueue"
_SERVED_GROUPS = {"kueue.x-k8s.io", "batch"}  # the webhooks of what this Kueue manages
# The names Kueue's certificate rotator injects its CA into (derived from its webhook Service's name).
_WEBHOOK_CONFIGS = {"MutatingWebhookConfiguration": "kueue-mutating-webhook-configuration",
                    "ValidatingWebhookConfiguration": "kueue-validating-webhook-configuration"}
NAMESPACE, SERVICE, SECRET = "kueue-system", "kueue-webhook-service", "kueue-webhook-server-cert"
_CONVERSION_PATCH = re.compile(r"^- path: patches/webhook_in_(\w+)\.yaml$", re.M)


def webhook_configurations(manifests: list[dict[str, Any]], port: int, ca_bundle: bytes) -> list[dict[str, Any]]:
    """Kueue's webhook configurations for a Kueue on 127.0.0.1:`port`: only the webhooks of Kueue's
    own objects and batch Jobs, reached by URL, the Job ones only in namespaces labelled for Kueue.

    >>> hooks = webhook_configurations([{"kind": "MutatingWebhookConfiguration", "webhooks": [
    ...     {"name": "mjob.kb.io", "clientConfig": {"service": {"path": "/mutate-batch-v1-job"}},
    ...      "rules": [{"apiGroups": ["batch"]}]},
    ...     {"name": "mpod.kb.io", "clientConfig": {"service": {"path": "/mutate--v1-pod"}},
    ...      "rules": [{"apiGroups": [""]}]}]}], 9443, b"PEM")
    >>> [(h["name"], h["clientConfig"]["url"], h["namespaceSelector"]) for h in hooks[0]["webhooks"]]
    [('mjob.kb.io', 'https://127.0.0.1:9443/mutate-batch-v1-job', {'matchLabels': {'gpufn.dev/kueue': 'true'}})]
    """
    configs = []
    for manifest in manifests:
        kind = manifest.get("kind")
        if kind not in _WEBHOOK_CONFIGS:
            continue
        hooks = []
        for hook in manifest.get("webhooks") or []:
            groups = {g for rule in hook.get("rules") or [] for g in rule.get("apiGroups") or []}
            if not groups or not groups <= _SERVED_GROUPS:
                continue
            path = hook["clientConfig"]["service"]["path"]
            hook = {**hook, "clientConfig": {"url": f"https://127.0.0.1:{port}{path}",
                                             "caBundle": base64.b64encode(ca_bundle).decode()}}
            if "batch" in groups:
                hook["namespaceSelector"] = {"matchLabels": {KUEUE_NAMESPACE_LABEL: "true"}}
            hooks.append(hook)
        configs.append({"apiVersion": "admissionregistration.k8s.io/v1", "kind": kind,
                        "metadata": {"name": _WEBHOOK_CONFIGS[kind]}, "webhooks": hooks})
    return configs


@dataclass
class Kueue:
    """Kueue's controller against `cluster`; use as a context manager or call start()/stop()."""

    bin_dir: Path
    cluster: DevCluster
    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="gpufn-kueue-")))
    processes: dict = field(default_factory=dict)
    ports: dict[str, int] = field(default_factory=dict)
    # DRA: quota resource -> the DeviceClasses whose devices Kueue counts as it (Kueue's deviceClassMappings).
    device_class_mappings: dict[str, list[str]] = field(default_factory=dict)

    @property
    def config_dir(self) -> Path:
        return self.bin_dir / "kueue-config"

    def __enter__(self) -> Kueue:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, timeout: float = 120.0) -> None:
        """Install the CRDs and webhook configurations, start the controller; return once its
        webhooks answer through the API server."""
        import kubernetes

        client = self.cluster.api_client()
        self.ports = {name: free_port() for name in ("webhook", "health")}
        pki = webhook_pki("kueue-ca", [f"{SERVICE}.{NAMESPACE}.svc"])  # the CA's name is the one Kueue checks
        self._install_crds(kubernetes.client.ApiextensionsV1Api(client), pki["ca.crt"], timeout)
        core = kubernetes.client.CoreV1Api(client)
        if not any(n.metadata.name == NAMESPACE for n in core.list_namespace().items):
            core.create_namespace({"metadata": {"name": NAMESPACE}})
        core.create_namespaced_secret(NAMESPACE, {"metadata": {"name": SECRET}, "type": "Opaque",
                                                 "data": {k: base64.b64encode(v).decode() for k, v in pki.items()}})
        admission = kubernetes.client.AdmissionregistrationV1Api(client)
        manifests = list(yaml.safe_load_all((self.config_dir / "webhook" / "manifests.yaml").read_text()))
        for body in webhook_configurations(manifests, self.ports["webhook"], pki["ca.crt"]):
            create = (admission.create_mutating_webhook_configuration if body["kind"].startswith("Mutating")
                      else admission.create_validating_webhook_configuration)
            create(body)
        certs = self.workdir / "certs"  # where a pod would mount the Secret; the rotator waits for the files
        certs.mkdir(parents=True, exist_ok=True)
        for name, pem in pki.items():
            (certs / name).write_bytes(pem)
        config = self.workdir / "config.yaml"
        config.write_text(yaml.safe_dump({
            "apiVersion": "config.kueue.x-k8s.io/v1beta2", "kind": "Configuration", "namespace": NAMESPACE,
            "health": {"healthProbeBindAddress": f"127.0.0.1:{self.ports['health']}"},
            "metrics": {"bindAddress": "0"},
            "webhook": {"port": self.ports["webhook"], "host": "127.0.0.1", "certDir": str(certs)},
            "leaderElection": {"leaderElect": False},
            "internalCertManagement": {"enable": True, "webhookServiceName": SERVICE, "webhookSecretName": SECRET},
            "manageJobsWithoutQueueName": False,
            "integrations": {"frameworks": ["batch/job"]},
            **({"resources": {"deviceClassMappings": [
                {"name": name, "deviceClassNames": classes} for name, classes in self.device_class_mappings.items()]}}
               if self.device_class_mappings else {}),
        }))
        log = self.workdir / "kueue.log"
        self.processes["kueue"] = spawn(self.bin_dir / "kueue", [
            f"--config={config}", f"--kubeconfig={self.cluster.kubeconfig}",
            "--feature-gates=VisibilityOnDemand=false", "--zap-log-level=info"], log, self.workdir)
        custom = kubernetes.client.CustomObjectsApi(client)
        # Ready once its webhooks answer through the API server: a dry-run ResourceFlavor passes them.
        wait_ready("kueue (its webhooks, through the API server)", self.processes["kueue"],
                   lambda: self._webhooks_answer(custom), log, timeout, poll=0.5)

    def _install_crds(self, extensions: Any, ca_bundle: bytes, timeout: float) -> None:
        """Kueue's CRDs, with the conversion webhooks its kustomization enables, served on 127.0.0.1."""
        import kubernetes

        crd_dir = self.config_dir / "crd"
        converted = set(_CONVERSION_PATCH.findall((crd_dir / "kustomization.yaml").read_text()))
        names = []
        for path in sorted((crd_dir / "bases").glob("kueue.x-k8s.io_*.yaml")):
            crd = yaml.safe_load(path.read_text())
            names.append(crd["metadata"]["name"])
            if crd["spec"]["names"]["plural"] in converted:
                crd["spec"]["conversion"] = {"strategy": "Webhook", "webhook": {
                    "conversionReviewVersions": ["v1"],
                    "clientConfig": {"url": f"https://127.0.0.1:{self.ports['webhook']}/convert",
                                     "caBundle": base64.b64encode(ca_bundle).decode()}}}
            try:
                extensions.create_custom_resource_definition(crd)
            except kubernetes.client.ApiException as err:
                if err.status != 409:
                    raise ClusterError(f"installing Kueue's CRD {path.name} failed: {err.status} {err.body[:500]}") from err
                extensions.patch_custom_resource_definition(crd["metadata"]["name"], {"spec": {"conversion": crd["spec"].get(
                    "conversion", {"strategy": "None"})}})  # installed by an earlier start: point it at this one
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            established = {c.metadata.name for c in extensions.list_custom_resource_definition().items
                           if any(x.type == "Established" and x.status == "True" for x in c.status.conditions or [])}
            if established.issuperset(names):
                return
            time.sleep(0.3)
        raise ClusterError(f"Kueue's CRDs not established after {timeout:.0f}s: {sorted(set(names) - established)}")

    def _webhooks_answer(self, custom: Any) -> bool:
        import kubernetes

        try:
            custom.create_cluster_custom_object("kueue.x-k8s.io", "v1beta2", "resourceflavors", {
                "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor",
                "metadata": {"name": "gpufn-readiness"}}, dry_run="All")
            return True
        except kubernetes.client.ApiException as err:
            if "failed calling webhook" in (err.body or ""):
                return False
            raise

    def stop(self) -> None:
        """Remove the webhook configurations first (so nothing calls a stopped webhook), then stop Kueue."""
        import kubernetes

        admission = kubernetes.client.AdmissionregistrationV1Api(self.cluster.api_client())
        for kind, name in _WEBHOOK_CONFIGS.items():
            delete = (admission.delete_mutating_webhook_configuration if kind.startswith("Mutating")
                      else admission.delete_validating_webhook_configuration)
            try:
                delete(name)
            except kubernetes.client.ApiException as err:
                if err.status != 404:
                    raise
        stop_all(self.processes)
        self.processes.clear()
        try:
            kubernetes.client.CoreV1Api(self.cluster.api_client()).delete_namespaced_secret(SECRET, NAMESPACE)
        except kubernetes.client.ApiException as err:
            if err.status != 404:
                raise


def apply_objects(cluster: DevCluster, objects: list[dict[str, Any]]) -> None:
    """Create Kueue objects (ResourceFlavor, ClusterQueue, LocalQueue, WorkloadPriorityClass) as
    `kubectl apply` of a fresh manifest would: namespaced ones in their metadata.namespace."""
    import kubernetes

    custom = kubernetes.client.CustomObjectsApi(cluster.api_client())
    plural = {"ResourceFlavor": "resourceflavors", "ClusterQueue": "clusterqueues", "LocalQueue": "localqueues",
              "WorkloadPriorityClass": "workloadpriorityclasses", "Cohort": "cohorts"}
    for body in objects:
        group, version = body["apiVersion"].split("/")
        namespace = body["metadata"].get("namespace")
        if namespace:
            custom.create_namespaced_custom_object(group, version, namespace, plural[body["kind"]], body)
        else:
            custom.create_cluster_custom_object(group, version, plural[body["kind"]], body)

