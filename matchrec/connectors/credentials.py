"""How a client and a storage node agree on who may talk: the shared token and TLS trust.

The token comes from an argument, else from a file, else from the ``MATCHREC_NODE_TOKEN``
environment variable, so it need not appear on a command line (where ``ps`` shows it). A
``grpc+tls://`` node is trusted through the system's certificate authorities, or through the
PEM file named by ``tls_root_certs`` / ``MATCHREC_NODE_TLS_ROOT_CERTS`` (a private CA or a
node's self-signed certificate). Nothing here ever prints a token.
"""
from __future__ import annotations

import os

import pyarrow.flight as fl

from matchrec.errors import OperationalError, ProgrammingError

TOKEN_ENV = "MATCHREC_NODE_TOKEN"
ROOT_CERTS_ENV = "MATCHREC_NODE_TLS_ROOT_CERTS"


def read_token_file(path: str | os.PathLike) -> str:
    """The token in ``path`` (surrounding whitespace and the final newline removed)."""
    try:
        with open(path, encoding="utf-8") as f:
            token = f.read().strip()
    except (OSError, UnicodeDecodeError) as err:
        raise ProgrammingError(f"Cannot read the token file {os.fspath(path)}: "
                               f"{getattr(err, 'strerror', None) or err}") from None
    if not token:
        raise ProgrammingError(f"The token file {os.fspath(path)} is empty")
    return token


def resolve_token(token: str | None = None, token_file: str | os.PathLike | None = None) -> str | None:
    """The token to use: ``token``, else the one in ``token_file``, else ``$MATCHREC_NODE_TOKEN``, else None."""
    if token is not None and token_file is not None:
        raise ProgrammingError("Give the token or a token file, not both")
    if token is not None:
        return token or None
    if token_file is not None:
        return read_token_file(token_file)
    return os.environ.get(TOKEN_ENV) or None


def root_certificates(tls_root_certs: str | os.PathLike | bytes | None = None) -> bytes | None:
    """PEM bytes of the certificates to trust: given as bytes or a file, else ``$MATCHREC_NODE_TLS_ROOT_CERTS``."""
    if isinstance(tls_root_certs, bytes):
        return tls_root_certs
    path = tls_root_certs if tls_root_certs is not None else os.environ.get(ROOT_CERTS_ENV)
    if not path:
        return None
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as err:
        raise ProgrammingError(f"Cannot read the TLS root certificates {os.fspath(path)}: {err.strerror}") from None


def call_headers(token: str | None) -> list[tuple[bytes, bytes]] | None:
    return [(b"authorization", f"Bearer {token}".encode())] if token else None


def connect_node(uri: str, root_certs: bytes | None) -> fl.FlightClient:
    """A Flight client for ``uri`` (``grpc://`` or ``grpc+tls://``)."""
    try:
        if root_certs is not None and uri.startswith("grpc+tls://"):
            return fl.connect(uri, tls_root_certs=root_certs)
        return fl.connect(uri)
    except Exception as err:  # noqa: BLE001 - bad URIs surface as several Arrow error types
        raise OperationalError(f"Cannot connect to storage node {uri}: {str(err).splitlines()[0][:200]}") from None


def add_client_arguments(parser) -> None:
    """--token, --token-file and --tls-root-certs of the commands that call storage nodes."""
    parser.add_argument("--token", default=None, help=f"the nodes' token (prefer --token-file or ${TOKEN_ENV})")
    parser.add_argument("--token-file", default=None, metavar="PATH", help="read the nodes' token from this file")
    parser.add_argument("--tls-root-certs", default=None, metavar="PEM",
                        help=f"trust grpc+tls:// nodes whose certificate this PEM file signs (or ${ROOT_CERTS_ENV})")
