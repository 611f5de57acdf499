#!/usr/bin/env python3
"""faultd.py - a fault-injecting HTTP/1.1 file server for salafw's fetch tests
(python3 standard library only). It serves ROOT under both layouts: /PATH and
/{org}/{name}/resolve/{rev}/PATH, with real Range support, and misbehaves as
told. It binds 127.0.0.1 only, writes its port to --port-file, logs one JSON
line per request to --log, and exits by itself after --lifetime seconds.

  faultd.py serve --root DIR --port-file F [--log F] [--lifetime S]
                  [--fault MODE[:ARG]] [--times K] [--only PATH] [--commit HEX]
                  [--rate BYTES_PER_S] [--norange] [--corrupt OFF]
  faultd.py manifest --dir DIR --repo ORG/NAME --rev HEX --key-id ID
                  [--source http:URL|hf:URL ...] [--version N] [--path-override OLD=NEW]
                  [--unnamed]  (sources without a "name": shown by their URL)

Faults (applied to the first K matching requests when --times K is given,
else to all; --only limits them to one file path):
  drop:N       send the headers, then close after N body bytes
  stall:N      send N body bytes, then stop sending (the connection stays open)
  503:S        503 with Retry-After: S
  404, 500     that status (an error body)
  norange      ignore Range: always 200 with the whole file
  badrange     answer a Range with 206 and a Content-Range shifted by one byte
  corrupt:OFF  flip the byte at file offset OFF in whatever is sent
  long:N       Content-Length and body N bytes longer than the file
  longclose:N  no Content-Length, body N bytes longer, then close
  redirloop    302 to the same URL, forever
  redirect:URL 302 to URL + the request path
  bighead:N    an X-Big response header line of N bytes (libcurl refuses
               one over 100 KB)
--norange and --corrupt OFF act like those faults on every request (--only
still limits them, --times does not), so they combine with a --fault: e.g.
--norange --fault drop:N is a server that ignores Range and drops.
"""
import argparse
import hashlib
import json
import os
import re
import signal
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

HF_RE = re.compile(r"^/[^/]+/[^/]+/resolve/[^/]+/(.*)$")


class State:
    def __init__(self, args):
        self.args = args
        self.lock = threading.Lock()
        self.hits = 0
        self.log = open(args.log, "a") if args.log else None

    def take_fault(self, path):
        a = self.args
        if not a.fault:
            return None
        if a.only and path != a.only:
            return None
        with self.lock:
            self.hits += 1
            if a.times and self.hits > a.times:
                return None
        return a.fault

    def record(self, **kw):
        if self.log:
            with self.lock:
                self.log.write(json.dumps(kw) + "\n")
                self.log.flush()


def unquote(p):
    from urllib.parse import unquote as uq
    return uq(p)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "faultd/1"

    def log_message(self, fmt, *args):  # quiet
        pass

    def send_plain(self, status, body=b"", headers=()):
        self.send_response(status)
        for k, v in headers:
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def write_body(self, data, rate):
        """Writes data, pacing it to `rate` bytes/s when set."""
        if not rate:
            self.wfile.write(data)
            return len(data)
        sent, chunk = 0, 16384
        t0 = time.monotonic()
        while sent < len(data):
            self.wfile.write(data[sent:sent + chunk])
            sent += len(data[sent:sent + chunk])
            ahead = sent / rate - (time.monotonic() - t0)
            if ahead > 0:
                time.sleep(ahead)
        return sent

    def do_HEAD(self):
        self.do_GET()

    def do_GET(self):
        st = self.server.state
        a = st.args
        raw = self.path.split("?", 1)[0]
        m = HF_RE.match(raw)
        rel = unquote(m.group(1) if m else raw.lstrip("/"))
        fault = st.take_fault(rel)
        kind, _, arg = (fault or "").partition(":")
        always = not a.only or rel == a.only  # --norange / --corrupt apply here
        norange = kind == "norange" or (a.norange and always)
        corrupt = [int(arg)] if kind == "corrupt" else []
        if a.corrupt is not None and always:
            corrupt.append(a.corrupt)
        rng = self.headers.get("Range")
        entry = dict(path=rel, range=rng, fault=fault, sent=0, status=0, auth=self.headers.get("Authorization"))
        try:
            self.handle_get(rel, kind, arg, rng, entry, m is not None, norange, corrupt)
        except (BrokenPipeError, ConnectionResetError, socket.timeout):
            pass
        finally:
            st.record(**entry)

    def handle_get(self, rel, kind, arg, rng, entry, hf, norange, corrupt):
        st = self.server.state
        a = st.args
        extra = []
        if a.commit and hf:
            extra.append(("X-Repo-Commit", a.commit))
        if kind == "bighead":
            extra.append(("X-Big", "a" * int(arg)))
        if kind == "redirloop":
            entry["status"] = 302
            return self.send_plain(302, b"", [("Location", self.path)] + extra)
        if kind == "redirect":
            entry["status"] = 302
            return self.send_plain(302, b"", [("Location", arg.rstrip("/") + self.path)] + extra)
        if kind in ("404", "500"):
            entry["status"] = int(kind)
            return self.send_plain(int(kind), b"fault\n", extra)
        if kind == "503":
            entry["status"] = 503
            return self.send_plain(503, b"busy\n", [("Retry-After", arg)] + extra)
        full = os.path.realpath(os.path.join(a.root, rel))
        root = os.path.realpath(a.root)
        if not full.startswith(root + os.sep) or not os.path.isfile(full):
            entry["status"] = 404
            return self.send_plain(404, b"not found\n", extra)
        with open(full, "rb") as f:
            data = f.read()
        size = len(data)
        for off in corrupt:
            if off < size:
                b = bytearray(data)
                b[off] ^= 0xFF
                data = bytes(b)
        start, end = 0, size  # [start, end)
        status = 200
        if rng and not norange:
            mm = re.match(r"^bytes=(\d+)-(\d*)$", rng.strip())
            if not mm:
                entry["status"] = 416
                return self.send_plain(416, b"", [("Content-Range", "bytes */%d" % size)])
            start = int(mm.group(1))
            end = int(mm.group(2)) + 1 if mm.group(2) else size
            end = min(end, size)
            if start >= size or start >= end:
                entry["status"] = 416
                return self.send_plain(416, b"", [("Content-Range", "bytes */%d" % size)])
            status = 206
        body = data[start:end]
        headers = list(extra)
        if status == 206:
            cr_start = start + 1 if kind == "badrange" else start
            cr_end = end if kind == "badrange" else end - 1
            headers.append(("Content-Range", "bytes %d-%d/%d" % (cr_start, cr_end, size)))
        headers.append(("Accept-Ranges", "bytes"))
        close = False
        if kind == "long":
            body = body + b"X" * int(arg)
            headers.append(("Content-Length", str(len(body))))
        elif kind == "longclose":
            body = body + b"X" * int(arg)
            headers.append(("Connection", "close"))
            close = True
        else:
            headers.append(("Content-Length", str(len(body))))
        entry["status"] = status
        self.send_response(status)
        for k, v in headers:
            self.send_header(k, v)
        self.end_headers()
        if self.command == "HEAD":
            return
        if kind == "drop":
            n = min(int(arg), len(body))
            entry["sent"] = self.write_body(body[:n], a.rate)
            self.wfile.flush()
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        if kind == "stall":
            n = min(int(arg), len(body))
            entry["sent"] = self.write_body(body[:n], a.rate)
            self.wfile.flush()
            # hold the connection open without sending, until the client gives up
            deadline = time.monotonic() + a.lifetime
            self.connection.settimeout(0.2)
            while time.monotonic() < deadline:
                try:
                    if self.connection.recv(1) == b"":
                        break
                except socket.timeout:
                    continue
                except OSError:
                    break
            self.close_connection = True
            return
        entry["sent"] = self.write_body(body, a.rate)
        if close:
            self.wfile.flush()
            self.close_connection = True


class Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):
        pass  # clients hanging up mid-body is what the tests do on purpose


def serve(args):
    srv = Server(("127.0.0.1", args.port), Handler)
    srv.daemon_threads = True
    srv.state = State(args)
    port = srv.server_address[1]
    tmp = args.port_file + ".tmp"
    with open(tmp, "w") as f:
        f.write("%d\n" % port)
    os.rename(tmp, args.port_file)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    t = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
    t.start()
    stop.wait(args.lifetime)  # bounded: always exits by itself
    srv.shutdown()
    srv.server_close()
    return 0


def manifest(args):
    files = []
    for dp, dn, fn in os.walk(args.dir):
        dn.sort()
        for n in fn:
            full = os.path.join(dp, n)
            rel = os.path.relpath(full, args.dir).replace(os.sep, "/")
            h = hashlib.sha256()
            with open(full, "rb") as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    h.update(chunk)
            files.append({"path": rel, "size": os.path.getsize(full), "sha256": h.hexdigest()})
    for o in args.path_override or []:
        old, new = o.split("=", 1)
        for e in files:
            if e["path"] == old:
                e["path"] = new
    for o in args.size_override or []:
        p, s = o.split("=", 1)
        for e in files:
            if e["path"] == p:
                e["size"] = int(s)
    files.sort(key=lambda e: e["path"].encode())
    sources = []
    for i, s in enumerate(args.source or []):
        kind, _, url = s.partition(":")
        if kind == "http":
            src = {"kind": "http", "name": "src%d" % i, "base_url": url}
        else:
            src = {"kind": "hf", "name": "src%d" % i, "endpoint": url}
        if args.unnamed:
            del src["name"]
        sources.append(src)
    now = int(time.time())
    doc = {
        "schema_version": 1,
        "generator": "faultd-test/1.0.0",
        "publisher": {"name": "test", "key_id": args.key_id},
        "repo_type": "model",
        "repo_id": args.repo,
        "revision": args.rev,
        "manifest_version": args.version,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now - 60)),
        "expires": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now + 86400)),
        "total_size": sum(e["size"] for e in files),
        "files": files,
        "sources": sources,
    }
    sys.stdout.write(json.dumps(doc, indent=1) + "\n")
    return 0


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serve")
    s.add_argument("--root", required=True)
    s.add_argument("--port", type=int, default=0)
    s.add_argument("--port-file", required=True)
    s.add_argument("--log")
    s.add_argument("--lifetime", type=float, default=60)
    s.add_argument("--fault")
    s.add_argument("--times", type=int, default=0)
    s.add_argument("--only")
    s.add_argument("--commit")
    s.add_argument("--rate", type=float, default=0)
    s.add_argument("--norange", action="store_true")
    s.add_argument("--corrupt", type=int)
    m = sub.add_parser("manifest")
    m.add_argument("--dir", required=True)
    m.add_argument("--repo", required=True)
    m.add_argument("--rev", required=True)
    m.add_argument("--key-id", required=True)
    m.add_argument("--source", action="append")
    m.add_argument("--version", type=int, default=1)
    m.add_argument("--path-override", action="append")
    m.add_argument("--size-override", action="append")
    m.add_argument("--unnamed", action="store_true")
    args = ap.parse_args()
    return serve(args) if args.cmd == "serve" else manifest(args)


if __name__ == "__main__":
    sys.exit(main())
