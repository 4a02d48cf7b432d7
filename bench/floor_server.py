"""The floor an audited call is measured against: the least an asyncio + apsw.aio + msgspec
Unix-socket server can do per call — decode a frame, one durable audit insert and one
indexed read in one worker hop, encode a reply. The same framing as qledge's tool socket
(4-byte length, msgpack). `python floor_server.py SOCKET plain|audit`; prints `ready`.
"""

import asyncio
import sys

import apsw
import apsw.aio
import msgspec

path, audit = sys.argv[1], sys.argv[2] == "audit"
enc, dec = msgspec.msgpack.Encoder(), msgspec.msgpack.Decoder()


async def main() -> None:
    apsw.async_controller.set(apsw.aio.AsyncIO)
    db = await apsw.Connection.as_async(path + ".db")

    def setup(c):
        c.pragma("journal_mode", "wal")
        c.pragma("synchronous", "NORMAL")
        c.execute("create table if not exists t(id text primary key, v text)")
        c.execute("create table if not exists a(id integer primary key, at integer, tool text, who text, reasons text)")
        c.execute("insert or replace into t values('x','hello')")

    await db.async_run(setup, db)

    def call(c, key):
        if audit:
            with c:
                c.execute("insert into a(at, tool, who, reasons) values(1, 'get', 'uid:0', '[\"allowed\"]')")
        return c.execute("select v from t where id=?", (key,)).fetchall()

    async def handle(r, w):
        try:
            while True:
                n = int.from_bytes(await r.readexactly(4), "big")
                req = dec.decode(await r.readexactly(n))
                rows = await db.async_run(call, db, req["args"]["id"])
                out = enc.encode({"id": req["id"], "ok": True, "result": {"v": rows[0][0]}})
                w.write(len(out).to_bytes(4, "big") + out)
                await w.drain()
        except asyncio.IncompleteReadError:
            w.close()

    srv = await asyncio.start_unix_server(handle, path)
    print("ready", flush=True)
    await srv.serve_forever()


asyncio.run(main())
