"""A local Kubernetes API server for pods, following the API's documented list and watch behaviour
(https://kubernetes.io/docs/reference/using-api/api-concepts/), for discovery's tests: no real API server
runs on these machines.

What it does as the real one does:
- HTTPS (a CA of the test's own) and bearer tokens: anything else is 401 with a Status body;
- ``GET /api/v1/namespaces/NS/pods`` and ``/api/v1/pods``: ``labelSelector`` (equality and set-based), ``limit`` and
  ``continue`` (pages of one snapshot; a continue token older than the compaction is ``410 Gone``), the list's
  ``metadata.resourceVersion``;
- ``?watch=1``: a chunked stream of JSON lines from ``resourceVersion``; an object that starts or stops
  matching the selector arrives as ADDED or DELETED; ``allowWatchBookmarks`` gives BOOKMARK events; a version
  older than the compaction is an ERROR event with a 410 Status (HTTP 200, as the real server answers a watch);
  ``timeoutSeconds`` ends the stream;
- pods with a lifecycle: created (Pending, no IP), scheduled (Running with an IP), Ready, NotReady,
  relabelled, deleted gracefully (``deletionTimestamp`` first, then DELETED).

And what tests need to make happen: ``compact()`` (every version so far expires), ``end_watches()`` (every open
watch ends cleanly, as at its timeout), ``drop_watches()`` (every open watch connection cut mid-stream),
``block(token)`` (a client cut off: its connections closed at once).
"""

from __future__ import annotations

import base64
import copy
import http.server
import itertools
import json
import re
import socket
import ssl
import threading
import time
import urllib.parse
from pathlib import Path

from .certs import CertAuthority


def _status(code: int, reason: str, message: str) -> dict:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
            "reason": reason, "code": code}


