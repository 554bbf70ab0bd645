"""roll-view RUN_DIR [--port N]: serve the run's traces on http://127.0.0.1:PORT/ until Ctrl-C.

A path that is not a run directory: one line on stderr naming what is wrong, exit 2.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from roll_lite.viewer.runs import NotARunDirectory, check_run_directory
from roll_lite.viewer.server import serve


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="roll-view", description="Browse a run's per-sample traces in a web page.")
    parser.add_argument("run_dir", type=Path, help="the run directory, e.g. outputs/<run_name>")
    parser.add_argument("--port", type=int, default=0, help="the port on 127.0.0.1 (default: a free one)")
    args = parser.parse_args(argv)
    try:
        check_run_directory(args.run_dir)
        server = serve(args.run_dir, args.port)
    except NotARunDirectory as error:
        print(f"roll-view: {error}", file=sys.stderr)
        return 2
    except OSError as error:  # the port is taken, say
        print(f"roll-view: cannot listen on 127.0.0.1:{args.port}: {error.strerror or error}", file=sys.stderr)
        return 2
    print(f"roll-view: {args.run_dir} on http://127.0.0.1:{server.server_port}/ (Ctrl-C stops)", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
