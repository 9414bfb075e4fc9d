#!/usr/bin/env python3
"""Open N connections to a proxy, CONNECT host:port, finish the TLS handshake with the proxy's
leaf certificate, and hold them idle. Writes "opened=N failed=M" to --ready when done, then sleeps."""
import argparse, asyncio, ssl, resource, sys, time

ap = argparse.ArgumentParser()
ap.add_argument("--port", type=int, required=True)
ap.add_argument("--host", required=True)
ap.add_argument("--target-port", type=int, required=True)
ap.add_argument("--cafile", required=True)
ap.add_argument("-n", type=int, default=10000)
ap.add_argument("--parallel", type=int, default=64)
ap.add_argument("--ready", required=True)
a = ap.parse_args()

soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))

ctx = ssl.create_default_context(cafile=a.cafile)
held, errors = [], {}

async def one(sem):
    async with sem:
        try:
            r, w = await asyncio.open_connection("127.0.0.1", a.port)
            w.write(f"CONNECT {a.host}:{a.target_port} HTTP/1.1\r\nHost: {a.host}:{a.target_port}\r\n\r\n".encode())
            line = await r.readuntil(b"\r\n\r\n")
            if b" 200" not in line.split(b"\r\n")[0]:
                raise RuntimeError(line.split(b"\r\n")[0].decode())
            await w.start_tls(ctx, server_hostname=a.host)
            held.append(w)
        except Exception as e:  # noqa: BLE001
            k = f"{type(e).__name__}: {e}"[:120]
            errors[k] = errors.get(k, 0) + 1

async def main():
    sem = asyncio.Semaphore(a.parallel)
    t0 = time.time()
    await asyncio.gather(*(one(sem) for _ in range(a.n)))
    msg = f"opened={len(held)} failed={a.n - len(held)} secs={time.time() - t0:.1f} nofile={hard} errors={errors}"
    print(msg, file=sys.stderr)
    open(a.ready, "w").write(msg)
    await asyncio.sleep(3600)

asyncio.run(main())
