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
    path.write_bytes(_pem_key(key))


def _validity(days: int = 7) -> tuple[datetime.datetime, datetime.datetime]:
    now = datetime.datetime.now(datetime.timezone.utc)
    return now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=days)


def _ca(name: str, valid: tuple[datetime.datetime, datetime.datetime]) -> tuple[rsa.RSAPrivateKey, x509.Name, x509.Certificate]:
    """A CA certificate whose subject and DNS name are `name` (a CA is checked for its DNS name too)."""
    key = _key()
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(valid[0]).not_valid_after(valid[1])
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
                                         key_encipherment=False, data_encipherment=False, key_agreement=False,
                                         encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
            .sign(key, hashes.SHA256()))
    return key, subject, cert


def _pem_key(key: rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL,
                             serialization.NoEncryption())


def webhook_pki(ca_name: str, dns_names: list[str], days: int = 365) -> dict[str, bytes]:
    """A CA named `ca_name` and a serving certificate signed by it for `dns_names`, 127.0.0.1 and
    localhost, as PEM by the key names of a webhook's certificate Secret: ca.crt, ca.key, tls.crt,
    tls.key. Valid `days` (a certificate rotator replaces one that ends within its look-ahead)."""
    valid = _validity(days)
    ca_key, ca_subject, ca = _ca(ca_name, valid)
    key = _key()
    cert = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, dns_names[0])]))
            .issuer_name(ca_subject).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(valid[0]).not_valid_after(valid[1])
            .add_extension(x509.SubjectAlternativeName([*(x509.DNSName(n) for n in [*dns_names, "localhost"]),
                                                        x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    return {"ca.crt": ca.public_bytes(serialization.Encoding.PEM), "ca.key": _pem_key(ca_key),
            "tls.crt": cert.public_bytes(serialization.Encoding.PEM), "tls.key": _pem_key(key)}


def write_pki(directory: Path) -> dict[str, Path]:
    """Write ca.crt, admin.crt/admin.key and sa.key/sa.pub; returns their paths by name."""
    directory.mkdir(parents=True, exist_ok=True)
    valid = _validity()
    ca_key, ca_name, ca = _ca("gpufn-devcluster-ca", valid)

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
