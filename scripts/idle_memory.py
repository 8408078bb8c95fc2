#!/usr/bin/env python3
"""Memory per idle client connection of a running proxy (or any server).

usage: scripts/idle_memory.py PID PORT N [ping|now]
Opens N connections to 127.0.0.1:PORT (optionally sending one PING on each) and prints the
growth of PID's RSS per connection. Run it twice: the first run also pays for heap growth.
`ping` measures once the sessions have had their idle release (5 s later); `now` measures
right after the last PONG, while every session still holds what its command used.
"""
import socket, sys, time, resource
pid=sys.argv[1]; port=int(sys.argv[2]); N=int(sys.argv[3])
def rss():
    for l in open(f"/proc/{pid}/status"):
        if l.startswith("VmRSS"): return int(l.split()[1])
resource.setrlimit(resource.RLIMIT_NOFILE,(20000,20000))
s0=socket.create_connection(("127.0.0.1",port)); s0.sendall(b"PING\r\n"); s0.recv(100)
base=rss()
socks=[]
for i in range(N):
    s=socket.create_connection(("127.0.0.1",port)); socks.append(s)
if len(sys.argv)>4:
  for s in socks: s.sendall(b"PING\r\n")
  for s in socks: s.recv(100)

# A session gives its read buffer and reply channel back after one to two idle ticks of 2 s
# (src/session/mod.rs, IDLE_TICK): measure once they have.
mode=sys.argv[4] if len(sys.argv)>4 else ""
time.sleep({"ping":5,"now":0.05}.get(mode,0.5))
after=rss()
print(f"{N} idle clients: {(after-base)*1024/N:.0f} bytes per client (RSS {base} -> {after} KiB)")
