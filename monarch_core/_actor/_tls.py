"""TLS credentials given as API arguments (``ca=``, ``private_key=``, ``cert=``).

They are handed to the transport plugin through the ``MONARCH_TLS_*``
environment variables, which procs started from this process inherit.
"""

from __future__ import annotations

import os

TRUST_ALL = "trust_all_connections"


def apply_credentials(scheme: str, *, ca: str | None, private_key: str | None, cert: str | None) -> None:
    """Validate and install credentials for ``scheme`` (``tls`` needs them)."""
    if ca == TRUST_ALL:
        if scheme == "tls":
            raise ValueError(
                "ca='trust_all_connections' turns authentication off, which a tls:// address cannot do; "
                "pass the CA certificate that signed the peers' certificates (ca='ca.pem'), or use tcp://"
            )
        ca = None
    for value, var in ((ca, "MONARCH_TLS_CA"), (private_key, "MONARCH_TLS_KEY"), (cert, "MONARCH_TLS_CERT")):
        if value is None:
            continue
        if not isinstance(value, str) or not value:
            raise TypeError(f"{var.split('_')[-1].lower()} must be a file path or inline PEM (str), got {value!r}")
        if "-----BEGIN" not in value and not os.path.exists(value):
            raise FileNotFoundError(f"{var}: {value!r} is neither inline PEM nor an existing file")
        os.environ[var] = os.path.abspath(value) if "-----BEGIN" not in value else value
