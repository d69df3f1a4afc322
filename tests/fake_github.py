"""A pull request's comments as GitHub's REST API serves them, for the GitOps example's
comment script (examples/gitops/.github/vgpuctl-comment.py): list (paged), create, update by
id, on one local HTTP server, every request recorded.

Only what the script uses, as GitHub documents it ("REST API endpoints for issue comments"):
``GET /repos/{owner}/{repo}/issues/{number}/comments?per_page=&page=`` (oldest first),
``POST`` to the same path with ``{"body"}`` (201, the comment), ``PATCH
/repos/{owner}/{repo}/issues/comments/{id}`` with ``{"body"}`` (200, the comment; 404 for an
unknown id, 403 for a comment of another user, as a token may edit only its own). A body over
65,536 characters is refused with 422 ("Body is too long (maximum is 65536 characters)"); a
request without the bearer token with 401.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

TOKEN = "ghs_test-token"  # noqa: S105 (a fake)
BOT = "github-actions[bot]"
LIMIT = 65_536


class FakeGitHub:
    def __init__(self, repo: str, number: int) -> None:
        self.repo, self.number = repo, number
        self.comments: list[dict[str, Any]] = []
        self.requests: list[tuple[str, str]] = []
        self._next = 1000
        self.url = ""

    def add(self, body: str, login: str = BOT) -> dict[str, Any]:
        self._next += 1
        comment = {"id": self._next, "body": body, "user": {"login": login}}
        self.comments.append(comment)
        return comment

    def handle(self, method: str, path: str, auth: str | None, body: Any) -> tuple[int, Any]:
        self.requests.append((method, path))
        if auth != f"Bearer {TOKEN}":
            return 401, {"message": "Bad credentials"}
        url = urlsplit(path)
        listing = f"/repos/{self.repo}/issues/{self.number}/comments"
        if url.path == listing and method == "GET":
            query = parse_qs(url.query)
            per_page = int(query.get("per_page", ["30"])[0])
            page = int(query.get("page", ["1"])[0])
            return 200, self.comments[(page - 1) * per_page : page * per_page]
        if url.path == listing and method == "POST":
            if len(body["body"]) > LIMIT:
                return 422, {"message": "Body is too long (maximum is 65536 characters)"}
            return 201, self.add(body["body"])
        match = re.fullmatch(rf"/repos/{re.escape(self.repo)}/issues/comments/(\d+)", url.path)
        if match and method == "PATCH":
            found = [c for c in self.comments if c["id"] == int(match.group(1))]
            if not found:
                return 404, {"message": "Not Found"}
            if found[0]["user"]["login"] != BOT:
                return 403, {"message": "Resource not accessible by integration"}
            if len(body["body"]) > LIMIT:
                return 422, {"message": "Body is too long (maximum is 65536 characters)"}
            found[0]["body"] = body["body"]
            return 200, found[0]
        return 404, {"message": "Not Found"}


@contextmanager
def fake_github(repo: str = "acme/fleet", number: int = 7) -> Iterator[FakeGitHub]:
    github = FakeGitHub(repo, number)

    class Handler(BaseHTTPRequestHandler):
        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            status, doc = github.handle(
                self.command,
                self.path,
                self.headers.get("Authorization"),
                json.loads(raw) if raw else None,
            )
            data = json.dumps(doc).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_PATCH = _serve

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    github.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield github
    finally:
        server.shutdown()
        server.server_close()
