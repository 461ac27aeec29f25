#!/usr/bin/env python3
"""Memory per idle client connection (docs/performance.md, "Memory per idle connection").

Starts `fulcrum serve` (release build) in front of one `fulcrum backend`, opens N
keep-alive HTTP/1.1 connections that each send one GET and read its answer, then keeps
them open; and N more that never send a byte. Prints fulcrum's RSS growth per
connection for each kind.

    scripts/bench/idle-rss.py [BIN] [N]     (BIN: target/release/fulcrum, N: 1000)
"""
import os, resource, socket, subprocess, sys, time

BIN = sys.argv[1] if len(sys.argv) > 1 else "target/release/fulcrum"
N = int(sys.argv[2]) if len(sys.argv) > 2 else 1000


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def wait_port(port):
    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"nothing listens on {port}")


def main():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    bport, pport, aport = free_port(), free_port(), free_port()
    backend = subprocess.Popen([BIN, "backend", "--listen", f"127.0.0.1:{bport}"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_port(bport)
    proxy = subprocess.Popen([BIN, "serve", "--listen", f"127.0.0.1:{pport}", "--admin",
                              f"127.0.0.1:{aport}", "--workers", "1", "--access-log", "off",
                              "--backend", f"http://127.0.0.1:{bport}"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_port(pport)
        # Warm up: one request, so the pools and the first buffers exist.
        c = socket.create_connection(("127.0.0.1", pport))
        c.sendall(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")
        c.recv(65536)
        c.close()
        time.sleep(0.5)
        base = rss_kib(proxy.pid)
        served = []
        for _ in range(N):
            s = socket.create_connection(("127.0.0.1", pport))
            s.sendall(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")
            got = b""
            while b"\r\n\r\n" not in got:
                got += s.recv(65536)
            served.append(s)
        time.sleep(1.0)
        after_served = rss_kib(proxy.pid)
        silent = [socket.create_connection(("127.0.0.1", pport)) for _ in range(N)]
        time.sleep(1.0)
        after_silent = rss_kib(proxy.pid)
        print(f"idle keep-alive after one request: {(after_served - base) / N:.1f} KiB each")
        print(f"idle, never sent a byte:           {(after_silent - after_served) / N:.1f} KiB each")
        for s in served + silent:
            s.close()
    finally:
        proxy.terminate()
        backend.terminate()
        proxy.wait()
        backend.wait()


main()
