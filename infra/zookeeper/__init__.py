"""Real ZooKeeper 3.8 as local processes (one server or an ensemble): the library is
`server.py`, the command line `__main__.py`."""

from infra.zookeeper.server import (
    ZooKeeperEnsemble,
    ZooKeeperError,
    ZooKeeperServer,
    four_letter,
    free_ports,
)

__all__ = ["ZooKeeperEnsemble", "ZooKeeperError", "ZooKeeperServer", "four_letter",
           "free_ports"]
