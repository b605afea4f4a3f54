"""The floor of a remote call on this machine: a uvloop + msgspec length-prefixed echo server.

Run as a script, it serves on a free loopback port and prints the port. Every frame is
`u32 length | msgpack body`; the body is decoded and encoded again before it goes back, so the
baseline pays for framing and (de)serialization like a real protocol, and nothing else.
A second port echoes raw payloads (`u64 length | bytes`) with `recv_into` and `sendall`: the
floor for moving large arrays through a socket.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import sys
import threading

import msgspec
import uvloop

HEADER = struct.Struct("<I")
encoder = msgspec.msgpack.Encoder()
decoder = msgspec.msgpack.Decoder()


class Echo(asyncio.Protocol):
    def connection_made(self, transport):
        self.transport = transport
        self.buffer = bytearray()

    def data_received(self, data):
        buf = self.buffer
        buf += data
        out = []
        pos = 0
        while len(buf) - pos >= 4:
            (n,) = HEADER.unpack_from(buf, pos)
            if len(buf) - pos - 4 < n:
                break
            body = decoder.decode(memoryview(buf)[pos + 4 : pos + 4 + n])
            reply = encoder.encode(body)
            out.append(HEADER.pack(len(reply)) + reply)
            pos += 4 + n
        del buf[:pos]
        if out:
            self.transport.writelines(out)


def serve_raw(sock: socket.socket) -> None:
    while True:
        conn, _ = sock.accept()
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        threading.Thread(target=echo_raw, args=(conn,), daemon=True).start()


def recv_exact(conn: socket.socket, view: memoryview) -> bool:
    while len(view):
        n = conn.recv_into(view)
        if n == 0:
            return False
        view = view[n:]
    return True


def echo_raw(conn: socket.socket) -> None:
    with conn:
        while True:
            head = bytearray(8)
            if not recv_exact(conn, memoryview(head)):
                return
            (n,) = struct.unpack("<Q", head)
            data = bytearray(n)
            if not recv_exact(conn, memoryview(data)):
                return
            conn.sendall(head)
            conn.sendall(data)


async def main():
    loop = asyncio.get_running_loop()
    server = await loop.create_server(Echo, "127.0.0.1", 0)
    raw = socket.create_server(("127.0.0.1", 0))
    threading.Thread(target=serve_raw, args=(raw,), daemon=True).start()
    print(server.sockets[0].getsockname()[1], raw.getsockname()[1], flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    try:
        uvloop.run(main())
    except KeyboardInterrupt:
        sys.exit(0)
