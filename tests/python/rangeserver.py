"""A loopback HTTP range server for the remote-object tests (tests/python/
test_remote.py, tests/gpu/test_remote_gpu.py): Range, ETag, If-Match -> 412,
416 past the end, and faults injected per request; HTTPS with a certificate the
test made (test_remote_tls.py)."""
import os
import socket
import ssl
import struct
import threading
from email.utils import formatdate, parsedate_to_datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class RangeServer:
    """Objects by path, each with an ETag; `faults` is a list of what the next
    GET requests of data meet, in order, `open_faults` the same for the GETs of
    an object's first bytes that open it; `log` records (method, range,
    if-match) per request. The faults:
      None          no fault (a place holder in the list)
      500, 503, 429 that status, with a message
      "slowdown"    S3's 503 SlowDown
      "drop"        headers and half the body, then the connection closes
      "reset"       headers and half the body, then a TCP reset
      "short"       a complete-looking response of half the bytes
      "stall"       nothing at all until the server stops (or 30 s)
      "stall_body"  headers and half the body, then nothing
      "replace"     every object is replaced by a new version first
      "replace_ignore"  the same, and the request's If-Match (or
                    If-Unmodified-Since) is ignored: the new version is sent
      "norange"     the Range header is ignored: 200 and the whole object
      "badrange"    206 whose Content-Range (and body) starts 4 KiB later than asked"""

    def __init__(self, etags=True, tls=None):
        """etags=False: no ETag, a Last-Modified date per version instead
        (If-Unmodified-Since -> 412), as servers of plain files may do.
        tls=(certfile, keyfile): HTTPS with that certificate chain (PEM)."""
        self.etags = etags
        self.scheme = "https" if tls else "http"
        self.objects = {}
        self.faults = []
        self.open_faults = []
        self.log = []
        self.peers = set()   # (host, port) of every connection a request came on
        self.lock = threading.Lock()
        self.version = 0
        self.stall = threading.Event()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def do_HEAD(self):
                self.serve(head=True)

            def do_GET(self):
                self.serve(head=False)

            def send(self, status, headers, body=b""):
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.end_headers()
                if body:
                    self.wfile.write(body)

            def serve(self, head):
                with server.lock:
                    server.log.append((self.command, self.headers.get("Range"), self.headers.get("If-Match")))
                    server.peers.add(self.client_address)
                    opening = (self.headers.get("Range") or "").startswith("bytes=0-")
                    queue = server.open_faults if opening else server.faults
                    fault = queue.pop(0) if queue and not head else None
                    if fault in ("replace", "replace_ignore"):
                        for k, (data, _) in list(server.objects.items()):
                            server.version += 1
                            server.objects[k] = (bytes(reversed(data)), f'"v{server.version}"')
                    obj = server.objects.get(self.path)
                if obj is None:
                    return self.send(404, {"Content-Length": "9"}, b"not found")
                data, etag = obj
                im = self.headers.get("If-Match")
                if fault == "replace_ignore":
                    im = None
                if im is not None and im != etag:
                    return self.send(412, {"Content-Length": "0", "ETag": etag})
                # the version's date: ten seconds per version
                modified = formatdate(1_700_000_000 + 10 * int(etag.strip('"v')), usegmt=True)
                ius = self.headers.get("If-Unmodified-Since")
                if fault == "replace_ignore":
                    ius = None
                if ius is not None and parsedate_to_datetime(ius) < parsedate_to_datetime(modified):
                    return self.send(412, {"Content-Length": "0"})
                if fault in (500, 503, 429):
                    body = b"busy, try again"
                    return self.send(fault, {"Content-Length": str(len(body))}, body)
                if fault == "slowdown":
                    body = (b"<?xml version='1.0'?><Error><Code>SlowDown</Code>"
                            b"<Message>Please reduce your request rate.</Message></Error>")
                    return self.send(503, {"Content-Length": str(len(body))}, body)
                if fault == "stall":
                    server.stall.wait(30)
                    return
                size = len(data)
                rng = None if fault == "norange" else self.headers.get("Range")
                lo, hi, status = 0, size - 1, 200
                if rng:
                    a, b = rng.split("=")[1].split("-")
                    lo = int(a)
                    hi = min(int(b) if b else size - 1, size - 1)
                    if lo >= size:
                        return self.send(416, {"Content-Range": f"bytes */{size}", "Content-Length": "0"})
                    status = 206
                    if fault == "badrange":
                        lo = min(lo + 4096, hi)
                body = data[lo:hi + 1]
                headers = {"Accept-Ranges": "bytes", "Content-Length": str(len(body))}
                if server.etags:
                    headers["ETag"] = etag
                else:
                    headers["Last-Modified"] = modified
                if status == 206:
                    headers["Content-Range"] = f"bytes {lo}-{hi}/{size}"
                if fault == "short":   # a complete-looking response of half the bytes
                    body = body[: len(body) // 2]
                    headers["Content-Length"] = str(len(body))
                if head:
                    return self.send(status, headers)
                if fault in ("drop", "reset", "stall_body"):   # headers and half the body, then ...
                    self.send(status, headers, body[: len(body) // 2])
                    self.wfile.flush()
                    self.close_connection = True
                    if fault == "stall_body":
                        server.stall.wait(30)
                    elif fault == "reset":   # SO_LINGER 0: close sends RST, not FIN
                        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                        self.connection.close()
                        return
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                self.send(status, headers, body)

        self.handshake_errors = []
        self.httpd = (_TLSServer if tls else _Server)(("127.0.0.1", 0), Handler)
        if tls:
            self.httpd.tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            self.httpd.tls.load_cert_chain(*tls)
            self.httpd.handshake_errors = self.handshake_errors
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def put(self, name, data):
        self.version += 1
        self.objects["/" + name] = (bytes(data), f'"v{self.version}"')
        return f"{self.scheme}://127.0.0.1:{self.port}/{name}"

    def gets(self):
        return [x for x in self.log if x[0] == "GET"]

    def start(self):
        self.thread.start()
        return self

    def stop(self):
        self.stall.set()
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(10)


class _Server(ThreadingHTTPServer):
    # the listen backlog: socketserver's 5 drops the connections of a client
    # that opens dozens at once, and each dropped SYN is resent a second later
    request_queue_size = 128


class _TLSServer(_Server):
    """HTTPS: each connection's handshake runs on its own thread (a client
    that never finishes one holds up no other); a refused handshake (the
    client did not trust the certificate) is recorded, not printed."""

    def finish_request(self, request, client_address):
        try:
            conn = self.tls.wrap_socket(request, server_side=True)
        except (ssl.SSLError, OSError) as e:
            self.handshake_errors.append(str(e))
            return
        try:
            super().finish_request(conn, client_address)
        finally:
            conn.close()


def ferry_reads_urls():
    """False for a ferry built without libcurl (it refuses URLs, saying so)."""
    import ferry
    old = os.environ.get("FERRY_REMOTE_RETRIES")
    os.environ["FERRY_REMOTE_RETRIES"] = "0"
    try:
        ferry.read("http://127.0.0.1:9/x.npy", device="cpu")   # nothing listens on port 9
    except ferry.FerryError as e:
        return "needs libcurl" not in str(e)
    finally:
        if old is None:
            del os.environ["FERRY_REMOTE_RETRIES"]
        else:
            os.environ["FERRY_REMOTE_RETRIES"] = old
    return True