class FakeKubeApi:
    def __init__(self, directory: Path, tokens: "set[str]", bookmark_interval_s: float = 0.5) -> None:
        self.dir = directory
        self.tokens = set(tokens)
        self.blocked: set[str] = set()
        self.bookmark_interval_s = bookmark_interval_s
        self.ca = CertAuthority(directory, "kube test CA")
        cert, key, _ = self.ca.issue("kube-apiserver", "kube-apiserver")
        self.cond = threading.Condition()
        self.version = 1000
        self.oldest = 0  # versions below this are compacted away
        self.pods: dict[str, dict] = {}  # namespace/name -> pod
        self.history: list[tuple[int, dict | None, dict | None]] = []  # (version, before, after)
        self.snapshots: dict[str, tuple[int, list[dict]]] = {}
        self._tokens = itertools.count(1)
        self.epoch = 0  # drop_watches() moves it: open watches end
        self.requests: list[tuple[str, str]] = []  # (token, path and query) of each request
        self.watches_open = 0
        self.bookmarks_sent = 0
        self.ending = 0  # end_watches() moves it
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(str(cert), str(key))
        api = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def do_GET(self) -> None:
                api._serve(self)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.url = f"https://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.drop_watches()
        self.server.shutdown()
        self.server.server_close()

    def kubeconfig(self, path: Path, token: str, namespace: str = "default") -> Path:
        """A kubeconfig for this server: the CA inline (certificate-authority-data), the token."""
        ca = base64.b64encode(self.ca.path.read_bytes()).decode()
        path.write_text(json.dumps({  # JSON is YAML
            "apiVersion": "v1", "kind": "Config", "current-context": "test",
            "clusters": [{"name": "test", "cluster": {"server": self.url, "certificate-authority-data": ca}}],
            "users": [{"name": "node", "user": {"token": token}}],
            "contexts": [{"name": "test", "context": {"cluster": "test", "user": "node", "namespace": namespace}}]}))
        return path

    # -- the pod lifecycle ---------------------------------------------------

    def _write(self, key: str, after: dict | None) -> None:
        with self.cond:
            self.version += 1
            before = self.pods.get(key)
            if after is None:
                self.pods.pop(key, None)
                self.history.append((self.version, before, None))
            else:
                after = copy.deepcopy(after)
                after["metadata"]["resourceVersion"] = str(self.version)
                self.pods[key] = after
                self.history.append((self.version, before, after))
            self.cond.notify_all()

    def _pod(self, name: str, namespace: str) -> dict:
        return copy.deepcopy(self.pods[f"{namespace}/{name}"])

    def create(self, name: str, labels: dict, annotations: "dict | None" = None, namespace: str = "default") -> None:
        self._write(f"{namespace}/{name}", {
            "kind": "Pod", "apiVersion": "v1",
            "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}-{time.monotonic_ns()}",
                         "labels": dict(labels), "annotations": dict(annotations or {})},
            "status": {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "True"}]}})

    def schedule(self, name: str, ip: str, namespace: str = "default") -> None:
        pod = self._pod(name, namespace)
        pod["status"].update(phase="Running", podIP=ip, podIPs=[{"ip": ip}],
                             conditions=[{"type": "PodScheduled", "status": "True"},
                                         {"type": "Ready", "status": "False"}])
        self._write(f"{namespace}/{name}", pod)

    def set_ready(self, name: str, ready: bool, namespace: str = "default") -> None:
        pod = self._pod(name, namespace)
        pod["status"]["conditions"] = [c for c in pod["status"]["conditions"] if c["type"] != "Ready"] + \
            [{"type": "Ready", "status": "True" if ready else "False"}]
        self._write(f"{namespace}/{name}", pod)

    def relabel(self, name: str, labels: dict, namespace: str = "default") -> None:
        pod = self._pod(name, namespace)
        pod["metadata"]["labels"] = dict(labels)
        self._write(f"{namespace}/{name}", pod)

    def delete(self, name: str, namespace: str = "default", graceful: bool = True) -> None:
        """Graceful: marked terminating (deletionTimestamp, not Ready) first, as the kubelet drains it, then gone."""
        key = f"{namespace}/{name}"
        if graceful:
            pod = self._pod(name, namespace)
            pod["metadata"]["deletionTimestamp"] = "2026-11-26T00:00:00Z"
            pod["status"]["conditions"] = [c for c in pod["status"]["conditions"] if c["type"] != "Ready"] + \
                [{"type": "Ready", "status": "False"}]
            self._write(key, pod)
        self._write(key, None)

    def compact(self) -> None:
        with self.cond:
            self.oldest = self.version + 1
            self.history.clear()
            self.snapshots.clear()

    def end_watches(self) -> None:
        """Every open watch ends cleanly, as at its timeoutSeconds: the client resumes from its last version."""
        with self.cond:
            self.ending += 1
            self.cond.notify_all()

    def drop_watches(self) -> None:
        with self.cond:
            self.epoch += 1
            self.cond.notify_all()

    def block(self, token: str) -> None:
        with self.cond:
            self.blocked.add(token)
            self.epoch += 1
            self.cond.notify_all()

    def unblock(self, token: str) -> None:
        with self.cond:
            self.blocked.discard(token)

    # -- serving -------------------------------------------------------------

    def _serve(self, h: http.server.BaseHTTPRequestHandler) -> None:
        token = h.headers.get("authorization", "").removeprefix("Bearer ")
        with self.cond:
            self.requests.append((token, h.path))
            blocked = token in self.blocked
        if blocked:  # cut off: the connection goes, no answer
            h.close_connection = True
            h.connection.shutdown(socket.SHUT_RDWR)
            return
        if token not in self.tokens:
            return self._json(h, 401, _status(401, "Unauthorized", "Unauthorized"))
        url = urllib.parse.urlsplit(h.path)
        query = dict(urllib.parse.parse_qsl(url.query))
        parts = url.path.strip("/").split("/")
        if parts == ["api", "v1", "pods"]:
            namespace = None
        elif len(parts) == 5 and parts[:3] == ["api", "v1", "namespaces"] and parts[4] == "pods":
            namespace = parts[3]
        else:
            return self._json(h, 404, _status(404, "NotFound", f"no route {url.path}"))
        selector = self._selector(query.get("labelSelector", ""))
        if selector is None:
            return self._json(h, 400, _status(400, "BadRequest", "unable to parse requirement"))
        if query.get("watch") in ("1", "true"):
            return self._watch(h, namespace, selector, query)
        return self._list(h, namespace, selector, query)

    @staticmethod
    def _selector(text: str) -> "list | None":
        """The API's label selector grammar (equality and set-based) -> [(key, op, values)], None if malformed.
        Written apart from the gateway's parser on purpose: this server checks that one."""
        terms = re.split(r",(?![^()]*\))", text)  # commas not inside a set's parentheses
        out = []
        for term in filter(None, (t.strip() for t in terms)):
            words = term.replace("(", " ( ").replace(")", " ) ").split()
            if len(words) >= 4 and words[1] in ("in", "notin") and words[2] == "(" and words[-1] == ")":
                out.append((words[0], words[1], {v.strip() for v in " ".join(words[3:-1]).split(",") if v.strip()}))
            elif "!=" in term:
                key, _, value = term.partition("!=")
                out.append((key.strip(), "!=", {value.strip()}))
            elif "=" in term:
                key, _, value = term.partition("=")
                out.append((key.strip(), "=", {value.lstrip("=").strip()}))
            elif term.startswith("!"):
                out.append((term[1:].strip(), "!", set()))
            elif len(words) == 1:
                out.append((term, "exists", set()))
            else:
                return None
        return out

    @staticmethod
    def _matches(pod: "dict | None", namespace: "str | None", selector: list) -> bool:
        if pod is None or (namespace is not None and pod["metadata"]["namespace"] != namespace):
            return False
        labels = pod["metadata"].get("labels") or {}
        for key, op, values in selector:
            value = labels.get(key)
            ok = {"=": value in values, "in": value in values, "!=": value not in values,
                  "notin": value not in values, "exists": key in labels, "!": key not in labels}[op]
            if not ok:
                return False
        return True

    def _list(self, h, namespace, selector, query) -> None:
        limit = int(query.get("limit") or 0)
        with self.cond:
            token = query.get("continue")
            if token:
                if token not in self.snapshots:
                    return self._json(h, 410, _status(410, "Expired", "The provided continue parameter is too "
                                                                      "old to display a consistent list result."))
                version, items = self.snapshots.pop(token)
            else:
                version = self.version
                items = [copy.deepcopy(p) for k, p in sorted(self.pods.items())
                         if self._matches(p, namespace, selector)]
            page, rest = (items[:limit], items[limit:]) if limit else (items, [])
            meta = {"resourceVersion": str(version)}
            if rest:
                next_token = f"c{next(self._tokens)}"
                self.snapshots[next_token] = (version, rest)
                meta["continue"] = next_token
        self._json(h, 200, {"kind": "PodList", "apiVersion": "v1", "metadata": meta, "items": page})

    def _watch(self, h, namespace, selector, query) -> None:
        since = query.get("resourceVersion") or "0"
        deadline = time.monotonic() + float(query.get("timeoutSeconds") or 1800)
        bookmarks = query.get("allowWatchBookmarks") == "true"
        h.send_response(200)
        h.send_header("content-type", "application/json")
        h.send_header("transfer-encoding", "chunked")
        h.end_headers()

        def send(event: dict) -> None:
            data = json.dumps(event).encode() + b"\n"
            h.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            h.wfile.flush()

        with self.cond:
            epoch, ending = self.epoch, self.ending
            self.watches_open += 1
            if since == "0":  # "any version": the current state as ADDED events first
                cursor = self.version
                initial = [p for p in self.pods.values() if self._matches(p, namespace, selector)]
            elif int(since) < self.oldest:
                initial, cursor = None, None
            else:
                initial, cursor = [], int(since)
        try:
            if cursor is None:
                send({"type": "ERROR", "object": _status(410, "Expired", f"too old resource version: {since} "
                                                                         f"({self.oldest})")})
                h.wfile.write(b"0\r\n\r\n")
                return
            for pod in initial:
                send({"type": "ADDED", "object": pod})
            last_bookmark = time.monotonic()
            while True:
                with self.cond:
                    pending = [e for e in self.history if e[0] > cursor]
                    if not pending and self.epoch == epoch:
                        self.cond.wait(timeout=min(self.bookmark_interval_s, max(0.0, deadline - time.monotonic())))
                        pending = [e for e in self.history if e[0] > cursor]
                    if self.epoch != epoch:  # drop_watches() or block(): the connection is cut mid-stream
                        h.close_connection = True
                        h.connection.shutdown(socket.SHUT_RDWR)
                        return
                    version_now = self.version
                for version, before, after in pending:
                    cursor = version
                    was, now = self._matches(before, namespace, selector), self._matches(after, namespace, selector)
                    if after is None:
                        obj = copy.deepcopy(before)
                        obj["metadata"]["resourceVersion"] = str(version)
                    else:
                        obj = after
                    if was and now:
                        send({"type": "MODIFIED", "object": obj})
                    elif now:
                        send({"type": "ADDED", "object": obj})
                    elif was:
                        send({"type": "DELETED", "object": obj})
                if time.monotonic() >= deadline or self.ending != ending:
                    h.wfile.write(b"0\r\n\r\n")
                    return
                if bookmarks and time.monotonic() - last_bookmark >= self.bookmark_interval_s:
                    cursor = max(cursor, version_now)
                    send({"type": "BOOKMARK", "object": {"kind": "Pod", "apiVersion": "v1",
                                                         "metadata": {"resourceVersion": str(cursor)}}})
                    last_bookmark = time.monotonic()
                    with self.cond:
                        self.bookmarks_sent += 1
        except (OSError, ValueError):
            h.close_connection = True
        finally:
            with self.cond:
                self.watches_open -= 1

    @staticmethod
    def _json(h, code: int, body: dict) -> None:
        data = json.dumps(body).encode()
        h.send_response(code)
        h.send_header("content-type", "application/json")
        h.send_header("content-length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)
