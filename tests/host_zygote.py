"""A zygote of Ray workers (tests/warm_workers.py) for a node that a test starts: a namespace host's
(tests/ray_hosts.py), in its network, started with its node and killed with it, or a local cluster that a
test starts in its own process (tests/raylets.py forked_workers). Its node's raylet launches each Python
worker through a launcher (tests/host_launcher.py, or warm_workers.py itself) that asks it for a fork; the
workers then skip their imports (~4 s of CPU a model worker). It writes its socket's path to WRITTEN, and
waits:

    python tests/host_zygote.py WRITTEN"""

import os
import signal
import socket
import sys

import warm_driver
import warm_workers


def main(written: str) -> None:
    sys.path[0] = os.getcwd()  # not this folder: as warm_driver.py's own zygote has it
    _, theirs = socket.socketpair()
    path = warm_workers.fork_zygote(theirs, list(sys.path), dict(os.environ), warm_driver)
    with open(written + ".part", "w") as file:
        file.write(path)
    os.replace(written + ".part", written)
    signal.pause()


if __name__ == "__main__":
    main(sys.argv[1])
