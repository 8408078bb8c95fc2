"""redis-py through a proxy whose Redis is down (tests/production.rs starts it): how the
client classifies the proxy's reply. Prints one JSON line: the exception's type, whether it
is a ConnectionError (what redis-py's Retry and applications treat as an outage), and how
many attempts a client configured to retry ConnectionError made."""

import json
import sys

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry


RETRIES = []


class Counting(NoBackoff):
    """No wait between attempts; counts the retries (in a global: redis-py copies its Retry
    into each connection)."""

    def compute(self, failures):
        RETRIES.append(failures)
        return 0


host, port = sys.argv[1], int(sys.argv[2])
client = redis.Redis(
    host=host,
    port=port,
    socket_timeout=10,
    retry=Retry(Counting(), 2),
    retry_on_error=[redis.exceptions.ConnectionError],
    # No CLIENT SETINFO at connect: before Redis 7.2 the proxy forwards it, and redis-py's
    # connect (outside its retry) would fail on the same error first.
    lib_name=None,
    lib_version=None,
)
outcome = {}
try:
    client.get("k")
    outcome["error"] = None
except redis.exceptions.RedisError as e:
    outcome["error"] = type(e).__name__
    outcome["connection_error"] = isinstance(e, redis.exceptions.ConnectionError)
outcome["retries"] = len(RETRIES)
print(json.dumps(outcome))
