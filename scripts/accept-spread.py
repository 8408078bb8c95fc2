#!/usr/bin/env python3
"""How evenly SO_REUSEPORT spreads connections over N listeners, the accept model
`operations::workers` did not take (docs/performance.md, "Accept models").

With SO_REUSEPORT each worker would own a listener on the same port and the kernel would
pick one per connection by a hash of the client's address and port; the proxy's acceptor
instead gives each connection to the worker running the fewest sessions, which is even by
construction (busiest / mean = 1.00 for any count divisible by N). This opens N
SO_REUSEPORT listeners on a free loopback port, connects C clients from ephemeral ports
(as redis-benchmark -c C does), counts what each listener accepted, and repeats T times.

    scripts/accept-spread.py [N ...] [--clients 100] [--trials 200]

Prints, per N: the mean and the 95th percentile over the trials of the busiest listener's
connections over the mean (1.00 = even).
"""

import argparse
import selectors
import socket
import statistics


def one_trial(listeners: int, clients: int) -> float:
    socks = []
    first = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    first.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    first.bind(("127.0.0.1", 0))
    port = first.getsockname()[1]
    socks.append(first)
    for _ in range(listeners - 1):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        s.bind(("127.0.0.1", port))
        socks.append(s)
    for s in socks:
        s.listen(clients)
        s.setblocking(False)
    conns = [socket.create_connection(("127.0.0.1", port)) for _ in range(clients)]
    counts = [0] * listeners
    accepted = []
    sel = selectors.DefaultSelector()
    for i, s in enumerate(socks):
        sel.register(s, selectors.EVENT_READ, i)
    while sum(counts) < clients:
        for key, _ in sel.select(timeout=5):
            try:
                conn, _ = key.fileobj.accept()
            except BlockingIOError:
                continue
            accepted.append(conn)
            counts[key.data] += 1
    for c in conns + accepted + socks:
        c.close()
    return max(counts) / (clients / listeners)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("listeners", nargs="*", type=int, default=[2, 4, 8])
    parser.add_argument("--clients", type=int, default=100)
    parser.add_argument("--trials", type=int, default=200)
    args = parser.parse_args()
    print(f"SO_REUSEPORT, {args.clients} connections, {args.trials} trials")
    print("| listeners | busiest / mean, mean | 95th percentile | least-loaded acceptor |")
    print("|---:|---:|---:|---:|")
    for n in args.listeners:
        ratios = sorted(one_trial(n, args.clients) for _ in range(args.trials))
        p95 = ratios[int(0.95 * (len(ratios) - 1))]
        even = -(-args.clients // n) / (args.clients / n)
        print(f"| {n} | {statistics.mean(ratios):.2f} | {p95:.2f} | {even:.2f} |")


if __name__ == "__main__":
    main()
