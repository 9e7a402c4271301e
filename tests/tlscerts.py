"""Certificates for the tests' TLS stand-ins, made in the test run (the `cryptography` package, which moto already
needs): a CA and server certificates it signs for a given name, each as PEM. EC P-256 keys: milliseconds to make."""

from __future__ import annotations

import base64
import datetime
import ipaddress
import ssl
import tempfile
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

_PRIVATE = serialization.PrivateFormat.PKCS8
_PEM = serialization.Encoding.PEM


@dataclass(frozen=True)
class Authority:
    name: str
    key: ec.EllipticCurvePrivateKey
    cert: x509.Certificate

    @property
    def pem(self) -> str:
        return self.cert.public_bytes(_PEM).decode()

    @property
    def ca_data(self) -> str:
        """As DescribeCluster's certificateAuthority.data: the CA's PEM, base64."""
        return base64.b64encode(self.pem.encode()).decode()


def _builder(subject: str, issuer: str, key: ec.EllipticCurvePrivateKey) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
            .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)]))
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1)))


def authority(name: str) -> Authority:
    """A self-signed CA, like the one EKS makes for each cluster (CN kubernetes)."""
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (_builder(name, name, key)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
            .sign(key, hashes.SHA256()))
    return Authority(name, key, cert)


def server_context(ca: Authority, names: list[str]) -> ssl.SSLContext:
    """A server-side SSLContext holding a certificate `ca` signed for `names` (IP addresses or DNS names)."""
    key = ec.generate_private_key(ec.SECP256R1())
    alt = [x509.IPAddress(ipaddress.ip_address(n)) if n[0].isdigit() else x509.DNSName(n) for n in names]
    cert = (_builder(names[0], ca.name, key)
            .add_extension(x509.SubjectAlternativeName(alt), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .sign(ca.key, hashes.SHA256()))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    with tempfile.TemporaryDirectory() as folder:  # load_cert_chain reads files only
        chain, secret = Path(folder) / "server.pem", Path(folder) / "server.key"
        chain.write_bytes(cert.public_bytes(_PEM))
        secret.write_bytes(key.private_bytes(_PEM, _PRIVATE, serialization.NoEncryption()))
        context.load_cert_chain(chain, secret)
    return context
