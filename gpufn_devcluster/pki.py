"""Certificates for the development control plane, generated at each start (nothing is kept).

One CA, one admin certificate (O=system:masters, valid for 127.0.0.1/localhost, used both as
the apiserver's serving certificate and as client identity for the controllers) and one
service-account signing key -- the same shape kwokctl uses.
"""

from __future__ import annotations

import datetime
import ipaddress
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


def _key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def _write_key(key: rsa.RSAPrivateKey, path: Path) -> None:
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL,
                                       serialization.NoEncryption()))


def write_pki(directory: Path) -> dict[str, Path]:
    """Write ca.crt, admin.crt/admin.key and sa.key/sa.pub; returns their paths by name."""
    directory.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.timezone.utc)
    valid = (now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=7))

    ca_key = _key()
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gpufn-devcluster-ca")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(valid[0]).not_valid_after(valid[1])
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .sign(ca_key, hashes.SHA256()))

    admin_key = _key()
    admin = (x509.CertificateBuilder()
             .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gpufn-admin"),
                                      x509.NameAttribute(NameOID.ORGANIZATION_NAME, "system:masters")]))
             .issuer_name(ca_name).public_key(admin_key.public_key()).serial_number(x509.random_serial_number())
             .not_valid_before(valid[0]).not_valid_after(valid[1])
             .add_extension(x509.SubjectAlternativeName([
                 x509.DNSName("localhost"), x509.DNSName("kubernetes"), x509.DNSName("kubernetes.default.svc"),
                 x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
             .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                            critical=False)
             .sign(ca_key, hashes.SHA256()))

    sa_key = _key()
    paths = {name: directory / name for name in ("ca.crt", "admin.crt", "admin.key", "sa.key", "sa.pub")}
    paths["ca.crt"].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths["admin.crt"].write_bytes(admin.public_bytes(serialization.Encoding.PEM))
    _write_key(admin_key, paths["admin.key"])
    _write_key(sa_key, paths["sa.key"])
    paths["sa.pub"].write_bytes(sa_key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    return paths
