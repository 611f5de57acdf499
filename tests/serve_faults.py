#!/usr/bin/env python3
"""serve_faults.py - raw-socket clients for tests/test_serve_faults.sh: the
slow, half-closing and crowding clients curl cannot be. Loopback only; every
command ends by itself (its own time limits).

usage: serve_faults.py CMD PORT [args]
  slow PORT MODE ADDR         trickle a request (MODE headers: a header line every
                              0.3 s; body: the headers, then a body byte every 0.3 s)
                              from ADDR; prints the seconds until the server closed
                              the connection, or "open" after 8 s
  crowd PORT N ADDRS SECS READY
                              N connections that send half a request, spread over
                              the ADDRS loopback addresses (127.0.0.2 ...), held SECS
                              seconds or until the file READY.stop appears; READY is
                              written once they are all opened; prints how many the
                              server closed
  perip PORT N ADDR           N idle connections from ADDR, one at a time; prints
                              the 0-based indexes of those the server closed
  halfclose PORT PATH JSON    the request, then shutdown(SHUT_WR): prints the final
                              status, then the body (interim 1xx answers skipped)
  te PORT                     a POST with "Transfer-Encoding: gzip, chunked"; prints
                              the status, or "none" after 5 s
"""
import os
import socket
import sys
import time


def connect(port, addr="127.0.0.1", timeout=10):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind((addr, 0))
    s.settimeout(timeout)
    s.connect(("127.0.0.1", port))
    return s


def closed(s):
    """1 when the server has closed s (EOF or reset), without waiting."""
    s.setblocking(False)
    try:
        return s.recv(65536) == b""  # bytes: an answer, the connection still open
    except BlockingIOError:
        return False
    except OSError:
        return True
    finally:
        s.setblocking(True)


def read_all(s, limit=30):
    out, t0 = b"", time.time()
    while time.time() - t0 < limit:
        try:
            b = s.recv(65536)
        except socket.timeout:
            break
        except OSError:
            break
        if not b:
            break
        out += b
    return out


def final_response(raw):
    """(status, body) of the last non-1xx response in raw (chunked decoded)."""
    while True:
        head, sep, rest = raw.partition(b"\r\n\r\n")
        if not sep:
            return 0, b""
        lines = head.split(b"\r\n")
        status = int(lines[0].split()[1])
        if 100 <= status < 200:
            raw = rest
            continue
        hdr = {k.strip().lower(): v.strip() for k, _, v in (l.partition(b":") for l in lines[1:])}
        if hdr.get(b"transfer-encoding", b"").lower() == b"chunked":
            body = b""
            while rest:
                size, _, rest = rest.partition(b"\r\n")
                n = int(size.split(b";")[0], 16)
                if n == 0:
                    break
                body += rest[:n]
                rest = rest[n + 2:]
            return status, body
        if b"content-length" in hdr:
            return status, rest[: int(hdr[b"content-length"])]
        return status, rest


def cmd_slow(port, mode, addr):
    s = connect(port, addr)
    t0 = time.time()
    if mode == "body":
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 1000\r\n\r\n")
    else:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")
    while time.time() - t0 < 8:
        time.sleep(0.3)
        if closed(s):
            print("%.2f" % (time.time() - t0))
            return
        try:
            s.sendall(b" " if mode == "body" else b"X-Slow: 1\r\n")
        except OSError:
            print("%.2f" % (time.time() - t0))
            return
    print("open")


def cmd_crowd(port, n, addrs, secs, ready):
    socks = []
    for i in range(n):
        try:
            s = connect(port, "127.0.0.%d" % (2 + i % addrs), timeout=5)
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
            socks.append(s)
        except OSError:
            socks.append(None)
    open(ready, "w").write("%d\n" % len(socks))
    t0 = time.time()
    while time.time() - t0 < secs and not os.path.exists(ready + ".stop"):
        time.sleep(0.1)
    print(sum(1 for s in socks if s is None or closed(s)))


def cmd_perip(port, n, addr):
    socks = []
    for _ in range(n):
        try:
            socks.append(connect(port, addr, timeout=5))
        except OSError:
            socks.append(None)
        time.sleep(0.05)
    time.sleep(1)
    print(" ".join(str(i) for i, s in enumerate(socks) if s is None or closed(s)))


def cmd_halfclose(port, path, body):
    s = connect(port, timeout=30)
    b = body.encode()
    s.sendall(b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
              % (path.encode(), len(b), b))
    s.shutdown(socket.SHUT_WR)
    st, payload = final_response(read_all(s))
    print(st)
    sys.stdout.write(payload.decode("utf-8", "replace"))


def cmd_te(port):
    s = connect(port, timeout=5)
    body = b'{"model": "m", "prompt": "x"}'
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Transfer-Encoding: gzip, chunked\r\n\r\n%x\r\n%s\r\n" % (len(body), body))
    try:
        raw = s.recv(65536)
    except OSError:
        raw = b""
    print(raw.split(b" ")[1].decode() if raw.startswith(b"HTTP/1.") else "none")


def main():
    cmd, port = sys.argv[1], int(sys.argv[2])
    a = sys.argv[3:]
    if cmd == "slow":
        cmd_slow(port, a[0], a[1])
    elif cmd == "crowd":
        cmd_crowd(port, int(a[0]), int(a[1]), float(a[2]), a[3])
    elif cmd == "perip":
        cmd_perip(port, int(a[0]), a[1])
    elif cmd == "halfclose":
        cmd_halfclose(port, a[0], a[1])
    elif cmd == "te":
        cmd_te(port)
    else:
        sys.exit("unknown command " + cmd)


if __name__ == "__main__":
    main()
