"""roll-view's web server: the page (static/, shipped in the package: nothing is fetched from the
internet) and a small JSON API over the run's traces, on the standard library's ThreadingHTTPServer,
bound to loopback only.

    GET /api/run                      the run: its readable steps, the problems, the filters' choices
    GET /api/samples?step=&outcome=&domain=&reward_min=&reward_max=&staleness_min=&gap_min=&prompt_key=
                                      the samples' summaries that pass the filters (step: a number or all)
    GET /api/sample?step=N&sample=I   one sample, turn by turn, each token with its values
"""

from __future__ import annotations

import json
import mimetypes
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from roll_lite.viewer.runs import Filters, TraceFolder, clean
from roll_lite.viewer.tokens import TokenTexts
from roll_lite.viewer.trajectory import trajectory

STATIC = resources.files("roll_lite.viewer") / "static"
LIMIT = 500  # summaries per answer: the page says how many more passed the filters


class Viewer:
    """What the API answers, apart from HTTP (the tests call it directly too)."""

    def __init__(self, run_dir: Path):
        self.run_dir = Path(run_dir)
        self.traces = TraceFolder(self.run_dir)
        self.tokens = TokenTexts(self.run_dir)

    def run(self) -> dict[str, Any]:
        files = self.scan()
        readable = [f for f in files if f.error is None]
        problems = [f.error for f in files if f.error]
        problems += [
            f"step {f.step}: its trace has no column(s) {', '.join(f.missing)} (written by an older roll_lite?): "
            "those filters and colours are off for it"
            for f in readable
            if f.missing
        ]
        message = None
        if not files:
            message = (
                f"no traces yet: {self.traces.folder} has no step_NNNNNN.parquet file (trace.samples_per_step: 0?)"
            )
            message += "; the page looks again every few seconds"
        elif not readable:
            message = "no step's trace reads yet: see the problems below"
        summaries = [s for f in readable for s in f.summaries]
        return {
            "run": self.run_dir.name,
            "path": str(self.run_dir),
            "steps": [{"step": f.step, "samples": len(f.summaries)} for f in readable],
            "message": message,
            "problems": problems,
            "outcomes": sorted({o for s in summaries for o in s["outcomes"]}),
            "domains": sorted({d for s in summaries for d in s["domains"]}),
        }

    def samples(self, query: dict[str, str]) -> dict[str, Any]:
        filters = Filters.from_query(query)
        files = [f for f in self.scan() if f.error is None and filters.step in (None, f.step)]
        if filters.step is not None and not files:
            raise LookupError(f"step {filters.step} has no readable trace")
        passed = [s for f in files for s in f.summaries if filters.keep(s)]
        total = sum(len(f.summaries) for f in files)
        return {"rows": passed[:LIMIT], "passed": len(passed), "total": total}

    def sample(self, query: dict[str, str]) -> dict[str, Any]:
        try:
            step, sample = int(query.get("step", "")), int(query.get("sample", ""))
        except ValueError:
            raise ValueError("step and sample: give both as whole numbers") from None
        return trajectory(self.traces.row(step, sample), step, self.tokens)

    def scan(self):
        return self.traces.scan()


def handler_for(viewer: Viewer) -> type[BaseHTTPRequestHandler]:
    routes = {"/api/run": lambda query: viewer.run(), "/api/samples": viewer.samples, "/api/sample": viewer.sample}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            url = urlsplit(self.path)
            if url.path in routes:
                try:
                    answer, status = routes[url.path](dict(parse_qsl(url.query))), HTTPStatus.OK
                except (ValueError, LookupError) as error:
                    answer, status = {"error": str(error)}, HTTPStatus.BAD_REQUEST
                self.send(status, json.dumps(clean(answer), allow_nan=False, default=str).encode(), "application/json")
                return
            name = "index.html" if url.path == "/" else url.path.removeprefix("/static/")
            file = STATIC / name
            if "/" in name or not file.is_file():
                self.send(HTTPStatus.NOT_FOUND, f"no such page: {url.path}".encode(), "text/plain")
                return
            self.send(HTTPStatus.OK, file.read_bytes(), mimetypes.guess_type(name)[0] or "text/plain")

        def send(self, status: HTTPStatus, body: bytes, kind: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", f"{kind}; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # quiet: one line per request is noise
            pass

    return Handler


def serve(run_dir: Path, port: int = 0) -> ThreadingHTTPServer:
    """A server for run_dir on 127.0.0.1 (port 0: a free one); call serve_forever() on it."""
    server = ThreadingHTTPServer(("127.0.0.1", port), handler_for(Viewer(run_dir)))
    server.daemon_threads = True
    return server
