#!/usr/bin/env python3
"""A backend for the HTTP/2 conformance run: answers 200 and a short body to any
method, after reading whatever body the request has."""
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def answer(self):
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        elif "chunked" in (self.headers.get("Transfer-Encoding") or ""):
            while True:
                size = int(self.rfile.readline().split(b";")[0], 16)
                self.rfile.read(size + 2)
                if size == 0:
                    break
        body = b"ok: answered by the conformance backend, long enough for window tests\n"
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = do_OPTIONS = do_PATCH = answer

    def log_message(self, *args):
        pass


class Server(ThreadingHTTPServer):
    # One suite test opens 200 streams at once; the default backlog of 5 would drop
    # connections (and stall the tests beside it for a SYN retry).
    request_queue_size = 1024
    daemon_threads = True


Server(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
