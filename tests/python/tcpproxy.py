"""A TCP proxy on loopback for the remote-object tests: it adds a fixed delay
to each direction (test_remote_latency.py: round trips without root or tc
netem) or terminates TLS in front of a plain server (test_remote_tls.py:
HTTPS to moto's S3)."""
import asyncio
import threading


class TCPProxy:
    """Forwards 127.0.0.1:port to 127.0.0.1:upstream, each chunk of data
    delivered `delay` seconds after it arrived, in order, each way; with
    `tls` (an ssl.SSLContext for servers) it takes TLS in front of a plain
    upstream. One asyncio loop on its own thread; `connections` counts the
    connections accepted."""

    def __init__(self, upstream, delay=0.0, tls=None):
        self.upstream, self.delay = upstream, delay
        self.connections = 0
        self.writers = set()
        self.loop = asyncio.new_event_loop()
        ready = threading.Event()

        async def start():
            self.server = await asyncio.start_server(self._client, "127.0.0.1", 0, ssl=tls)
            self.port = self.server.sockets[0].getsockname()[1]
            ready.set()

        self.thread = threading.Thread(target=lambda: (self.loop.run_until_complete(start()), self.loop.run_forever()),
                                       daemon=True)
        self.thread.start()
        if not ready.wait(10):
            raise RuntimeError("the delaying proxy did not start")

    async def _pipe(self, src, dst):
        """src -> dst, each chunk held until delay after its arrival."""
        q = asyncio.Queue()

        async def feed():
            while True:
                try:
                    data = await src.read(1 << 16)
                except OSError:
                    data = b""
                q.put_nowait((self.loop.time() + self.delay, data))
                if not data:
                    return

        async def deliver():
            while True:
                due, data = await q.get()
                wait = due - self.loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                try:
                    if not data:
                        dst.close()
                        return
                    dst.write(data)
                    await dst.drain()
                except OSError:
                    return

        await asyncio.gather(feed(), deliver())

    async def _client(self, reader, writer):
        self.connections += 1
        self.writers.add(writer)
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream)
        except OSError:
            writer.close()
            return
        self.writers.add(up_writer)
        await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))

    def stop(self):
        """Close every connection (its pipes see the end and finish), then the loop."""
        async def close():
            self.server.close()
            for w in self.writers:
                w.transport.abort()
            pending = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            if pending:
                await asyncio.wait(pending, timeout=5)
        asyncio.run_coroutine_threadsafe(close(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()
