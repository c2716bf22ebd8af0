"""A stub Kubernetes API server for the discovery tests: HTTPS on 127.0.0.1 with a CA and a
server certificate made here with the openssl CLI; serves the EndpointSlices of one namespace
(list and watch, as discovery.k8s.io/v1 does: newline-delimited JSON watch events, bookmarks,
410 for a resourceVersion older than the compaction point, as the HTTP status or as an ERROR
event), checks the bearer token, and logs every request."""
import json
import socket
import ssl
import subprocess
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


def make_certs(d):
    """CA + server cert for 127.0.0.1 in directory `d`; returns (ca, cert, key) paths."""
    d = Path(d)
    ca_key, ca, key, csr, cert, ext = (d / n for n in (
        "ca.key", "ca.crt", "server.key", "server.csr", "server.crt", "ext.cnf"))

    def run(*a):
        subprocess.run(["openssl", *a], check=True, capture_output=True, timeout=30)
    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(ca_key), "-out", str(ca),
        "-days", "2", "-subj", "/CN=kvroute-test-ca")
    run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(csr),
        "-subj", "/CN=127.0.0.1")
    ext.write_text("subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n"
                   "keyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n")
    run("x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key),
        "-CAcreateserial", "-out", str(cert), "-days", "2", "-extfile", str(ext))
    return ca, cert, key


def endpoint(name, ip="127.0.0.1", ready=True, serving=None, terminating=None):
    cond = {"ready": ready}
    if serving is not None:
        cond["serving"] = serving
    if terminating is not None:
        cond["terminating"] = terminating
    return {"addresses": [ip], "conditions": cond,
            "targetRef": {"kind": "Pod", "name": name, "namespace": "default"}}


class K8sStub:
    """The API server. `token`: the accepted bearer token (None: any request). `gone_mode`: "status" (HTTP 410) or
    "event" (200 then an ERROR event with a 410 Status) for too-old resourceVersions."""

    def __init__(self, tmpdir, namespace="default", token="token-1"):
        self.ns = namespace
        self.token = token
        self.gone_mode = "event"
        self.lock = threading.Condition()
        self.rv = 100
        self.compacted = 0          # watches from an rv below this get 410
        self.slices = {}            # name -> object
        self.events = []            # (rv, event dict)
        self.watch_gen = 0          # +1 closes every open watch
        self.log = []               # dicts: kind (list/watch), rv, auth, status, service
        self.stopping = False
        self.ca, cert, key = make_certs(tmpdir)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(str(cert), str(key))
        stub = self

        class H(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"

            def log_message(self, *a):
                pass

            def do_GET(self):
                stub._handle(self)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.httpd.daemon_threads = True
        self.httpd.socket = ctx.wrap_socket(self.httpd.socket, server_side=True)
        self.port = self.httpd.server_address[1]
        self.url = "https://127.0.0.1:%d" % self.port
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    # ---- state changes (each one is a watch event)
    def _bump(self, typ, obj):
        self.rv += 1
        obj = json.loads(json.dumps(obj))
        obj["metadata"]["resourceVersion"] = str(self.rv)
        self.events.append((self.rv, {"type": typ, "object": obj}))
        self.lock.notify_all()
        return obj

    def set_slice(self, name, service, endpoints, port, port_name="http"):
        with self.lock:
            typ = "MODIFIED" if name in self.slices else "ADDED"
            obj = {"kind": "EndpointSlice", "apiVersion": "discovery.k8s.io/v1",
                   "metadata": {"name": name, "namespace": self.ns,
                                "labels": {"kubernetes.io/service-name": service}},
                   "addressType": "IPv4", "endpoints": endpoints,
                   "ports": [{"name": port_name, "port": port, "protocol": "TCP"}]}
            self.slices[name] = self._bump(typ, obj)

    def delete_slice(self, name):
        with self.lock:
            obj = self.slices.pop(name)
            self._bump("DELETED", obj)

    def compact(self):
        """Every resourceVersion so far becomes too old to watch from."""
        with self.lock:
            self.compacted = self.rv + 1

    def close_watches(self):
        with self.lock:
            self.watch_gen += 1
            self.lock.notify_all()

    def requests(self, kind=None):
        with self.lock:
            return [e for e in self.log if kind is None or e["kind"] == kind]

    def stop(self):
        with self.lock:
            self.stopping = True
            self.watch_gen += 1
            self.lock.notify_all()
        self.httpd.shutdown()
        self.httpd.server_close()

    # ---- serving
    def _handle(self, h):
        u = urllib.parse.urlsplit(h.path)
        q = urllib.parse.parse_qs(u.query)
        want = "/apis/discovery.k8s.io/v1/namespaces/%s/endpointslices" % self.ns
        sel = q.get("labelSelector", [""])[0]
        service = sel.split("=", 1)[1] if sel.startswith("kubernetes.io/service-name=") else None
        watch = q.get("watch", ["0"])[0] in ("1", "true")
        entry = {"kind": "watch" if watch else "list", "auth": h.headers.get("Authorization"),
                 "rv": q.get("resourceVersion", [None])[0], "service": service,
                 "bookmarks": q.get("allowWatchBookmarks", [None])[0], "t": time.monotonic()}
        with self.lock:
            self.log.append(entry)
        if u.path != want or service is None:
            entry["status"] = 404
            return self._json(h, 404, {"kind": "Status", "code": 404, "reason": "NotFound"})
        if self.token is not None and entry["auth"] != "Bearer " + self.token:
            entry["status"] = 401
            return self._json(h, 401, {"kind": "Status", "code": 401, "reason": "Unauthorized"})
        if not watch:
            with self.lock:
                items = [s for s in self.slices.values()
                         if s["metadata"]["labels"]["kubernetes.io/service-name"] == service]
                body = {"kind": "EndpointSliceList", "apiVersion": "discovery.k8s.io/v1",
                        "metadata": {"resourceVersion": str(self.rv)}, "items": items}
            entry["status"] = 200
            return self._json(h, 200, body)
        try:
            rv = int(entry["rv"] or "0")
        except ValueError:
            rv = 0
        gone = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 410,
                "reason": "Expired", "message": "too old resource version"}
        with self.lock:
            too_old = rv < self.compacted
        if too_old and self.gone_mode == "status":
            entry["status"] = 410
            return self._json(h, 410, gone)
        entry["status"] = 200
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        h.end_headers()
        h.wfile.flush()
        if too_old:
            self._line(h, {"type": "ERROR", "object": gone})
            return
        with self.lock:
            gen = self.watch_gen
        sent = rv
        while True:
            with self.lock:
                todo = [(r, e) for r, e in self.events if r > sent
                        and e["object"]["metadata"]["labels"]["kubernetes.io/service-name"] == service]
                if not todo:
                    self.lock.wait(0.2)
                if self.watch_gen != gen or self.stopping:
                    return
            for r, e in todo:
                if not self._line(h, e):
                    return
                sent = r

    def _line(self, h, obj):
        try:
            h.wfile.write(json.dumps(obj).encode() + b"\n")
            h.wfile.flush()
            return True
        except (OSError, socket.error):
            return False

    def _json(self, h, status, obj):
        b = json.dumps(obj).encode()
        h.send_response(status)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(b)))
        h.end_headers()
        h.wfile.write(b)
