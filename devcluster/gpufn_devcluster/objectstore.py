"""A real S3-compatible object store on this machine: SeaweedFS (`weed server` with its S3
gateway) as one process bound to 127.0.0.1, for tables on object storage.

The `weed` binary comes from `tools/k8s/build.sh` beside the control plane (built from the
pinned Go module). SeaweedFS answers conditional writes (`If-None-Match: *`), so Lance commits
and the engine's leases are as safe on it as on AWS S3.
"""

from __future__ import annotations

import json
import secrets
import shutil
import tempfile
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from .processes import free_port, retry_port_clash, spawn, stop_all, wait_ready

REGION = "us-east-1"


@dataclass
class ObjectStore:
    """A running SeaweedFS with one bucket; use as a context manager or call start()/stop().

    `storage_options` are what Lance, lancedb and `LanceDBResource` take; `environment` is the
    same as the `AWS_*` variables a pod would get from a Secret.
    """

    bin_dir: Path
    bucket: str = "gpufn"
    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="gpufn-s3-")))
    access_key: str = field(default_factory=lambda: "gpufn" + secrets.token_hex(4))
    secret_key: str = field(default_factory=lambda: secrets.token_hex(16))
    processes: dict = field(default_factory=dict)
    port: int = 0

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def storage_options(self) -> dict[str, str]:
        return {"aws_endpoint": self.endpoint, "aws_access_key_id": self.access_key,
                "aws_secret_access_key": self.secret_key, "aws_region": REGION, "allow_http": "true"}

    @property
    def environment(self) -> dict[str, str]:
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": self.access_key,
                "AWS_SECRET_ACCESS_KEY": self.secret_key, "AWS_REGION": REGION, "AWS_ALLOW_HTTP": "true"}

    def uri(self, folder: str) -> str:
        """`s3://<bucket>/<folder>`: a LanceDB database of its own."""
        return f"s3://{self.bucket}/{folder.strip('/')}"

    def __enter__(self) -> ObjectStore:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, timeout: float = 90.0) -> None:
        """Start SeaweedFS (master, volume, filer and S3 gateway in one process) and create the bucket;
        on new ports when one was taken before SeaweedFS bound it."""
        config = self.workdir / "s3.json"
        config.write_text(json.dumps({"identities": [{
            "name": "gpufn", "credentials": [{"accessKey": self.access_key, "secretKey": self.secret_key}],
            "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}))
        retry_port_clash(lambda: self._launch(config, timeout), self._clean, "SeaweedFS")

    def _launch(self, config: Path, timeout: float) -> None:
        (self.workdir / "data").mkdir(parents=True, exist_ok=True)
        ports = {name: free_port() for name in ("master", "volume", "filer", "s3")}
        grpc = {name: free_port() for name in ports}
        self.port = ports["s3"]
        args = [f"-dir={self.workdir / 'data'}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1", "-filer", "-s3",
                "-s3.autoCreateBucket", "-s3.port.iceberg=0", "-s3.port.lance=0", f"-s3.config={config}", "-master.volumeSizeLimitMB=64",
                "-volume.max=0", "-metricsPort=0"]
        for name in ports:
            args += [f"-{name}.port={ports[name]}", f"-{name}.port.grpc={grpc[name]}"]
        self.processes["weed"] = spawn(self.bin_dir / "weed", ["server", *args], self.workdir / "weed.log",
                                       self.workdir)
        wait_ready(f"SeaweedFS (S3 on {self.endpoint})", self.processes["weed"], self._bucket_ready,
                   self.workdir / "weed.log", timeout, poll=0.3)

    def _clean(self) -> None:
        """What a failed start left: its process and its data (the next start begins empty)."""
        stop_all(self.processes)
        self.processes.clear()
        shutil.rmtree(self.workdir / "data", ignore_errors=True)
        (self.workdir / "weed.log").unlink(missing_ok=True)

    def _bucket_ready(self) -> bool:
        """Create the bucket (idempotent); True once the S3 gateway and its filer answer."""
        from obstore.store import S3Store
        import obstore

        try:
            urllib.request.urlopen(f"{self.endpoint}/", timeout=2)
        except urllib.error.HTTPError:
            pass  # 403 to an anonymous request: the gateway is up
        except OSError:
            return False
        store = S3Store(self.bucket, config={k: v for k, v in self.storage_options.items() if k != "allow_http"},
                        client_options={"allow_http": True})
        try:
            obstore.put(store, ".gpufn-ready", b"")
            return True
        except Exception:  # noqa: BLE001 - the filer or volume server is still starting
            return False

    def stop(self) -> None:
        stop_all(self.processes)
        self.processes.clear()
        shutil.rmtree(self.workdir, ignore_errors=True)
