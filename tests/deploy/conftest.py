"""The secured server's fixtures, for every test here (tests/deploy/secure_cluster.py)."""

from tests.deploy.secure_cluster import server, tls

__all__ = ["server", "tls"]
